"""A real subscriber in its own process, driven over stdin/stdout by the benchmark.

    python bench/subscriber.py SOCKET

Connects, says hello, subscribes, prints ``ready``. Then, for each line ``K`` read on
stdin, it reads frames from the socket until it has received ``K`` sample frames and
prints ``K BYTES CPU_SECONDS ROWS DROPPED_FRAMES``: the payload bytes received, its own
CPU time spent receiving, the row count of the last sample (fully decoded and validated
with ``memproto.decode``) and how many ``dropped`` frames arrived. Frames are only split
and counted while receiving (no per-frame decode), so the subscriber keeps up and does
not steal the daemon's core for work a real client would do elsewhere.
"""

from __future__ import annotations

import socket
import sys
import time

from memproto import PROTOCOL_VERSION, FrameBuffer, decode, encode, frame_bytes, unpack
from memproto.frames import Ack, Hello, Sample, Subscribe

#: How ``memproto.encode_sample`` starts a payload: fixmap(7), "t", "sample".
SAMPLE_PREFIX = b"\x87\xa1t\xa6sample"


def _is_sample(payload: bytes) -> bool:
    if payload.startswith(SAMPLE_PREFIX):
        return True
    body = unpack(payload)
    return isinstance(body, dict) and body.get("t") == "sample"


def _is_dropped(payload: bytes) -> bool:
    body = unpack(payload)
    return isinstance(body, dict) and body.get("t") == "dropped"


class Conn:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = FrameBuffer()
        self.pending: list[bytes] = []

    def send(self, frame: object) -> None:
        self.sock.sendall(frame_bytes(encode(frame)))  # type: ignore[arg-type]

    def payloads(self) -> list[bytes]:
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise SystemExit("subscriber: the daemon closed the connection")
            self.pending = self.buf.feed(data)
        out, self.pending = self.pending, []
        return out


def main() -> None:
    conn = Conn(sys.argv[1])
    conn.send(Hello(list(PROTOCOL_VERSION), "client", "memagent-bench"))
    hello = decode(conn.payloads()[0])
    assert isinstance(hello, Hello), hello
    conn.send(Subscribe(1))
    while True:
        frames = [decode(p) for p in conn.payloads()]
        if any(isinstance(f, Ack) and f.id == 1 for f in frames):
            break
    print("ready", flush=True)
    for line in sys.stdin:
        want = int(line)
        got = nbytes = dropped = 0
        last = b""
        c0 = time.process_time()
        while got < want:
            for p in conn.payloads():
                nbytes += len(p) + 4
                if _is_sample(p):
                    got += 1
                    last = p
                elif _is_dropped(p):
                    dropped += 1
        cpu = time.process_time() - c0
        rows = 0
        if last:
            frame = decode(last)
            assert isinstance(frame, Sample), frame
            rows = len(frame.rows)
        print(f"{got} {nbytes} {cpu:.6f} {rows} {dropped}", flush=True)


if __name__ == "__main__":
    main()
