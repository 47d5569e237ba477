"""Part 11: the flight recorder's size per hour, and what it costs the daemon.

100 real processes (forked from one Python process), watched by two real daemons at the
same time and at the same interval (default 0.5 s): one recording (``--state-dir`` in a
temporary directory), one with ``--no-record``; same processes, same moments. Three
workloads, each for ``--seconds`` (default 60):

* idle: no process's memory moves (the rows are not written; each tick is a bare frame);
* mix: 10 processes change their RSS every 0.1 s (so at every tick), 90 idle;
* busy: all 100 change at every tick (the worst case: every row written every tick).

Size: the growth of the recorder's segments (``status.recording_bytes``) over the window,
per hour. Cost: each daemon's CPU time over the window (``/proc/PID/stat``, all threads:
the recorder's I/O thread included), per tick; the difference is the recorder's, within the
clock's 10 ms resolution. So the recorder's own calls are also timed in this process, on the
same kind of rows: ``FlightRecorder.sample`` (on the tick) and the batch's compression
(``pack_batch``, in the recorder's thread), per tick.

    .venv/bin/python bench/record_size.py [--seconds 60] [--interval 0.5] [--processes 100]

``--churn`` (as root; issue 25 point 3): one recording daemon (``max_bytes`` 16 MiB, so
that the churner's 1/16 share fills within the 45 s warm-up) watching the 100 processes of the
mix workload (root's), then the second user (``memagent-test``) starting 16 processes a
second, each with ``--churn-args`` arguments of 1 KiB of random text (4: 4 KiB per
process), living 1 s, matched by an ``auto_cmdline`` pattern. It prints the recorder's
bytes per hour without and with the churn, and the fraction of what is written that is
root's (in the steady state, the part of the retention left to other users).

    .venv/bin/python bench/record_size.py --churn [--seconds 60] [--churn-args 4]
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "agent"), str(ROOT / "protocol")]

from fleet import die_with_parent, proc_cpu, stop_daemon, wait_listening  # noqa: E402

from memagent.client import Client  # noqa: E402
from memagent.config import RecordConfig  # noqa: E402
from memagent.store.recorder import LEVEL, FlightRecorder  # noqa: E402
from memproto.recording import SegmentHeader, SegmentWriter, pack_batch  # noqa: E402

KiB = 1024
#: A busy process replaces its mapping this often: every tick at 0.5 s sees another RSS.
BUSY_PERIOD = 0.1


def _work(busy: bool) -> None:
    """A watched process: busy ones map, touch and unmap a random size (mmap itself: malloc
    would keep a freed buffer and the RSS would stop moving); idle ones sleep."""
    rnd = random.Random(os.getpid())
    while True:
        if not busy:
            time.sleep(3600)
            continue
        size = rnd.randrange(64, 1024) * KiB
        held = mmap.mmap(-1, size)
        held.write(b"\x01" * size)
        time.sleep(BUSY_PERIOD)
        held.close()


def workers(n: int, busy: int) -> None:
    """``--workers N BUSY``: this process and N - 1 forks; the first BUSY busy. Prints the PIDs."""
    pids = [os.getpid()]
    for i in range(1, n):
        pid = os.fork()
        if pid == 0:
            die_with_parent()
            _work(i < busy)
        pids.append(pid)
    print(" ".join(map(str, pids)), flush=True)
    _work(busy > 0)


@contextlib.contextmanager
def fleet(n: int, busy: int) -> Iterator[list[int]]:
    proc = subprocess.Popen([sys.executable, __file__, "--workers", str(n), str(busy)], stdout=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=die_with_parent)
    try:
        assert proc.stdout is not None
        yield [int(p) for p in proc.stdout.readline().split()]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def daemon(tmp: Path, name: str, interval: float, *extra: str) -> tuple[subprocess.Popen[str], str]:
    sock = str(tmp / f"{name}.sock")
    proc = subprocess.Popen([sys.executable, "-m", "memagent.cli", "daemon", "--socket", sock, "--interval",
                             str(interval), "--state-dir", str(tmp / name), "--no-stacks", *extra],
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=die_with_parent)
    wait_listening(proc)
    return proc, sock


def reading(proc: subprocess.Popen[str], sock: str) -> tuple[float, int, int]:
    with Client(sock) as c:
        st = c.status()
    return proc_cpu(proc.pid), st.tick.ticks, st.recording_bytes


def measure(tmp: Path, n: int, busy: int, seconds: float, interval: float) -> dict[str, float]:
    run = tmp / f"busy{busy}"
    run.mkdir()
    on, on_sock = daemon(run, "on", interval)
    off, off_sock = daemon(run, "off", interval, "--no-record")
    try:
        with fleet(n, busy) as pids:
            for sock in (on_sock, off_sock):
                with Client(sock, timeout=60) as c:
                    c.attach(pids)
            time.sleep(3 + interval * 2)  # settle: the attach frames and the PSS reads are not the steady state
            t0, a0, b0 = time.monotonic(), reading(on, on_sock), reading(off, off_sock)
            time.sleep(seconds)  # the measuring window, not synchronisation
            t1, a1, b1 = time.monotonic(), reading(on, on_sock), reading(off, off_sock)
        ticks = a1[1] - a0[1]
        return {
            "bytes_per_hour": (a1[2] - a0[2]) / (t1 - t0) * 3600,
            "cpu_on_us": (a1[0] - a0[0]) / ticks * 1e6,
            "cpu_off_us": (b1[0] - b0[0]) / max(1, b1[1] - b0[1]) * 1e6,
            "ticks": ticks,
            "segments": len(list((run / "on" / "record").glob("*.mrec"))),
        }
    finally:
        stop_daemon(on)
        stop_daemon(off)


def timed_calls(n: int, busy: int, interval: float, ticks: int = 2000) -> tuple[float, float]:
    """µs per tick of ``FlightRecorder.sample`` and of compressing its batches, on rows as
    the sampler gives them: a busy process's row is a new tuple at every tick, an idle one's
    the same object."""
    rec = FlightRecorder(RecordConfig(), None, interval, registry=None, stacks=None,  # type: ignore[arg-type]
                         alerts=SimpleNamespace(headroom=[]), procfs=None)  # type: ignore[arg-type]
    rec.writer = SegmentWriter(SegmentHeader(1, "bench", 0.0, interval, [1, 6], "bench"))
    rnd = random.Random(0)
    rows = [(1000 + i, 1.7e9 + i, True, 30 * 2**20, 40 * 2**20, 20 * 2**20, 0, None, None, True) for i in range(n)]
    per_batch = max(1, round(1 / interval))
    on_tick = packing = 0.0
    for seq in range(ticks):
        rows = [(r[0], r[1], True, rnd.randrange(1, 2**18) * 4096, *r[4:]) if i < busy else r
                for i, r in enumerate(rows)]
        t = time.perf_counter()
        rec.sample(seq, 1.7e9 + seq * interval, rows)
        on_tick += time.perf_counter() - t
        if seq % per_batch == per_batch - 1:
            raw = rec.writer.take_raw()
            t = time.perf_counter()
            pack_batch(raw, LEVEL)
            packing += time.perf_counter() - t
    return on_tick / ticks * 1e6, packing / ticks * 1e6


CHURN_MARK = "memagent-bench-churn"
CHURNER = """
import random, string, subprocess, sys, time
rnd, n = random.Random(), int(sys.argv[1])
letters = string.ascii_letters + string.digits + string.punctuation
while True:
    args = ["".join(rnd.choices(letters, k=1024)) for _ in range(n)]
    subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(1)", "MARK", *args])
    time.sleep(1 / 16)
""".replace("MARK", CHURN_MARK)


def churn_run(tmp: Path, seconds: float, interval: float, n_args: int) -> None:
    """The recorder's growth without and with the second user's churn (``--churn``)."""
    import pwd
    user = pwd.getpwnam("memagent-test")
    cfg = tmp / "memagent.toml"
    cfg.write_text(f'auto_cmdline = ["{CHURN_MARK}*"]\n[record]\nmax_bytes = "16MiB"\n')
    on, sock = daemon(tmp, "churn", interval, "--config", str(cfg))
    try:
        with fleet(100, 10) as pids:
            with Client(sock, timeout=60) as c:
                c.attach(pids)
            time.sleep(3 + interval * 2)
            a0, t0 = reading(on, sock), time.monotonic()
            time.sleep(seconds)
            a1, t1 = reading(on, sock), time.monotonic()
            alone = (a1[2] - a0[2]) / (t1 - t0) * 3600
            gen = subprocess.Popen(["/usr/bin/python3", "-S", "-c", CHURNER, str(n_args)], user=user.pw_uid,
                                   group=user.pw_gid, extra_groups=[], cwd="/", start_new_session=True)
            try:
                time.sleep(45)  # warm-up: the churner's share (1 MiB) fills
                b0, t0 = reading(on, sock), time.monotonic()
                time.sleep(seconds)
                b1, t1 = reading(on, sock), time.monotonic()
            finally:
                os.killpg(gen.pid, signal.SIGKILL)
                gen.wait(10)
            churned = (b1[2] - b0[2]) / (t1 - t0) * 3600
    finally:
        stop_daemon(on)
    print(f"  root's 100 processes (10 busy), interval {interval:g} s; the second user's churn: 16 processes/s, "
          f"{n_args} x 1 KiB arguments, 1 s each")
    print(f"  without the churn: {alone / 1e6:8.2f} MB/h")
    print(f"  with the churn:    {churned / 1e6:8.2f} MB/h (after a 45 s warm-up)")
    print(f"  root's part of what is written: {min(1.0, alone / max(churned, 1)):.1%}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--processes", type=int, default=100)
    ap.add_argument("--churn", action="store_true", help="the second user's churn against the recorder's share")
    ap.add_argument("--churn-args", type=int, default=4)
    ap.add_argument("--workers", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workers:
        workers(*args.workers)
        return 0
    if args.churn:
        with tempfile.TemporaryDirectory(prefix="memagent-record-bench-") as tmp:
            churn_run(Path(tmp), args.seconds, args.interval, args.churn_args)
        return 0
    n = args.processes
    print(f"  {n} processes, interval {args.interval:g} s, {args.seconds:g} s per workload; two daemons at once "
          "(recording, --no-record) on the same processes")
    print(f"  {'workload':<32} {'bytes/hour':>12} {'bytes/tick':>11} {'CPU/tick on':>12} {'off':>9} {'recorder':>9}"
          f" {'sample()':>9} {'zlib':>7}")
    with tempfile.TemporaryDirectory(prefix="memagent-record-bench-") as tmp:
        for title, busy in (("idle", 0), (f"mix: {max(1, n // 10)} changing every tick", max(1, n // 10)),
                            (f"busy: all {n} changing every tick", n)):
            r = measure(Path(tmp), n, busy, args.seconds, args.interval)
            per_tick = r["bytes_per_hour"] / 3600 * args.interval
            extra = r["cpu_on_us"] - r["cpu_off_us"]
            sample_us, zlib_us = timed_calls(n, busy, args.interval)
            print(f"  {title:<32} {r['bytes_per_hour'] / 1e6:>9.2f} MB {per_tick:>9.0f} B "
                  f"{r['cpu_on_us']:>9.0f} µs {r['cpu_off_us']:>6.0f} µs {extra:>+6.0f} µs"
                  f" {sample_us:>6.1f} µs {zlib_us:>4.0f} µs", flush=True)
    print("  (MB = 10^6 bytes; the aim: <= 20 MB/h for 100 processes at 0.5 s. CPU per tick on/off: each whole daemon "
          f"process, all threads, in clock ticks of 10 ms: +-{10_000 / (args.seconds / args.interval):.0f} µs here. "
          "sample(): the recorder's part of a tick; zlib: its batch's compression, in its thread, per tick)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
