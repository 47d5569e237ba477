"""Part 5: tick regularity of the real daemon at 1000 watched processes, interval 0.1 s.

Starts ``memagent daemon --socket TMP --interval 0.1 --history 600`` (the installed
command), attaches the processes with one ``attach`` request, subscribes (one subscriber
thread here that timestamps each sample frame), runs ~10 s, and prints the daemon's tick
statistics from ``memagent status --json`` twice: right after the attach and at the end.
The daemon's statistics are cumulative since it started, so they include the attach
request (which runs on the daemon's loop); the subscriber's own timing of the sample
frames covers only the steady 10 s.

    python bench/tick_regularity.py
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fleet import in_group, proc_status_kb, stop_daemon

INTERVAL = 0.1
SECONDS = 10.0


def memagent_argv() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "memagent")
    if os.access(exe, os.X_OK):
        return [exe]
    found = shutil.which("memagent")
    return [found] if found else [sys.executable, "-m", "memagent.cli"]


@dataclass
class TickResult:
    attach_s: float = 0.0
    attached: int = 0
    status_after_attach: dict[str, Any] = field(default_factory=dict)
    status_end: dict[str, Any] = field(default_factory=dict)
    window_s: float = 0.0
    frame_gaps: list[float] = field(default_factory=list)
    frame_lag: list[float] = field(default_factory=list)
    dropped: int = 0
    rss_kb: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    command: str = ""


def _status(sock: str) -> dict[str, Any]:
    out = subprocess.run([*memagent_argv(), "status", "--socket", sock, "--json"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode not in (0, 4, 5):  # 4, 5: an alert is firing (status as a health check)
        raise subprocess.CalledProcessError(out.returncode, out.args, out.stdout, out.stderr)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def measure(pids: list[int], seconds: float = SECONDS) -> TickResult:
    from memagent.client import Client
    from memproto.client_side import DaemonNotRunning
    from memproto.frames import Dropped, Sample

    res = TickResult()
    tmp = tempfile.mkdtemp(prefix="memagent-bench-tick-")
    sock = os.path.join(tmp, "d.sock")
    argv = [*memagent_argv(), "daemon", "--socket", sock, "--interval", str(INTERVAL), "--history", "600"]
    res.command = " ".join(argv)
    err = open(os.path.join(tmp, "daemon.err"), "w+b")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                            preexec_fn=in_group())
    stop = threading.Event()
    reader: threading.Thread | None = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                control = Client(sock, timeout=60)
                break
            except DaemonNotRunning:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the daemon did not start") from None
                time.sleep(0.05)
        with control:
            t0 = time.perf_counter()
            reply = control.attach(pids)
            res.attach_s = time.perf_counter() - t0
            res.attached = len(reply.attached)
        res.status_after_attach = _status(sock)

        times: list[tuple[float, float]] = []  # (frame time, received at)

        def read() -> None:
            with Client(sock, timeout=5) as c:
                c.subscribe()
                for frame in c.stream():
                    if stop.is_set():
                        return
                    if isinstance(frame, Sample):
                        times.append((frame.time, time.time()))
                    elif isinstance(frame, Dropped):
                        res.dropped = frame.count

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        t0 = time.monotonic()
        time.sleep(seconds)
        res.window_s = time.monotonic() - t0
        res.status_end = _status(sock)
        res.rss_kb = proc_status_kb(proc.pid, "VmRSS", "VmHWM")
        stop.set()
        reader.join(2)
        ts = [t for t, _ in times]
        res.frame_gaps = [b - a for a, b in itertools.pairwise(ts)]
        res.frame_lag = [recv - t for t, recv in times]
    except Exception as exc:  # noqa: BLE001 - report and go on
        err.seek(0)
        res.error = f"{exc.__class__.__name__}: {exc}; daemon stderr: {err.read().decode()[-500:]}"
    finally:
        stop.set()
        stop_daemon(proc)
        err.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _tick_line(label: str, status: dict[str, Any]) -> str:
    t = status.get("tick", {})
    return (f"  {label:<22} ticks {t.get('ticks', 0):5d}  mean_interval {t.get('mean_interval', 0) * 1000:7.2f} ms  "
            f"max_lateness {t.get('max_lateness', 0) * 1000:7.2f} ms  overruns {t.get('overruns', 0):3d}  "
            f"last_duration {t.get('last_duration', 0) * 1000:6.2f} ms")


def report(r: TickResult, n: int) -> list[str]:
    out = [f"tick regularity: real daemon, {n} watched processes, interval {INTERVAL:g} s, 1 subscriber, "
           f"{SECONDS:g} s", f"  daemon: {r.command}"]
    if r.error:
        return [*out, f"  ERROR {r.error}"]
    out += [
        f"  attach request for {n} PIDs: {r.attached} attached in {r.attach_s * 1000:.0f} ms "
        "(one request: the daemon's loop does nothing else meanwhile)",
        "  memagent status --json, tick (cumulative since the daemon started):",
        _tick_line("after the attach", r.status_after_attach),
        _tick_line(f"after {r.window_s:.0f} s more", r.status_end),
    ]
    a, b = r.status_after_attach.get("tick", {}), r.status_end.get("tick", {})
    if a and b:
        ticks = b["ticks"] - a["ticks"]
        out.append(f"  during the {r.window_s:.1f} s window: {ticks} ticks "
                   f"({r.window_s / max(ticks, 1) * 1000:.2f} ms apart on average), "
                   f"{b['overruns'] - a['overruns']} overruns")
    if r.frame_gaps:
        gaps = sorted(r.frame_gaps)
        lag = sorted(r.frame_lag)
        p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
        out.append(f"  subscriber: {len(gaps) + 1} sample frames, gap between frame times: mean "
                   f"{statistics.fmean(gaps) * 1000:.2f} ms, min {gaps[0] * 1000:.2f}, p99 {p99 * 1000:.2f}, "
                   f"max {gaps[-1] * 1000:.2f} ms; tick start to decoded here: "
                   f"median {statistics.median(lag) * 1000:.2f} ms, "
                   f"max {lag[-1] * 1000:.2f} ms (incl. this client's validating decode); dropped {r.dropped}")
    if r.rss_kb:
        out.append(f"  daemon after the run: VmRSS {r.rss_kb['VmRSS'] / 1024:.1f} MiB, "
                   f"VmHWM {r.rss_kb['VmHWM'] / 1024:.1f} MiB (history only {SECONDS:g} s deep)")
    return out


def main() -> None:
    from fleet import Fleet

    from memagent.agent import raise_fd_limit

    raise_fd_limit()
    with Fleet(1000) as fleet:
        r = measure(fleet.pids)
    print("\n".join(report(r, 1000)))


if __name__ == "__main__":
    main()
