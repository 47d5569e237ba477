"""Socket path resolution, shared with every client: see :mod:`memproto.paths`."""

from memproto.paths import SYSTEM_SOCKET, socket_path

__all__ = ["SYSTEM_SOCKET", "socket_path"]
