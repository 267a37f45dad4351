"""Run directories: where a run's recording, output, socket and artefacts live.

Shared by the agent (inside training) and the monitor side; standard library only.

Layout of ``$TPUWATCH_HOME/runs/<run-id>/`` (mode 0700)::

    run.json      metadata, written by the launcher (atomically replaced on update)
    events.jsonl  every protocol message, appended by the agent
    output.log    the script's stdout and stderr
    agent.sock    the agent's Unix socket (0600)
    token         random token TCP viewers must present (0600)
    profiles/     profiler captures (TensorBoard/XProf layout)
    checkpoints/  checkpoints saved on request
    stacks/       stack dumps
    .reserve      disk space held back for the end of the run (released when the disk is full)

The run directory is private (0700: a recording holds the script's arguments, output and
stacks), which covers everything inside; the files tpuwatch writes are 0600 too, while TensorFlow
writes checkpoints and profiles with the user's umask.

Shared homes (docs/remote.md, threat model): ``$TPUWATCH_HOME`` and its ``runs/`` must be this
user's and writable by nobody else (:func:`check_private`), else every command refuses them.
tpuwatch creates its files with ``O_EXCL | O_NOFOLLOW`` and opens the ones it appends to with
``O_NOFOLLOW``, checking they are this user's regular, singly linked files
(:func:`open_append`): a planted link can neither receive a run's token or recording nor hand
over someone's private file. A viewer reads only regular files, run.json at most
:data:`MAX_META_BYTES` of it (:func:`open_regular`): a FIFO or a device in a run directory is
one line, never a hang.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shlex
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tpuwatch import settings

EVENTS = "events.jsonl"
OUTPUT = "output.log"
TEARDOWN_STACKS = "teardown-stacks.txt"  # written only when the interpreter's teardown hung (agent/exit_guard.py)
META = "run.json"
SOCKET = "agent.sock"
TOKEN = "token"
RESERVE = ".reserve"

#: Bytes held back in each run directory so the end of a run (the exit record, run.json, what a
#: full disk made the recording lose) can still be written when the disk fills up.
RESERVE_BYTES = 256 * 1024

#: errno values that mean "no space": the output and the recording drop data on these.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

# AF_UNIX paths are limited to 108 bytes on Linux (104 on macOS).
_MAX_SOCKET_PATH = 100


#: The largest run.json a viewer reads (a real one is a few KB; /dev/zero is endless).
MAX_META_BYTES = 1 << 20


class RunDirError(OSError):
    """The run directory cannot be used; ``strerror`` is one line naming what to do."""


class NotRegularFile(OSError):
    """A file tpuwatch reads is a FIFO, a device, a directory, or too big; ``strerror`` says which."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike[str], max_bytes: int | None = None):
    """``open(path, "rb")`` for a regular file only (a link to one is fine): a FIFO is opened
    without waiting for a writer (O_NONBLOCK) and refused, like a device or a directory. Raises
    :class:`NotRegularFile` (also for a file over ``max_bytes``) or OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{path} is {_kind(st.st_mode)}, not a regular file; remove it")
        if max_bytes is not None and st.st_size > max_bytes:
            raise NotRegularFile(errno.EFBIG, f"{path} is {st.st_size} bytes, more than the {max_bytes} a "
                                              f"{Path(path).name} can be; remove it")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def create_exclusive(path: str | os.PathLike[str], flags: int = os.O_WRONLY) -> int:
    """A new file of this user's, 0600, never through a link: ``O_CREAT | O_EXCL | O_NOFOLLOW``
    (FileExistsError when anything, a planted link included, is at ``path``). Returns the fd."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def open_append(path: str | os.PathLike[str], create: bool = True) -> int:
    """An fd appending to ``path``: created as by :func:`create_exclusive` when missing; an
    existing one must be this user's regular file with one link (not a link to someone's file,
    nor a hard link to it). Raises OSError (:class:`RunDirError` for a file that is not ours)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if not create:
                raise
            try:
                fd = create_exclusive(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            except FileExistsError:  # created meanwhile by the other side (agent, launcher)
                fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunDirError(errno.ELOOP, f"{path} is a symbolic link: tpuwatch never writes through one; "
                                           "remove it, or give a new run directory") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
            raise RunDirError(errno.EPERM, f"{path} is not a private file of this user ({_kind(st.st_mode)}"
                                           f" if not regular, owner uid {st.st_uid}, {st.st_nlink} links); "
                                           "remove it")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def check_private(path: Path, what: str) -> None:
    """Raises :class:`RunDirError` (one line) when the existing directory ``path`` is not this
    user's or is writable by anyone else: another user could swap a run directory in it, or
    plant links where tpuwatch writes a run's token and recording. A missing ``path`` is fine
    (tpuwatch creates it, 0700)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirError(errno.ENOTDIR, f"{path} ({what}) is {_kind(st.st_mode)}, not a directory; set "
                                         "TPUWATCH_HOME to a directory of your own (default ~/.tpuwatch)")
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid() or mode & 0o022:
        whose = "owned by uid %d" % st.st_uid if st.st_uid != os.getuid() else f"writable by others (mode {mode:04o})"
        raise RunDirError(errno.EPERM, f"{path} ({what}) is {whose}: another user could take over your runs; "
                                       "set TPUWATCH_HOME to a directory of your own (default ~/.tpuwatch)"
                                       + (f", or `chmod go-w {path}`" if st.st_uid == os.getuid() else ""))


def check_home() -> Path:
    """``runs_root()`` after :func:`check_private` on ``$TPUWATCH_HOME`` and its ``runs/`` (and
    the home's parent: no one else may rename the home away)."""
    root = runs_root()
    _check_parent(home(), "TPUWATCH_HOME", "set TPUWATCH_HOME to a directory of your own (default ~/.tpuwatch)")
    check_private(home(), "TPUWATCH_HOME")
    check_private(root, "the runs directory")
    return root


def home() -> Path:
    """``$TPUWATCH_HOME`` or ``~/.tpuwatch``, absolute (a script that chdirs must not move it)."""
    env = settings.HOME.get()
    return Path(os.path.abspath(Path(env).expanduser() if env else Path.home() / ".tpuwatch"))


def runs_root() -> Path:
    return home() / "runs"


def new_run_id(script: str, clock=time.time) -> str:
    # A name for directories, shell lines and terminals: no blank, no control character, no lone
    # surrogate (a script's file name may hold any of them).
    stem = "".join(c if c.isprintable() and not c.isspace() else "_" for c in Path(script).stem)[:40] or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(clock()))
    return f"{stamp}-{stem}-{secrets.token_hex(2)}"


def make_private_dirs(path: Path) -> Path:
    """Creates ``path`` and its missing parents, each one it creates with mode 0700 (existing
    directories are left as they are). Raises OSError."""
    missing = []
    for p in [path, *path.parents]:
        if p.is_dir():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            if not p.is_dir():
                raise
            continue
        os.chmod(p, 0o700)  # mkdir's mode goes through the umask
    return path


def create(run_dir: Path, run_id: str | None = None, *, new: bool = False) -> Path:
    """Creates ``run_dir`` (and the parents it needs) with mode 0700 and holds the disk reserve.

    Raises :class:`RunDirError` for a home that is not private (:func:`check_home`), a directory
    of another user's, or a non-empty directory that is not this run's (no run.json
    naming ``run_id``, default ``$TPUWATCH_RUN_ID``, i.e. the launcher made it): tpuwatch never
    appends to another recording, nor chmods a directory it did not make. ``new``: a launcher
    starting a run: any non-empty directory is refused. Raises OSError when it cannot write."""
    run_dir = Path(os.path.abspath(run_dir))
    _check_links(run_dir)
    if home() in run_dir.parents:
        check_home()  # a home or runs/ another user can write into: refused before anything is made
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(errno.ENOTDIR, f"{run_dir} is a file; give a new or empty directory")
    _check_parent(run_dir)
    if run_dir.is_dir() and os.stat(run_dir).st_uid != os.getuid():
        raise RunDirError(errno.EPERM, f"{run_dir} belongs to another user (uid {os.stat(run_dir).st_uid}); "
                                       "give a new directory of your own")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        mine = run_id or settings.RUN_ID.get()
        if new or not mine or read_meta(run_dir).get("run_id") != mine:
            raise RunDirError(errno.EEXIST, f"{run_dir} is not empty and is not this run's directory; give a new "
                                            "or empty directory (a run never appends to another recording)")
    else:
        make_private_dirs(run_dir)
        os.chmod(run_dir, 0o700)
    probe = run_dir / ".write-test"
    try:
        probe.unlink()  # left by a process killed right here
    except FileNotFoundError:
        pass
    os.close(create_exclusive(probe))
    probe.unlink()
    make_reserve(run_dir)
    return run_dir


def _check_links(run_dir: Path) -> None:
    """Refuses a run directory reached through a symbolic link of another user's (the run
    directory itself or any directory above it): its owner could re-point it mid-run, and the
    run's files (its teardown stacks, its recording) would go where they choose."""
    for p in [*reversed(run_dir.parents), run_dir]:
        try:
            st = os.lstat(p)
        except OSError:
            return  # missing from here down: we make them
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.getuid(), 0):
            raise RunDirError(errno.EPERM, f"{p} is a symbolic link of another user (uid {st.st_uid}), who could "
                                           f"re-point it while the run writes there; give the directory itself "
                                           f"({os.path.realpath(p)}) if it is yours, or a directory of your own")


def _check_parent(run_dir: Path, what: str = "run directory",
                  remedy: str = "give a --run-dir in a directory of your own") -> None:
    """Refuses a run directory (or home) in a directory that another user owns, or that group or
    others can write without the sticky bit: they could rename it away and put their own in its
    place between two of our calls (in /tmp, the sticky bit forbids that)."""
    parent = next((p for p in run_dir.parents if p.exists()), None)  # the missing ones we make, 0700
    try:
        st = os.stat(parent or "/")
    except OSError:
        return
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (os.getuid(), 0):
        whose = f"owned by uid {st.st_uid}"
    elif mode & 0o022 and not mode & stat.S_ISVTX:
        whose = f"writable by others (mode {mode:04o}, no sticky bit)"
    else:
        return
    raise RunDirError(errno.EPERM, f"{parent} is {whose}: another user could swap the {what} in it; {remedy}")


def make_reserve(run_dir: Path) -> None:
    """Holds :data:`RESERVE_BYTES` of disk in the run directory (best effort: a disk already full
    at the start just means no reserve)."""
    try:
        fd = create_exclusive(run_dir / RESERVE)
    except OSError:  # there already (the agent after its launcher), or no space
        return
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError:  # a file system without fallocate: real zeros
            os.write(fd, b"\0" * RESERVE_BYTES)
    except OSError:
        pass
    finally:
        os.close(fd)


def release_reserve(run_dir: Path) -> bool:
    """Frees the disk reserve (for the last records of a run on a full disk). True if there was one."""
    try:
        os.unlink(run_dir / RESERVE)
        return True
    except OSError:
        return False


def socket_path(run_dir: Path) -> Path:
    """The agent socket for ``run_dir``.

    When ``run_dir/agent.sock`` is too long for AF_UNIX: a short path in the private directory
    ``$TMPDIR/tpuwatch-<uid>/``, named after a hash of the absolute run directory (two runs never
    share one). That directory must be this user's, mode 0700, not a link, else RunDirError
    (another user could take or read the socket). When another user made it first (in a sticky
    ``/tmp`` it cannot be removed by us), ``$TPUWATCH_HOME/sockets/`` is used instead (the home
    is private: :func:`check_home`)."""
    run_dir = Path(os.path.abspath(run_dir))
    path = run_dir / SOCKET
    if len(os.fsencode(str(path))) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(os.fsencode(str(run_dir))).hexdigest()[:16]
    name = f"{run_dir.name[-40:]}-{digest}.sock"
    base = Path(tempfile.gettempdir()) / f"tpuwatch-{os.getuid()}"
    st = _private_socket_dir(base)
    if st.st_uid == os.getuid():
        _check_socket_dir(base, st)
        return base / name
    squatted = f"{base} (for the sockets of long run directories) belongs to uid {st.st_uid}, another user"
    fallback = home() / "sockets"
    if len(os.fsencode(str(fallback / name))) > _MAX_SOCKET_PATH:
        name = f"{digest}.sock"
    if len(os.fsencode(str(fallback / name))) > _MAX_SOCKET_PATH:
        raise RunDirError(errno.EPERM, f"{squatted}, and {fallback} is too long a path for a socket: set TMPDIR "
                                       "to a directory of your own, or give a shorter --run-dir")
    try:
        check_home()
        make_private_dirs(fallback)
        st = _private_socket_dir(fallback)
    except OSError as e:
        raise RunDirError(errno.EPERM, f"{squatted}, and {fallback} cannot be used instead "
                                       f"({e.strerror or e}): set TMPDIR to a directory of your own, or give a "
                                       "shorter --run-dir") from None
    _check_socket_dir(fallback, st)
    return fallback / name


def _private_socket_dir(base: Path) -> os.stat_result:
    try:
        base.mkdir(mode=0o700)
    except FileExistsError:
        pass
    return os.lstat(base)


def _check_socket_dir(base: Path, st: os.stat_result) -> None:
    """A socket directory must be this user's real directory, 0700; RunDirError (one line) else."""
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        mine = st.st_uid == os.getuid()
        raise RunDirError(errno.EPERM, f"{base} (for the sockets of long run directories) is not a private "
                                       f"directory of this user (owner uid {st.st_uid}, mode "
                                       f"{stat.S_IMODE(st.st_mode):04o}); "
                                       + (f"`chmod 700 {base}`" if mine and stat.S_ISDIR(st.st_mode) else
                                          f"remove {base}") + " or give a shorter --run-dir")


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Atomically replaces run.json (a new temporary file, never through a link, renamed over it)."""
    tmp = run_dir / f".{META}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.unlink()  # left by a process of ours killed mid-write (our pid, reused)
    except FileNotFoundError:
        pass
    fd = create_exclusive(tmp)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(meta, indent=2, sort_keys=True))
        os.replace(tmp, run_dir / META)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


META_LOCK_WAIT_S = 10.0


def update_meta(run_dir: Path, **changes: Any) -> dict[str, Any]:
    """Read-modify-write of run.json under a lock, so two processes updating it at once (the
    launcher and the agent) keep each other's keys. The lock is waited for at most
    ``META_LOCK_WAIT_S`` (a holder that hangs must not stop the other); without it, or where the
    directory cannot be locked, the update goes ahead unlocked as before."""
    with _meta_lock(run_dir):
        meta = read_meta(run_dir)
        meta.update(changes)
        write_meta(run_dir, meta)
    return meta


@contextlib.contextmanager
def _meta_lock(run_dir: Path) -> Iterator[None]:
    try:
        # the run directory itself is the lock (no file left behind)
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + META_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.001)
            except OSError:
                break
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_meta(run_dir: Path) -> dict[str, Any]:
    """run.json as a dict; {} when it is missing, unreadable, not a regular file, too big or not
    a JSON object (:func:`meta_problem` says which)."""
    try:
        return _load_meta(run_dir)
    except (OSError, ValueError, RecursionError):
        return {}


def meta_problem(run_dir: Path) -> str:
    """Why run.json of ``run_dir`` must not be read at all (a FIFO, a device, too big), in one
    line; "" otherwise (a missing or corrupt one is read as {}, as before)."""
    try:
        _load_meta(run_dir)
    except NotRegularFile as e:
        return str(e.strerror)
    except (OSError, ValueError, RecursionError):
        pass
    return ""


def files_problem(run_dir: Path) -> str:
    """Why a viewer must not read ``run_dir`` at all: its run.json (:func:`meta_problem`) or its
    events.jsonl is a FIFO, a device, ... (one line); "" otherwise."""
    problem = meta_problem(run_dir)
    if problem:
        return problem
    try:
        with open_regular(run_dir / EVENTS):
            return ""
    except NotRegularFile as e:
        return str(e.strerror)
    except OSError:
        return ""  # missing (a run that has not written yet), unreadable: said where it is read


def _load_meta(run_dir: Path) -> dict[str, Any]:
    with open_regular(run_dir / META, MAX_META_BYTES) as f:
        data = json.loads(f.read(MAX_META_BYTES + 1))
    return data if isinstance(data, dict) else {}


def write_token(run_dir: Path, token: str | None = None) -> str:
    """Writes the run's viewer token (0600): the one given, or a new random one."""
    token = token or secrets.token_urlsafe(24)
    path = run_dir / TOKEN
    try:
        os.unlink(path)  # a token of this run's earlier process; a link: removed, never written through
    except FileNotFoundError:
        pass
    fd = create_exclusive(path)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_token(path: Path) -> str:
    return path.read_text().strip()  # `--token-file <(...)` is a FIFO, and that is fine here


def hostname() -> str:
    return socket.gethostname()


def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state is the first, the
    start time the 20th); None when there is no such process or no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
    except OSError:
        return None
    return data.rpartition(b") ")[2].split()  # the name may hold ") " itself: split at the last


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return ""


def process_identity(pid: int) -> str | None:
    """What tells process ``pid`` from a later one given the same pid: ``"<boot id>:<start
    time>"``, its start in clock ticks after boot (``/proc/<pid>/stat`` field 22). Recorded in
    run.json (``child_identity``) when a run starts; None where /proc cannot tell (not Linux, or
    the process is gone). A zombie still has its identity (its pid is not free yet)."""
    fields = _proc_stat(pid)
    if not fields or len(fields) < 20:
        return None
    return f"{_boot_id()}:{fields[19].decode('ascii', 'replace')}"


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` ("R", "S", "Z" for a zombie...), None without one."""
    fields = _proc_stat(pid)
    return fields[0].decode("ascii", "replace") if fields else None


def check_runs_root() -> Path:
    """``runs_root()``; raises FileNotFoundError (one line) when it, or ``$TPUWATCH_HOME``, is a
    file rather than a directory, and :class:`RunDirError` when either is not private to this
    user (:func:`check_home`)."""
    root = runs_root()
    for p in (home(), root):
        if p.exists() and not p.is_dir():
            raise FileNotFoundError(f"{p} is a file, not a directory; set TPUWATCH_HOME to a directory "
                                    "(default ~/.tpuwatch)")
    return check_home()


def reference(run_dir: Path) -> str:
    """How to name ``run_dir`` to another tpuwatch command, quoted for a shell: its id (or
    ``<id>/worker-N``) when it is under the runs home (where :func:`find_run` looks ids up), else
    its absolute path."""
    path = Path(os.path.abspath(run_dir))
    try:
        inside = path.relative_to(runs_root())
    except ValueError:
        inside = None
    return shlex.quote(str(inside if inside and inside.parts else path))


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run: its run.json (written before anything else), or a recording
    with something in it (events.jsonl copied on its own). An empty events.jsonl alone is not one."""
    try:
        return (path / META).exists() or (path / EVENTS).stat().st_size > 0
    except OSError:
        return False


def find_run(ref: str | None) -> Path:
    """A run directory from a reference: a path, a run id (or unique prefix), or None for the latest.

    Raises FileNotFoundError with a one-line message naming what to do.
    """
    root = check_runs_root()
    if ref:
        path = Path(ref).expanduser()
        if is_run_dir(path):
            return path
        # An id prefix is matched by name, not as a glob ("*" would match everything, "/tmp" raise).
        # "<run-id>/worker-1" (one worker of a group) is looked up under the runs home.
        inside = root / ref
        if not path.is_absolute() and not ref.startswith(("~", ".")) and is_run_dir(inside):
            return inside
        if os.sep in ref or ref in (".", "..") or ref.startswith("~") or not root.is_dir():
            candidates = []
        else:
            candidates = sorted(p for p in root.iterdir() if p.name.startswith(ref) and p.is_dir())
        if len(candidates) == 1:
            return candidates[0]
        if len(candidates) > 1:
            names = ", ".join(p.name for p in candidates[:5])
            raise FileNotFoundError(f"run {ref!r} is ambiguous ({names}...); give more of the id")
        if path.is_dir():
            found = f"no {META}, and its {EVENTS} is empty" if (path / EVENTS).exists() else f"no {EVENTS} or {META} in it"
            raise FileNotFoundError(f"{path} is not a run directory ({found}); give a run "
                                    "directory or a run id (`tpuwatch ls` lists runs)")
        if path.exists():
            raise FileNotFoundError(f"{path} is a file, not a run directory; give a run directory or a run id "
                                    "(`tpuwatch ls` lists runs)")
        raise FileNotFoundError(f"no run {ref!r} (not a run directory, nor a run id under {root}); `tpuwatch ls` lists runs")
    # The latest run a viewer can read (one whose run.json is a FIFO would hang it).
    runs = [p for p in root.iterdir() if p.is_dir() and is_run_dir(p) and not files_problem(p)] if root.is_dir() else []
    if not runs:
        raise FileNotFoundError(f"no runs under {root}; start one with `tpuwatch run SCRIPT`")
    def started(p: Path) -> float:
        t = read_meta(p).get("started")
        return float(t) if isinstance(t, (int, float)) and t == t else p.stat().st_mtime  # a crafted "x", NaN

    return max(runs, key=lambda p: (started(p), p.name))
