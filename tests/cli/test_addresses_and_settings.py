"""HOST:PORT has one parser (tpuwatch.address) and every TPUWATCH_* variable one definition
(tpuwatch.settings): what each accepts, and that no module reads a variable settings does not know."""

from __future__ import annotations

import re

import pytest

from tpuwatch import address, settings
from tpuwatch_testing import ROOT


@pytest.mark.parametrize("value, expected", [
    ("127.0.0.1:7711", ("127.0.0.1", 7711)),
    (" host-3:1 ", ("host-3", 1)),
    ("[::1]:65535", ("::1", 65535)),
])
def test_an_address_to_connect_to(value, expected):
    assert address.parse(value) == expected


@pytest.mark.parametrize("value", ["7711", ":7711", "host:", "host:port", "host:0", "host:65536", ""])
def test_a_bad_address_to_connect_to_says_what_is_expected(value):
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        address.parse(value)


def test_a_listen_address_may_leave_out_the_host_and_ask_for_any_port():
    assert address.parse_listen("") is None
    assert address.parse_listen(":0") == ("127.0.0.1", 0)
    assert address.parse_listen("[::1]:7711") == ("::1", 7711)
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        address.parse_listen("garbage")
    with pytest.raises(ValueError, match=r"port 99999 is out of range \(0-65535\)"):
        address.parse_listen("127.0.0.1:99999")


def test_looks_like_tells_an_address_from_a_run_id():
    assert address.looks_like("tpu-vm-3:7711")
    assert not address.looks_like("20261123-061500-train") and not address.looks_like("runs/abc")


def test_a_positive_float_setting_falls_back_to_its_default():
    grace = settings.STOP_GRACE_S
    assert grace.positive_float({}) == 15.0
    assert grace.positive_float({grace.name: "2.5"}) == 2.5
    assert grace.positive_float({grace.name: "0"}) == 15.0
    assert grace.positive_float({grace.name: "soon"}) == 15.0


def test_every_tpuwatch_variable_read_anywhere_is_defined_in_settings():
    known = {v.name for v in settings.ALL}
    used: dict[str, str] = {}
    for path in (ROOT / "tpuwatch").rglob("*.py"):
        for name in re.findall(r"\bTPUWATCH_[A-Z_]+\b", path.read_text()):
            used.setdefault(name, str(path.relative_to(ROOT)))
    assert used, "the scan found nothing: is ROOT right?"
    assert not {n: p for n, p in used.items() if n not in known}
    assert all(v.name.startswith(settings.PREFIX) and v.doc for v in settings.ALL)
