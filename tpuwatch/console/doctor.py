"""``tpuwatch doctor``: what works in the environment you are about to train in, one line each.

TensorFlow is never imported here (the viewer side stays TF-free): one subprocess of the
training interpreter imports it and answers in one JSON line: the TF version, what
``TPUClusterResolver()`` says, the physical devices, and whether TPU runtime metrics can be
read (``tpuwatch.agent.tpu_metrics.read_once``, run *in that interpreter*, because that is where
the agent will need tpu-info). That subprocess costs a few seconds (TF's import). GCS and the
run directory are checked in this process.

Exit status 0 when every required check passes (TensorFlow importable, run directory writable,
the ``--gcs`` destination reachable and writable when given); 1 otherwise. No TPU, or TPU
metrics not being served yet, is information, not a failure: training on CPU/GPU is fine, and
libtpu serves its metrics only while a program uses the TPU.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from tpuwatch import rundir

Status = Literal["ok", "fail", "info"]

SYMBOLS = {"ok": "✓", "fail": "✗", "info": "–"}
ASCII_SYMBOLS = {"ok": "ok", "fail": "XX", "info": "--"}
_MARK = "TPUWATCH-DOCTOR "
TF_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    required: bool = False

    @property
    def failed(self) -> bool:
        return self.required and self.status == "fail"


# What the training interpreter runs. Prints one marked JSON line last; never raises.
_PROBE = r'''
import json, sys, time
res = {"python": sys.version.split()[0], "executable": sys.executable}
def first(e):
    text = str(e).strip()
    return (text.splitlines()[0] if text else "")[:200]
try:
    from tpuwatch.agent import tpu_metrics
    r = tpu_metrics.read_once(timeout_s=0.5)
    res["tpu_metrics"] = {"ok": r.ok, "reason": r.reason, "chip": r.chip, "chips": r.chips,
                          "port": r.port, "devices": len(r.usage)}
except Exception as e:
    res["tpu_metrics_error"] = f"{type(e).__name__}: {first(e)}"
try:
    import importlib.metadata as md
    from packaging.requirements import Requirement
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly"):
        try:
            reqs = md.requires(dist) or []
        except md.PackageNotFoundError:
            continue
        for text in reqs:
            req = Requirement(text)
            if req.name == "protobuf" and (req.marker is None or req.marker.evaluate({"extra": ""})):
                installed = md.version("protobuf")
                res["protobuf"] = {"dist": dist, "installed": installed, "wanted": str(req.specifier),
                                   "ok": req.specifier.contains(installed, prereleases=True)}
        break
except Exception as e:
    res["protobuf_error"] = f"{type(e).__name__}: {first(e)}"
t0 = time.perf_counter()
try:
    import tensorflow as tf
except BaseException as e:
    res["tf_error"] = f"{type(e).__name__}: {first(e)}"
else:
    res["tf_version"] = tf.__version__
    res["tf_import_s"] = round(time.perf_counter() - t0, 2)
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        res["tpu"] = {"found": True, "detail": str(resolver.master() or resolver.get_master())}
    except ValueError as e:
        res["tpu"] = {"found": False, "detail": first(e)}
    except Exception as e:
        res["tpu"] = {"found": False, "detail": f"{type(e).__name__}: {first(e)}"}
    try:
        res["devices"] = [d.device_type for d in tf.config.list_physical_devices()]
    except Exception as e:
        res["devices_error"] = f"{type(e).__name__}: {first(e)}"
print("''' + _MARK + r'''" + json.dumps(res), flush=True)
'''


def _package_root() -> str:
    import tpuwatch

    return str(Path(tpuwatch.__file__).resolve().parent.parent)


def probe_interpreter(python: str, timeout_s: float = TF_TIMEOUT_S) -> tuple[dict | None, str]:
    """Runs the probe in ``python``: (its answer, "") or (None, one-line reason)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=timeout_s)
    except FileNotFoundError:
        return None, f"interpreter {python} not found"
    except PermissionError:
        return None, f"interpreter {python} is not executable"
    except subprocess.TimeoutExpired:
        return None, f"{python} did not answer within {timeout_s:.0f} s (importing TensorFlow hung?)"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):]), ""
    tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1][:200]
    return None, f"{python} could not run the check: {tail}"


def interpreter_checks(python: str) -> list[Check]:
    res, why = probe_interpreter(python)
    if res is None:
        return [Check("interpreter", "fail", why, required=True)]
    out = [Check("interpreter", "ok", f"{res['executable']} (Python {res['python']})", required=True)]
    if "tf_error" in res:
        out.append(Check("TensorFlow", "fail", f"cannot import tensorflow: {res['tf_error']}", required=True))
    else:
        out.append(Check("TensorFlow", "ok", f"{res['tf_version']} (import took {res['tf_import_s']:.1f} s)",
                         required=True))
    pb = res.get("protobuf")
    if pb is not None:
        if pb["ok"]:
            out.append(Check("protobuf", "ok", f"{pb['installed']} (what {pb['dist']} wants: {pb['wanted']})"))
        else:
            out.append(Check("protobuf", "fail", f"{pb['installed']} does not satisfy {pb['dist']}'s "
                                                 f"protobuf{pb['wanted']} (importing TensorFlow breaks); "
                                                 f"pip install 'protobuf{pb['wanted']}'", required=True))
    metrics = res.get("tpu_metrics") or {}
    chips = int(metrics.get("chips") or 0)
    tpu = res.get("tpu")
    if tpu is not None:
        if tpu["found"]:
            out.append(Check("TPU", "ok", f"TPUClusterResolver found {tpu['detail'] or 'a TPU'}"))
        elif chips:
            out.append(Check("TPU", "ok", f"{chips} x {metrics.get('chip')} on this host (TPUClusterResolver() "
                                          f"says {tpu['detail']!r}: use TPUClusterResolver(tpu='local'))"))
        else:
            out.append(Check("TPU", "info", f"no TPU: TPUClusterResolver() says {tpu['detail']!r}"))
    if "devices" in res:
        counts: dict[str, int] = {}
        for kind in res["devices"]:
            counts[kind] = counts.get(kind, 0) + 1
        out.append(Check("devices", "ok", ", ".join(f"{k} x{n}" for k, n in counts.items()) or "none"))
    elif "devices_error" in res:
        out.append(Check("devices", "fail", f"cannot list devices: {res['devices_error']}"))
    out.append(_metrics_check(res))
    return out


def _metrics_check(res: dict) -> Check:
    if "tpu_metrics_error" in res:
        return Check("TPU metrics", "fail", f"check failed: {res['tpu_metrics_error']}")
    m = res.get("tpu_metrics") or {}
    if m.get("ok"):
        return Check("TPU metrics", "ok", f"{m['chips']} x {m['chip']}: libtpu answers on port {m['port']} "
                                          f"({m['devices']} devices)")
    reason = m.get("reason", "")
    if not m.get("chips"):
        # Without tpu-info the chips cannot be counted: a failure only where TF sees a TPU.
        tpu_seen = bool((res.get("tpu") or {}).get("found"))
        status: Status = "fail" if "not installed" in reason and tpu_seen else "info"
        return Check("TPU metrics", status, reason)
    if "unreachable" in reason:
        # Expected before training: libtpu serves metrics while a program holds the TPU.
        return Check("TPU metrics", "info", f"{m['chips']} x {m['chip']}; {reason} (libtpu serves it "
                                            "only while a TPU program runs: expected before training)")
    return Check("TPU metrics", "fail", f"{m['chips']} x {m['chip']}; {reason}")


def rundir_check() -> Check:
    root = rundir.runs_root()
    try:
        rundir.check_home()
    except rundir.RunDirError as e:
        if e.errno == errno.EPERM:  # another user could take over runs recorded there
            return Check("run directory", "fail", str(e.strerror), required=True)
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
            pass
    except OSError as e:
        return Check("run directory", "fail", f"{root} is not writable: {e.strerror or e}", required=True)
    return Check("run directory", "ok", f"{root} is writable", required=True)


def gcs_address_problem(url: str) -> str:
    """One line when ``url`` is not a ``gs://BUCKET[/PATH]`` address, else ""."""
    if not url.startswith("gs://") or not url[len("gs://"):].split("/", 1)[0]:
        return f"--gcs {url!r}: expected gs://BUCKET[/PATH]"
    return ""


def gcs_check(url: str, timeout_s: float = 10.0) -> Check:
    """Bucket reachable and writable (a tiny object written and deleted under the path)."""
    name = "GCS"
    problem = gcs_address_problem(url)
    if problem:
        return Check(name, "fail", problem, required=True)
    bucket_name, _, prefix = url[len("gs://"):].partition("/")
    where = os.environ.get("STORAGE_EMULATOR_HOST")
    via = f" (emulator {where})" if where else ""
    try:
        from google.cloud import storage
    except ImportError:
        return Check(name, "fail", "google-cloud-storage is not installed "
                     "(pip install 'tpuwatch[gcs]'; docs/usage.md, Install)",
                     required=True)
    try:
        client = storage.Client()
    except Exception as e:  # google.auth's DefaultCredentialsError and friends
        return Check(name, "fail", f"no GCS credentials ({type(e).__name__}): run `gcloud auth application-default "
                                   "login` or set GOOGLE_APPLICATION_CREDENTIALS", required=True)
    bucket = client.bucket(bucket_name)
    t0 = time.perf_counter()
    try:
        # retry=None: the library's default retries connection errors for two minutes.
        if not bucket.exists(timeout=timeout_s, retry=None):
            return Check(name, "fail", f"bucket gs://{bucket_name} not found{via}", required=True)
    except Exception as e:
        return Check(name, "fail", f"cannot reach bucket gs://{bucket_name}{via}: {_short(e)}", required=True)
    blob = bucket.blob("/".join(p for p in (prefix.strip("/"), f".tpuwatch-doctor-{os.getpid()}") if p))
    try:
        blob.upload_from_string(b"ok", timeout=timeout_s, retry=None)
        blob.delete(timeout=timeout_s, retry=None)
    except Exception as e:
        return Check(name, "fail", f"gs://{bucket_name} is reachable but not writable{via}: {_short(e)}",
                     required=True)
    return Check(name, "ok", f"{url}: bucket reachable and writable{via} "
                             f"({time.perf_counter() - t0:.2f} s)", required=True)


def _short(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {(text.splitlines() or [''])[0][:160]}"


def _symbols(stream: TextIO) -> dict[str, str]:
    try:
        "".join(SYMBOLS.values()).encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return ASCII_SYMBOLS
    return SYMBOLS


def render(checks: list[Check], symbols: dict[str, str] = SYMBOLS) -> str:
    width = max(len(c.name) for c in checks) + 2
    return "\n".join(f"{symbols[c.status]} {c.name:<{width}}{c.detail}" for c in checks)


def main(python: str | None = None, gcs: str | None = None, out: TextIO | None = None) -> int:
    """Runs every check, prints one line each; 0 when all required checks pass, 1 when one fails,
    2 for a malformed ``gcs`` (said before the checks, which take seconds)."""
    if gcs is not None and gcs_address_problem(gcs):
        print(f"tpuwatch: {gcs_address_problem(gcs)}", file=sys.stderr)
        return 2
    out = out or sys.stdout
    python = python or sys.executable
    symbols = _symbols(out)
    print(f"Checking {python} (imports TensorFlow once: a few seconds) ...", file=out, flush=True)
    checks = interpreter_checks(python)
    checks.append(rundir_check())
    if gcs:
        checks.append(gcs_check(gcs))
    print(render(checks, symbols), file=out)
    failed = [c.name for c in checks if c.failed]
    print(f"{len(failed)} required check(s) failed: {', '.join(failed)}" if failed
          else "All required checks passed.", file=out, flush=True)
    return 1 if failed else 0
