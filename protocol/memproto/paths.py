"""Where the daemon's socket lives: part of the contract, so every client (memagent's
commands, memtop, a client in another language) finds the daemon the same way.

Where a daemon listens (:func:`socket_path`): ``--socket PATH``; ``$MEMAGENT_SOCKET``;
:data:`SYSTEM_SOCKET` when it runs as root; else its user's path (:func:`user_socket`:
``$XDG_RUNTIME_DIR/memagent.sock`` where that directory exists, else
``<tmp>/memagent-<uid>/memagent.sock``).

Where a client looks (:func:`socket_candidates`), first to answer wins: ``--socket
PATH``, else ``$MEMAGENT_SOCKET``, each alone (an explicit path is never replaced by
another); else :data:`SYSTEM_SOCKET`, whoever the client is (root's daemon serves every
user its socket group lets in), then the per-user paths a daemon of the client's own
user may listen on.

Pure: the environment and the UID are parameters (the process's by default) and nothing
here touches the file system but :func:`socket_path`'s ``isdir``, a parameter too.
Whether a candidate exists is learnt by connecting to it (a missing file is "no such
file"), by the client, so there is no stat-then-connect race and one rule serves the
blocking and the asyncio client.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

SYSTEM_SOCKET = "/run/memagent/memagent.sock"
#: Names the socket, for a client as for the daemon; beats every default.
SOCKET_ENV = "MEMAGENT_SOCKET"
RUNTIME_ENV = "XDG_RUNTIME_DIR"
SOCKET_NAME = "memagent.sock"


def _euid(euid: int | None) -> int:
    return os.geteuid() if euid is None else euid


def fallback_socket(euid: int | None = None) -> str:
    """``<tmp>/memagent-<uid>/memagent.sock``: a user's socket without ``$XDG_RUNTIME_DIR``."""
    import tempfile  # only without $XDG_RUNTIME_DIR: 4 ms of every command's start

    return os.path.join(tempfile.gettempdir(), f"memagent-{_euid(euid)}", SOCKET_NAME)


def user_socket(environ: Mapping[str, str] | None = None, euid: int | None = None,
                isdir: Callable[[str], bool] = os.path.isdir) -> str:
    """Where a daemon run by ``euid`` listens by default: root's is :data:`SYSTEM_SOCKET`;
    another user's ``$XDG_RUNTIME_DIR/memagent.sock`` when that is a directory, else
    :func:`fallback_socket`."""
    env = os.environ if environ is None else environ
    uid = _euid(euid)
    if uid == 0:
        return SYSTEM_SOCKET
    runtime = env.get(RUNTIME_ENV)
    if runtime and isdir(runtime):
        return os.path.join(runtime, SOCKET_NAME)
    return fallback_socket(uid)


def socket_path(explicit: str | None = None, environ: Mapping[str, str] | None = None,
                euid: int | None = None, isdir: Callable[[str], bool] = os.path.isdir) -> str:
    """Where the daemon listens: ``explicit``, else ``$MEMAGENT_SOCKET``, else
    :func:`user_socket`."""
    env = os.environ if environ is None else environ
    if explicit:
        return explicit
    return env.get(SOCKET_ENV) or user_socket(env, euid, isdir)


def socket_candidates(explicit: str | None = None, environ: Mapping[str, str] | None = None,
                      euid: int | None = None) -> tuple[str, ...]:
    """The paths a client tries, in order, until one answers: ``explicit`` alone, else
    ``$MEMAGENT_SOCKET`` alone, else :data:`SYSTEM_SOCKET`, ``$XDG_RUNTIME_DIR/memagent.sock``
    (when set) and :func:`fallback_socket` (root: :data:`SYSTEM_SOCKET` only, where root's
    daemon listens)."""
    env = os.environ if environ is None else environ
    if explicit:
        return (explicit,)
    if env.get(SOCKET_ENV):
        return (env[SOCKET_ENV],)
    uid = _euid(euid)
    if uid == 0:
        return (SYSTEM_SOCKET,)
    runtime = env.get(RUNTIME_ENV)
    paths = [SYSTEM_SOCKET, *([os.path.join(runtime, SOCKET_NAME)] if runtime else []), fallback_socket(uid)]
    return tuple(dict.fromkeys(paths))  # in order, once each
