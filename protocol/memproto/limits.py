"""Hard limits on what a peer may send. Every decoder applies them.

A frame is at most :data:`MAX_FRAME_BYTES`; a server accepts far smaller frames from
clients (:data:`MAX_CLIENT_FRAME_BYTES`), since requests are small and a client must
not be able to make the daemon buffer megabytes. msgpack containers are bounded too,
so a small frame cannot announce a billion-element array.
"""

from __future__ import annotations

from typing import Final

#: Bytes in the length prefix that precedes every frame (big-endian unsigned).
HEADER_BYTES: Final = 4
#: Largest frame anyone may send (a history reply for 1000 processes is ~3 MiB).
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
#: Largest frame a server accepts from a client. The largest request (an attach of
#: MAX_REQUEST_PIDS PIDs with a label) is ~21 KB; 64 KiB of the most costly msgpack (empty
#: containers) unpacks in ~5 ms, where 1 MiB of it took the tick 350 ms and 70 MB.
MAX_CLIENT_FRAME_BYTES: Final = 64 * 1024
#: Longest string (a cmdline argument is truncated by the agent well below this).
MAX_STR_LEN: Final = 64 * 1024
#: Longest binary blob.
MAX_BIN_LEN: Final = 1024 * 1024
#: Most elements in one array (rows of a sample frame, pids of a request).
MAX_ARRAY_LEN: Final = 1_000_000
#: Most keys in one map.
MAX_MAP_LEN: Final = 256
# Nesting depth is bounded by msgpack's own unpacker stack (1024 levels -> an error).

# What a server accepts in a request: far less, so that decoding one costs microseconds and
# nothing in it can make the daemon do (or hold) much. See docs/security.md.
#: Most PIDs in one request (attach, detach, reset_peaks, history); a bigger array is refused
#: while unpacking, before it is built.
MAX_REQUEST_PIDS: Final = 4096
#: Longest string in a request (labels have their own, shorter rule: memproto.text).
MAX_REQUEST_STR_LEN: Final = 1024
#: Most keys in one request map.
MAX_REQUEST_MAP_LEN: Final = 32
