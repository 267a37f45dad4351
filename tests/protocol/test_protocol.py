"""The wire format: pinned by a golden file, and tolerant of anything else."""

from __future__ import annotations

import math

import pytest
from make_golden import GOLDEN, MESSAGES

from tpuwatch import protocol as p


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_every_kind_is_in_the_golden_file():
    assert {type(m) for m in MESSAGES} == set(p.MESSAGE_TYPES)


def test_encoding_matches_the_golden_file_byte_for_byte():
    assert b"".join(p.encode(m) for m in MESSAGES) == GOLDEN.read_bytes(), (
        "the wire format changed: if on purpose, run tests/protocol/make_golden.py and bump PROTOCOL_VERSION "
        "when old readers would break")


def test_golden_lines_decode_to_the_same_messages():
    lines = GOLDEN.read_bytes().splitlines()
    assert len(lines) == len(MESSAGES)
    for line, original in zip(lines, MESSAGES):
        decoded = p.decode(line)
        assert type(decoded) is type(original)
        for f in p.dataclasses.fields(original):
            assert _same(getattr(decoded, f.name), getattr(original, f.name)), f.name


def test_every_line_is_strict_json():
    import json

    for line in GOLDEN.read_bytes().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


@pytest.mark.parametrize("line, why", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"t": 1}', "kind"),
    (b'{"kind": "step", "step": "3", "t": 1, "step_time_s": 0.1, "input_wait_s": null, "loss": null}', "step.step"),
    (b'{"kind": "step", "t": 1}', "missing field"),
    (b'{"kind": "event", "t": 1, "level": "shout", "source": "x", "message": "m"}', "event.level"),
    (b'{"kind": "result", "t": 1, "id": "i", "action": "a", "ok": 1, "message": "m"}', "result.ok"),
    (b'{"kind": "command", "id": "i", "action": "a", "args": {"x": {"nested": 1}}}', "plain value"),
])
def test_malformed_lines_are_counted_not_raised(line, why):
    decoder = p.Decoder()
    assert decoder.decode(line) is None
    assert decoder.malformed == 1 and why in decoder.last_error


def test_unknown_kinds_and_extra_fields_are_tolerated():
    decoder = p.Decoder()
    assert decoder.decode(b'{"kind": "from_the_future", "x": 1}') is None
    assert decoder.unknown == 1 and decoder.malformed == 0
    msg = decoder.decode(b'{"kind": "event", "t": 1, "level": "info", "source": "s", "message": "m", "new": [1]}')
    assert isinstance(msg, p.Event) and msg.message == "m"


def test_oversized_lines_are_rejected():
    decoder = p.Decoder()
    assert decoder.decode(b'{"kind":"event","message":"' + b"x" * p.MAX_LINE_BYTES + b'"}') is None
    assert decoder.malformed == 1 and "exceeds" in decoder.last_error
