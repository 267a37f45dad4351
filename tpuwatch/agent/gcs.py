"""Uploading finished artefacts (checkpoints, profiles) to ``gs://`` with google-cloud-storage.

Why google-cloud-storage and not TensorFlow's own ``gs://`` filesystem: TF's filesystem would
write *during* the save, on the training thread, so a slow or broken network would stall the step
boundary the save runs at; it retries and reports errors in its own C++ log lines, not as a
one-line reason we can send back; and it cannot be pointed at a local emulator reliably, so it
could not be tested here. google-cloud-storage honours ``STORAGE_EMULATOR_HOST``, gives typed
errors (``NotFound`` for a missing bucket, ``Forbidden`` for missing rights), retries with
back-off (``DEFAULT_RETRY``) and uploads large files resumably in chunks. So the agent saves to
local disk at the step boundary, then uploads from a background thread.

Imported lazily (only when a ``gs://`` destination is used): the client library costs ~0.5 s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

#: Files larger than this go up resumably, in chunks of CHUNK_BYTES (a multiple of 256 KiB).
RESUMABLE_ABOVE_BYTES = 8 << 20
CHUNK_BYTES = 32 << 20
#: Seconds one HTTP request may take (a chunk, or a whole small file).
REQUEST_TIMEOUT_S = 120.0


class GcsError(Exception):
    """An upload failed; the message is one line that says what to fix."""


@dataclass(frozen=True)
class GcsPath:
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket root

    def join(self, *parts: str) -> str:
        key = "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))
        return key

    def url(self, *parts: str) -> str:
        key = self.join(*parts)
        return f"gs://{self.bucket}/{key}" if key else f"gs://{self.bucket}"


def is_gcs(path: str) -> bool:
    return path.startswith("gs://")


def parse(url: str) -> GcsPath:
    """``gs://bucket/some/prefix`` -> GcsPath. Raises ValueError with a one-line reason."""
    if not is_gcs(url):
        raise ValueError(f"{url!r} is not a gs:// URL")
    rest = url[len("gs://"):]
    bucket, _, prefix = rest.partition("/")
    if not bucket or any(c in bucket for c in " \\"):
        raise ValueError(f"{url!r} names no bucket (expected gs://BUCKET/PATH)")
    return GcsPath(bucket, prefix.strip("/"))


def _client() -> Any:
    try:
        from google.cloud import storage
    except ImportError as e:
        raise GcsError(f"gs:// needs google-cloud-storage in the training environment "
                       f"(pip install 'tpuwatch[gcs]'; docs/usage.md, Install): {e}") from None
    try:
        return storage.Client()
    except Exception as e:  # DefaultCredentialsError and friends: say how to authenticate
        raise GcsError(f"cannot create a GCS client ({type(e).__name__}: {_first_line(e)}); run "
                       "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def _explain(e: BaseException, dest: GcsPath) -> GcsError:
    name = type(e).__name__
    if name == "NotFound":
        return _missing_bucket(dest)
    if name in ("Forbidden", "Unauthorized"):
        return GcsError(f"no permission to write to gs://{dest.bucket} ({_first_line(e)}); grant the training "
                        "account roles/storage.objectCreator on the bucket or choose another destination")
    return GcsError(f"upload to {dest.url()} failed: {name}: {_first_line(e)}")


def _missing_bucket(dest: GcsPath) -> GcsError:
    return GcsError(f"bucket gs://{dest.bucket} does not exist; create it "
                    f"(`gcloud storage buckets create gs://{dest.bucket}`) or choose another destination")


def check_bucket(dest: GcsPath) -> None:
    """Raises GcsError when the bucket is missing or unreachable (a quick metadata request)."""
    client = _client()
    try:
        exists = client.bucket(dest.bucket).exists(timeout=30)
    except Exception as e:  # google-api-core's, google-auth's and requests' errors share no base: each explained
        raise _explain(e, dest) from None
    if not exists:
        raise _missing_bucket(dest)


def upload_files(files: Iterable[tuple[Path, str]], dest: GcsPath) -> int:
    """Uploads ``(local file, key relative to dest)`` pairs in order; returns the bytes sent.

    Retries transient errors with back-off (``DEFAULT_RETRY``: uploads of whole objects are
    idempotent here since nothing else writes these names). Raises GcsError on the first failure.
    """
    from google.cloud.storage.retry import DEFAULT_RETRY

    client = _client()
    bucket = client.bucket(dest.bucket)
    total = 0
    for path, key in files:
        size = os.path.getsize(path)
        chunk = CHUNK_BYTES if size > RESUMABLE_ABOVE_BYTES else None
        blob = bucket.blob(dest.join(key), chunk_size=chunk)
        try:
            blob.upload_from_filename(str(path), timeout=REQUEST_TIMEOUT_S, retry=DEFAULT_RETRY)
        except Exception as e:  # google-api-core's, google-auth's and requests' errors share no base: each explained
            raise _explain(e, dest) from None
        total += size
    return total
