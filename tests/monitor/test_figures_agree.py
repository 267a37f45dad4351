"""One recording, every view: the header, the panels, the headless lines, the report
and compare show the same examples/s, input wait, loss and retrace figures."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from monitor_recordings import mr, write_run

from tpuwatch.console import compare, report
from tpuwatch.console.headless import progress_line, summary
from tpuwatch.monitor.monitor import Monitor
from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import Config, Epoch, Exit, Message, Retrace
from tpuwatch.ui.widgets.input_panel import input_text
from tpuwatch.ui.widgets.replica_loss_panel import replica_loss_text
from tpuwatch.ui.widgets.run_header import header_text

N = 400
BATCH = 64


def _recording() -> list[Message]:
    """A Keras 3.5 fit on 4 replicas: paced records past 256 without examples, an input wait of
    30%, the train function traced once and Keras' test function once, epoch-end logs."""
    hello = replace(mr.hello(mr.T0), keras_version="3.5.0")
    msgs: list[Message] = [hello, mr.topology(mr.T0), Config(t=mr.T0, global_batch_size=BATCH, keras_version="3.5.0"),
                           Retrace(t=mr.T0 + 0.5, function="multi_step_on_iterator", traces=1, instances=1,
                                   signature="iterator", change="", step=0)]
    for m in mr.steps(N, t0=mr.T0 + 1, input_wait_frac=0.3, examples=BATCH, epoch_len=200, epochs=2):
        if m.step > 256 and m.step % 2:
            m = replace(m, examples=None)
        msgs.append(m)
        if m.step % 200 == 0:
            epoch = m.step // 200 - 1
            if epoch == 0:
                msgs.append(Retrace(t=m.t + 0.01, function="multi_step_on_iterator", traces=1, instances=1,
                                    signature="iterator", change="", step=m.step, evaluation=True))
            msgs.append(Epoch(t=m.t + 0.02, epoch=epoch, phase="end", step=m.step,
                              logs={"loss": 0.75832, "val_loss": 0.8}))
    msgs.append(Exit(t=msgs[-1].t + 0.3, exit_code=0))  # type: ignore[attr-defined]
    return msgs


def _state(messages: list[Message]) -> RunState:
    monitor = Monitor(lambda: monitor.state.last_message_t or 0.0)
    for m in messages:
        monitor.take(m)
    monitor.evaluate(monitor.state.last_message_t or 0.0, force=True)
    return monitor.state


def test_every_view_of_one_recording_agrees(tmp_path):
    messages = _recording()
    run_dir = write_run(tmp_path / "run", messages)

    # live, just before the exit: the header and the headless line
    live = _state(messages[:-1])
    snap = live.snapshot(live.last_message_t)
    assert snap.status == "running"
    header = header_text(snap, 200).plain
    ex_s = float(re.search(r"([\d.]+k?) ex/s", header).group(1).replace("k", "e3"))
    assert ex_s == pytest.approx(BATCH * snap.steps_per_s, rel=0.01)  # paced records not zero

    # ended: every other view
    state = _state(messages)
    end = state.snapshot(state.last_message_t)
    pct = round(100 * end.input_wait_frac)
    assert pct == 30 and end.input_scope == "over the whole run"
    line, text = progress_line(end), summary(end)
    panel_in = input_text(end).plain
    panel_loss = replica_loss_text(end, 10).plain
    model = report.build_model(run_dir)
    data = model.as_json()
    rep = report.render_text(model)
    cmp = compare.compare([compare.load("A", run_dir), compare.load("B", run_dir)])

    # input wait: one figure
    (finding,) = [f for f in end.findings if f.rule == "input-bound"]
    assert finding.evidence["input_wait_pct"] == pct
    assert f"input {pct}%" in line and f"{pct}% of step time waiting for input" in text
    assert f"wait {pct}%" in panel_in
    assert re.search(rf"input wait +{pct}% of step time", rep)
    assert round(100 * cmp["runs"][0]["figures"]["input_wait_share"]) == pct

    # examples/s: the global batch at every step, in the report and compare too
    s = data["summary"]
    assert s["examples_per_s"] == pytest.approx(BATCH * s["steps_per_s"], rel=0.01)
    assert cmp["runs"][0]["figures"]["examples_per_s"] == s["examples_per_s"]

    # loss: tpuwatch's (last step) and Keras' epoch mean, with Keras 3.5's replica-0 note
    loss = f"{end.loss:.4g}"
    assert re.search(rf"\n  loss +{loss} \(last step, the mean over replicas\)", rep)
    assert "(last step)" in line and "last step" in panel_loss and "(last step)" in text
    note = "Keras epoch 2 mean 0.7583 (Keras 3.5.0 logs replica 0's loss)"
    assert note in line and note in panel_loss and note in text
    assert re.search(r"Keras loss +epoch 2 mean 0.7583 \(Keras 3.5.0 logs replica 0's loss\)", rep)
    assert s["last_loss"] == end.loss == cmp["runs"][0]["figures"]["last_loss"]

    # retraces: Keras' test function is evaluation, not a retrace of training
    assert "retraces 0" in line
    assert "multi_step_on_iterator (evaluation): 1 trace(s), 1 object(s)" in rep
    assert "multi_step_on_iterator: 1 trace(s), 1 object(s)" in rep
    # JSON names the function by its own name; the flag says which one is evaluation's
    assert sorted((r["name"], r["evaluation"]) for r in s["retraces"]) == [
        ("multi_step_on_iterator", False), ("multi_step_on_iterator", True)], s["retraces"]
    assert not [f for f in end.findings if f.rule in ("retrace-storm", "function-recreated")]
    json.dumps(cmp)  # compare's data is plain
