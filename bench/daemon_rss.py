"""Part 4: the daemon's own memory at 1000 watched processes with full history.

Full history is 600 one-second slots per process; rather than running for 10 minutes,
a daemon process of its own (this file run as a script: an :class:`~memagent.agent.Agent`
with ``history_seconds=600, history_step=1.0`` serving its socket exactly like
``memagent daemon``) attaches the processes, then fills every ring buffer with 600
slots of the past 600 seconds, then serves and ticks normally. The benchmark process
subscribes to it, reads a few sample frames, and reads the daemon's ``VmRSS``/``VmHWM``
from ``/proc/PID/status``; then it asks for the full history of every process (the
largest reply the daemon builds) and reads them again.

Three daemons, to show what history costs: filled 600 s history; 600 s history
allocated but not filled (what the daemon holds right after attaching); 1-slot history.

    python bench/daemon_rss.py --child --socket S --pids-file F --history 600 [--fill]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and "--child" in sys.argv:
    # Measure the daemon as `memagent daemon` runs it: without asyncio's ssl import.
    from memagent.daemon import skip_tls_import

    skip_tls_import()

import argparse
import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from fleet import in_group, proc_status_kb, stop_daemon

TARGET_MB = 30.0
HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


# --------------------------------------------------------------------------- child


def _stage(name: str, **extra: object) -> None:
    print(json.dumps({"stage": name, **proc_status_kb("self", *KEYS), **extra}), flush=True)


def child_main(args: argparse.Namespace) -> None:
    from memagent.agent import Agent, raise_fd_limit
    from memagent.config import AgentConfig
    from memproto.series import PeakSeries

    raise_fd_limit()
    with open(args.pids_file) as f:
        pids = [int(x) for x in f.read().split()]
    agent = Agent(AgentConfig(socket=args.socket, interval=args.interval,
                              history_seconds=args.history, history_step=1.0))
    _stage("agent built (imports, no process)")
    t0 = time.perf_counter()
    for pid in pids:
        agent.registry.attach(pid)
    _stage("attached", processes=len(agent.registry.alive), seconds=time.perf_counter() - t0)
    if args.fill:
        reg = agent.registry
        start = time.time() - reg.history_slots * reg.history_step - 1.0
        t0 = time.perf_counter()
        for w in reg.alive:
            # A fresh ring (attach already wrote "now" into the old one, and history never
            # goes back in time), filled slot by slot with the past history_slots seconds.
            w.history = PeakSeries(reg.history_step, reg.history_slots)
            for i in range(reg.history_slots):
                w.history.add(start + i * reg.history_step, w.rss)
        full = all(len(w.history) == reg.history_slots for w in reg.alive)
        _stage("history filled", slots=reg.history_slots, full=full, seconds=time.perf_counter() - t0)

    async def time_history() -> None:
        """On the daemon's loop: what answering a full history request costs it (the
        request is now served in slices between ticks: build_ms is wall time, ticks included)."""
        from memagent.serve.access import Access, Peer
        from memproto import encode, frame_bytes
        from memproto.frames import History

        class Admin:
            access = Access(Peer(os.getpid(), 0, 0), True)

        t0 = time.perf_counter()
        reply = await agent.dispatcher.history(Admin(), History(0, [], None))  # type: ignore[arg-type]
        t1 = time.perf_counter()
        # Large replies come already encoded (series by series), others as frames.
        data = frame_bytes(reply if isinstance(reply, bytes) else encode(reply))
        t2 = time.perf_counter()
        print(json.dumps({"build_ms": (t1 - t0) * 1000, "encode_ms": (t2 - t1) * 1000, "bytes": len(data)}),
              flush=True)

    pending: set[asyncio.Future[None]] = set()

    def on_stdin() -> None:
        line = sys.stdin.readline()
        if line.strip() == "time-history":
            pending.add(asyncio.ensure_future(time_history()))

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_reader(sys.stdin.fileno(), on_stdin)
        ready = asyncio.Event()
        task = asyncio.ensure_future(agent.run(stop, ready))
        await ready.wait()
        print(json.dumps({"stage": "ready"}), flush=True)
        await task

    asyncio.run(serve())


# --------------------------------------------------------------------------- parent


@dataclass
class RssResult:
    label: str
    history_seconds: float
    fill: bool
    stages: list[dict[str, object]] = field(default_factory=list)
    steady: dict[str, int] = field(default_factory=dict)
    after_history: dict[str, int] = field(default_factory=dict)
    history_request_s: float = 0.0
    history_values: int = 0
    history_series: int = 0
    #: Daemon-side cost of the full history reply, timed inside the daemon afterwards.
    history_timing: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _readline(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError("daemon child did not answer in time")
    line = proc.stdout.readline().decode()
    if not line:
        raise RuntimeError(f"daemon child exited (rc {proc.wait()})")
    return line


def measure_one(pids: list[int], tmpdir: str, label: str, history: float, fill: bool,
                interval: float = 0.5, frames: int = 3) -> RssResult:
    from memagent.client import Client
    from memproto.frames import Sample

    res = RssResult(label, history, fill)
    sock = os.path.join(tmpdir, f"rss-{history:g}-{int(fill)}.sock")
    pids_file = os.path.join(tmpdir, "pids.txt")
    with open(pids_file, "w") as f:
        f.write(" ".join(map(str, pids)))
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--socket", sock, "--pids-file", pids_file,
            "--history", str(history), "--interval", str(interval)] + (["--fill"] if fill else [])
    err = open(os.path.join(tmpdir, f"rss-{history:g}-{int(fill)}.err"), "w+b")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.PIPE,
                            preexec_fn=in_group())
    try:
        while True:
            stage = json.loads(_readline(proc, 60))
            if stage["stage"] == "ready":
                break
            res.stages.append(stage)
        with Client(sock, timeout=30) as c:
            c.subscribe()
            seen = 0
            for frame in c.stream():
                if isinstance(frame, Sample):
                    seen += 1
                    if seen >= frames:
                        break
            res.steady = proc_status_kb(proc.pid, *KEYS)
            t0 = time.perf_counter()
            reply = c.history()
            res.history_request_s = time.perf_counter() - t0
            res.history_series = len(reply.series)
            res.history_values = sum(len(s.rss_bytes) for s in reply.series)
            # One more tick after the reply, so the reading is not mid-reply.
            for frame in c.stream():
                if isinstance(frame, Sample):
                    break
            res.after_history = proc_status_kb(proc.pid, *KEYS)
        # Ask the daemon to time, on its loop, what it just did to answer that request.
        assert proc.stdin is not None
        proc.stdin.write(b"time-history\n")
        proc.stdin.flush()
        res.history_timing = json.loads(_readline(proc, 60))
    except Exception as exc:  # noqa: BLE001 - report and go on with the other parts
        err.seek(0)
        res.error = f"{exc.__class__.__name__}: {exc}; stderr: {err.read().decode()[-500:]}"
    finally:
        stop_daemon(proc)
        err.close()
    return res


VARIANTS = (
    ("600 s history, filled (600 slots)", 600.0, True),
    ("600 s history, not filled", 600.0, False),
    ("1 s history (1 slot)", 1.0, False),
)


def measure(pids: list[int]) -> list[RssResult]:
    with tempfile.TemporaryDirectory(prefix="memagent-bench-rss-") as tmp:
        return [measure_one(pids, tmp, label, history, fill) for label, history, fill in VARIANTS]


def _mb(kb: object) -> str:
    return f"{int(kb) / 1024:6.1f}" if isinstance(kb, int) else "     ?"  # MiB


def report(results: list[RssResult], n: int) -> list[str]:
    out = [f"daemon memory, {n} watched processes, interval 0.5 s, 1 subscriber; MiB "
           f"(VmRSS / VmHWM = peak so far)"]
    for r in results:
        out.append(f"  {r.label}:")
        if r.error:
            out.append(f"    ERROR {r.error}")
            continue
        for s in r.stages:
            extra = ""
            if "seconds" in s:
                extra = f"  ({s['seconds']:.2f} s)"
            if "full" in s:
                extra += f"  all rings full: {s['full']}"
            out.append(f"    {s['stage']:<38} rss {_mb(s.get('VmRSS'))}  hwm {_mb(s.get('VmHWM'))}{extra}")
        out.append(f"    {'serving, ticking':<38} rss {_mb(r.steady.get('VmRSS'))}  hwm {_mb(r.steady.get('VmHWM'))}"
                   f"  (anon {_mb(r.steady.get('RssAnon'))}, file {_mb(r.steady.get('RssFile'))})")
        out.append(f"    {'after a full history request':<38} rss {_mb(r.after_history.get('VmRSS'))}  "
                   f"hwm {_mb(r.after_history.get('VmHWM'))}  (reply: {r.history_series} series, "
                   f"{r.history_values} values, {r.history_request_s * 1000:.0f} ms round trip)")
        h = r.history_timing
        if h:
            out.append(f"    {'':<38} in the daemon: Dispatcher.history {h['build_ms']:.0f} ms + encode "
                       f"{h['encode_ms']:.0f} ms = {h['build_ms'] + h['encode_ms']:.0f} ms on the tick loop, "
                       f"{h['bytes'] / 1e6:.1f} MB frame")
    full = results[0]
    if not full.error and results[2].error is None:
        cost = (full.steady["VmRSS"] - results[2].steady["VmRSS"]) / 1024
        out.append(f"  history cost (filled 600 s minus 1 slot, serving): {cost:.1f} MiB "
                   f"= {cost * 1024 * 1024 / n / 600:.1f} B per slot")
    if full.error:
        out.append(f"target: <= {TARGET_MB:g} MB daemon RSS at {n} processes with full history: MISS (no measurement)")
    else:
        rss = full.steady["VmRSS"] / 1024
        hwm = full.after_history["VmHWM"] / 1024
        verdict = "PASS" if rss <= TARGET_MB else "MISS"
        out.append(f"target: <= {TARGET_MB:g} MB daemon RSS at {n} processes with full history: {verdict} "
                   f"(VmRSS {rss:.1f} MiB serving; peak VmHWM {hwm:.1f} MiB incl. a full history request: "
                   f"{'within' if hwm <= TARGET_MB else 'OVER'})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--socket")
    parser.add_argument("--pids-file")
    parser.add_argument("--history", type=float, default=600.0)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--fill", action="store_true")
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    from fleet import Fleet

    from memagent.agent import raise_fd_limit

    raise_fd_limit()
    with Fleet(1000) as fleet:
        results = measure(fleet.pids)
    print("\n".join(report(results, 1000)))


if __name__ == "__main__":
    main()
