"""The report's every output, byte for byte: JSON, text and markdown of the recordings in
tests/data, the recorded retrace storm and a two-worker group, and compare's of two pairs, against files made from the
output before the report's code was reorganised. A refactor leaves them as they are; a change
of output on purpose regenerates them (``python tests/monitor/test_report_golden.py``) and says
why in its commit."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "report_golden"
DATA = HERE.parent / "data"
ROOT = HERE.parents[1]
RECORDINGS = ("crashed", "healthy_4replica", "input_bound", "running_truncated", "waiting")
CASES = (*RECORDINGS, "retrace_storm", "group")


def _make_group(tmp: Path) -> Path:
    spec = importlib.util.spec_from_file_location("_group_views_for_golden",
                                                  HERE.parent / "multihost" / "test_group_views.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_group(tmp)


def _run_dir(case: str, tmp: Path) -> Path:
    if case == "group":
        return _make_group(tmp)
    d = tmp / case
    d.mkdir()
    src = ROOT / "sample_runs" / "recorded" / case / "events.jsonl" if case == "retrace_storm" \
        else DATA / f"{case}.jsonl"
    shutil.copyfile(src, d / "events.jsonl")
    return d


#: Pairs compared (``tpuwatch compare A B``): the second against the first.
PAIRS = (("healthy_4replica", "input_bound"), ("retrace_storm", "crashed"))


def compare_outputs(pair: tuple[str, str], tmp: Path) -> dict[str, str]:
    """What ``compare`` prints for ``pair``, each directory written as ``<A>``, ``<B>``."""
    from tpuwatch.console import compare

    dirs = [_run_dir(case, tmp) for case in pair]
    data = compare.compare([compare.load(label, d) for label, d in zip("AB", dirs)])
    out = {"json": compare.render_json(data) + "\n", "txt": compare.render_text(data),
           "md": compare.render_markdown(data)}
    for label, d in zip("AB", dirs):
        out = {k: v.replace(str(d), f"<{label}>") for k, v in out.items()}
    return out


def outputs(case: str, tmp: Path) -> dict[str, str]:
    """The JSON, text and markdown of ``case``, its directory written as ``<RUN>``."""
    from tpuwatch.console import report

    d = _run_dir(case, tmp)
    data = report.build_model(d)
    assert report.build_report(d) == data.as_json()
    out = {"json": report.render_json(data) + "\n", "txt": report.render_text(data),
           "md": report.render_markdown(data)}
    return {k: v.replace(str(d), "<RUN>") for k, v in out.items()}


@pytest.fixture
def utc():
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.mark.parametrize("case", CASES)
def test_report_output_is_unchanged(case, tmp_path, utc):
    for ext, text in outputs(case, tmp_path).items():
        assert text == (GOLDEN / f"{case}.{ext}").read_text(), f"{case}.{ext} changed"


@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
def test_compare_output_is_unchanged(pair, tmp_path, utc):
    name = "compare-" + "-".join(pair)
    for ext, text in compare_outputs(pair, tmp_path).items():
        assert text == (GOLDEN / f"{name}.{ext}").read_text(), f"{name}.{ext} changed"


if __name__ == "__main__":
    import tempfile

    os.environ["TZ"] = "UTC"
    time.tzset()
    sys.path[:0] = [str(ROOT), str(HERE.parent)]
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            for ext, text in outputs(case, Path(tmp)).items():
                (GOLDEN / f"{case}.{ext}").write_text(text)
                print(f"wrote {case}.{ext}")
    for pair in PAIRS:
        with tempfile.TemporaryDirectory() as tmp:
            for ext, text in compare_outputs(pair, Path(tmp)).items():
                (GOLDEN / f"compare-{'-'.join(pair)}.{ext}").write_text(text)
                print(f"wrote compare-{'-'.join(pair)}.{ext}")
