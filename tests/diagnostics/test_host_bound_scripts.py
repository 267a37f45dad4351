"""``host-bound`` on scripts written as users write them: the finding names the script's lines that
hold the time between steps, and its advice, applied to a copy, cuts that time by half or more.
Real TensorFlow, real subprocesses (``tpuwatch run --headless``, then ``tpuwatch report``)."""

from __future__ import annotations

import pytest
from test_pipeline_doctor import _edited_copy, _line_of, findings

from tpuwatch_testing import SAMPLES, run_and_report

pytestmark = [pytest.mark.tf, pytest.mark.slow]
PLANTED = SAMPLES / "planted"


def host_share(report: dict) -> float:
    """The ledger's host time between steps over the training time (the first step to the last)."""
    lg = report["ledger"]
    b, after = lg["buckets_s"], lg["host_after_last_s"]
    return (b["host"] - after) / (lg["wall_s"] - b["starting"] - b["finishing"] - after)


# the generator's NumPy work as TF ops in a parallel map over the raw arrays (the advice)
_GENERATOR = '''def batches(steps):
    for _ in range(steps):
        picked = rng.integers(0, len(images), BATCH)
        out = np.empty((BATCH, CROP, CROP, 3), np.float32)
        for j, i in enumerate(picked):
            top, left = rng.integers(0, SIZE - CROP + 1, size=2)
            image = images[i, top:top + CROP, left:left + CROP].astype(np.float32) / 255.0
            if rng.random() < 0.5:
                image = image[:, ::-1]
            image = image * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)  # contrast, brightness
            out[j] = (image - MEAN) / STD
        yield out, labels[picked]
'''
_PIPELINE = '''def augment(image, label):
    image = tf.cast(tf.image.random_crop(image, (CROP, CROP, 3)), tf.float32) / 255.0
    image = tf.image.random_flip_left_right(image)
    image = image * tf.random.uniform((), 0.8, 1.2) + tf.random.uniform((), -0.1, 0.1)
    return (image - MEAN) / STD, label


def batches(steps):
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(len(images)).repeat()
    ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(BATCH).take(steps).prefetch(tf.data.AUTOTUNE)
'''


@pytest.mark.alone
def test_a_loop_fed_by_a_numpy_generator_is_named_and_a_tf_data_pipeline_halves_its_host_time(tmp_path):
    script = PLANTED / "host_numpy_batches.py"
    before = run_and_report(tmp_path, script, name="before")
    (f,) = findings(before, "host-bound")
    ev = f["evidence"]
    assert f["severity"] == "warning"
    # the lines are the generator's, the consumer the script's loop
    assert ev["culprit_role"] == "generator" and ev["culprit_function"] == "batches", ev
    name, line = ev["culprit_site"].rsplit(":", 1)
    assert name == script.name and _line_of(script, "def batches(steps):") < int(line) <= \
        _line_of(script, "yield out, labels[picked]"), ev
    assert ev["culprit_caller"] == f"{script.name}:{_line_of(script, 'in enumerate(batches(args.steps)')}"
    assert "tf.data" in f["advice"] and "num_parallel_calls=tf.data.AUTOTUNE" in f["advice"]
    assert "from_generator alone is not enough" in f["advice"]
    # the finding's share is the ledger's, as every view shows it
    assert ev["host_between_steps_pct"] == round(100 * host_share(before))
    # the advice applied to a copy: the same batches built by tf.data
    fixed = _edited_copy(tmp_path, script, [(_GENERATOR, _PIPELINE)])
    after = run_and_report(tmp_path, fixed, name="after")
    assert after["summary"]["steps"] == before["summary"]["steps"] == 800
    print(f"host between steps {host_share(before):.0%} -> {host_share(after):.0%} of the training time")
    assert host_share(after) <= host_share(before) / 2, (host_share(before), host_share(after))
    assert [g for g in findings(after, "host-bound") if g["evidence"]["culprit_role"] == "generator"] == []


_EVERY_BATCH = '''    def on_train_batch_end(self, batch, logs=None):
'''
_EVERY_100 = '''    def on_train_batch_end(self, batch, logs=None):
        if batch % 100:
            return
'''


@pytest.mark.alone
def test_a_callback_reading_the_weights_every_batch_is_named_and_every_100_batches_halves_its_host_time(tmp_path):
    script = PLANTED / "host_slow_callback.py"
    before = run_and_report(tmp_path, script, name="before")
    (f,) = findings(before, "host-bound")
    ev = f["evidence"]
    assert ev["culprit_role"] == "callback" and ev["culprit_function"] == "WeightDrift.on_train_batch_end", ev
    lines = {f"{script.name}:{_line_of(script, text)}" for text in
             ("weights = self.model.get_weights()", "self.drift.append(")}
    assert ev["culprit_site"] in lines, ev
    assert "WeightDrift.on_train_batch_end" in f["message"] and "`if batch % 100: return`" in f["advice"]
    fixed = _edited_copy(tmp_path, script, [(_EVERY_BATCH, _EVERY_100)])
    after = run_and_report(tmp_path, fixed, name="after")
    assert after["summary"]["steps"] == before["summary"]["steps"] == 300
    print(f"host between steps {host_share(before):.0%} -> {host_share(after):.0%} of the training time")
    assert host_share(after) <= host_share(before) / 2, (host_share(before), host_share(after))
    assert findings(after, "host-bound") == []
