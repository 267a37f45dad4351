"""The profile summary and the live measurement agree on what is input-bound: xprof
counts only the compiled step's own infeed wait, tpuwatch every fetch, eager ones included."""

from tpuwatch.monitor.diagnostics import Thresholds
from tpuwatch.monitor.diagnostics.input_share import InputTotals
from tpuwatch.monitor.profile_summary import ProfileSummary, render_text


def _summary(input_percent: float, verdict: str) -> ProfileSummary:
    return ProfileSummary(path="/p", logdir="/l", hardware="CPU", steps=(), step_avg_ms=33.0, step_min_ms=30.0,
                          step_max_ms=36.0, average_ms=(), input_percent=input_percent, input_verdict=verdict,
                          input_conclusion="", bottleneck="", top_ops=(), open_commands=("tensorboard --logdir /l",))


def _live(wait_s: float, step_s: float, n: int = 60):
    tot = InputTotals()
    for i in range(n):
        tot.add(i, step_s, wait_s, 1)
    return tot.share(Thresholds())


def test_eager_fetch_wait_outside_the_compiled_step_is_not_called_not_input_bound():
    text = render_text(_summary(0.0, "not"), live=_live(0.020, 0.033))
    assert "input inside the compiled step (this profile): not input-bound (0% of the step waiting for input)" in text
    assert "input measured live, every fetch incl. eager ones between steps: HIGHLY input-bound (61%" in text
    assert "verdict: input-bound - the wait happens outside the compiled step" in text


def test_when_both_agree_there_is_no_extra_verdict():
    text = render_text(_summary(2.0, "not"), live=_live(0.001, 0.033))
    assert "not input-bound (3.0%" in text and "verdict:" not in text


def test_without_a_live_measurement_the_profile_speaks_alone():
    assert "  input: not input-bound (0% of the step waiting for input)" in render_text(_summary(0.0, "not"))


def test_each_open_command_names_the_extra_that_installs_its_tool():
    """The commands named `tensorboard` and `xprof`, which `pip install -e '.[tf]'`
    does not install. Each line now ends in a shell comment naming the extras, which exist."""
    import re
    from pathlib import Path

    from tpuwatch.monitor.profile_summary import open_commands

    # pyproject's [project.optional-dependencies] (no tomllib on Python 3.10): name = ["dep", ...]
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = {m[1]: re.findall(r'"([^"]+)"', m[2]) for m in re.finditer(r"^(\w+) = \[(.*?)\]", section, re.M | re.S)}
    providers = {"xprof": {"profile"}, "tensorboard": {"tensorboard"}}  # the pip package each tool is in
    for line in open_commands("/tmp/logs dir"):
        tool = line.split()[0]
        command, _, comment = line.partition("  # ")
        assert comment.startswith("pip install 'tpuwatch[") and comment.endswith("]'"), line
        named = set(comment[len("pip install 'tpuwatch["):-2].split(","))
        assert named <= set(extras), line
        assert any(tool in dep or "xprof" in dep for e in named for dep in extras[e]), line
        assert providers[tool] <= named, line
        assert "'/tmp/logs dir'" in command
