"""``HOST:PORT``: the one parser and its one validation, for every place an address comes from
(``tpuwatch run --listen``, ``tpuwatch attach HOST:PORT`` and its ``@hosts.txt``, run.json's
``tcp``). Standard library only: the agent parses ``--listen`` with it too.

An address to **connect** to needs a host and a port 1-65535; an address to **listen** on may
leave the host out (127.0.0.1) and take port 0 (any free port). IPv6 hosts go in brackets
(``[::1]:7711``).
"""

from __future__ import annotations

import socket

EXAMPLE = "127.0.0.1:7711"


def _split(value: str) -> tuple[str, str, str]:
    host, sep, port = value.strip().rpartition(":")
    return host, sep, port


def looks_like(value: str) -> bool:
    """Whether ``value`` is written as HOST:PORT at all (a run id or a path is not)."""
    host, sep, port = _split(value)
    return bool(sep and host and port.isdigit())


def parse(value: str, *, listen: bool = False, option: str = "--listen") -> tuple[str, int]:
    """``(host, port)`` of ``value``; brackets around an IPv6 host removed. ``listen``: an address
    to bind (host optional, port 0 allowed). Raises ValueError with one line naming what is wrong
    (for an address to bind, prefixed with ``option``)."""
    host, sep, port = _split(value)
    host = host.strip("[]")
    if listen:
        host = host or "127.0.0.1"
        if not sep or not port.isdigit():
            raise ValueError(f"{option} {value!r}: expected HOST:PORT, e.g. {EXAMPLE}")
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"{option} {value!r}: port {port} is out of range (0-65535)")
    elif not sep or not port.isdigit() or not host or not 0 < int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. {EXAMPLE})")
    return host, int(port)


def parse_listen(value: str) -> tuple[str, int] | None:
    """``--listen``: None for "" (no TCP listener), else :func:`parse` of it as a listen address."""
    return parse(value, listen=True) if value else None


def check_listen(value: str) -> tuple[str, int] | None:
    """Parses ``--listen`` and binds it once (then lets it go), so a bad host or a port in use is
    reported before the script starts. Raises ValueError with one line."""
    address = parse_listen(value)
    if address is None:
        return None
    host, port = address
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"--listen {value!r}: cannot resolve {host!r} ({e}); give an address of this "
                         f"machine, e.g. {EXAMPLE}") from None
    family, _, _, _, sockaddr = infos[0]
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(sockaddr)
    except OSError as e:
        raise ValueError(f"--listen {value!r}: cannot listen there ({e.strerror or e}); choose a free port "
                         "on an address of this machine") from None
    finally:
        probe.close()
    return address
