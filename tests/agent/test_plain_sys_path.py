"""The agent's sys.path is plain python's: the launcher's PYTHONPATH entry for
tpuwatch goes, except that a pip install's site-packages (where TensorFlow is) stays where site
puts it (in-process, no TensorFlow needed)."""

from __future__ import annotations

from tpuwatch.agent.__main__ import without_launcher_entry

STD = ["/py/lib/python311.zip", "/py/lib/python3.11", "/py/lib/python3.11/lib-dynload"]


def test_a_source_checkout_entry_is_removed():
    path = ["/s", "/src/tpuwatch-checkout", *STD, "/venv/site-packages"]
    got = without_launcher_entry(path, "/src/tpuwatch-checkout", "", site_dirs=["/venv/site-packages"],
                                 stdlib_dirs=["/py/lib/python3.11"])
    assert got == ["/s", *STD, "/venv/site-packages"]


def test_a_pip_installs_site_packages_moves_after_the_standard_library():
    # site did not add it again (already on sys.path from PYTHONPATH): removing it would lose TF
    path = ["/s", "/venv/site-packages", *STD, "__editable__.finder"]
    got = without_launcher_entry(path, "/venv/site-packages", "", site_dirs=["/venv/site-packages"],
                                 stdlib_dirs=["/py/lib/python3.11"])
    assert got == ["/s", *STD, "/venv/site-packages", "__editable__.finder"]


def test_an_entry_the_user_also_put_on_pythonpath_stays():
    path = ["/s", "/src/x", *STD]
    assert without_launcher_entry(path, "/src/x", "/src/x:/other", site_dirs=[], stdlib_dirs=[]) == path
