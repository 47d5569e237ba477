"""Part 13: the Prometheus endpoint at 1000 watched processes (docs/metrics.md).

Two real daemons (``memagent daemon --interval 0.1``) watch the same 1000 idle processes,
one with ``--metrics 127.0.0.1:PORT`` and one without. Measured:

- **scrape time**: ``GET /metrics`` from here, one after another (median, p99, max), and
  its size; the target is 50 ms;
- **the daemon's RSS** with and without the endpoint (after 50 scrapes), and the ratio;
  then the daemon without it stops, and the timings below run with one daemon on the box;
- **tick delay**: a subscriber timestamps the sample frames (their time is the tick's
  start), giving each tick's lateness against the 0.1 s grid, in a quiet window and in a
  window where this process scrapes in a loop as fast as it can (the daemon's own tick
  histogram, ``memagent_tick_duration_seconds``, gives the tick durations of each window);
  the target is a tick delayed by at most 5 ms more than it is without scrapes;
- **the renderer**: the same 1000-process snapshot rendered by the daemon's own code
  (``memagent.metrics.exposition``) and by prometheus-client's ``generate_latest`` (the
  baseline the choice was made against), in this process, and what importing
  prometheus-client costs a fresh interpreter's RSS.

    python bench/metrics_scrape.py
"""

from __future__ import annotations

import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from fleet import Fleet, in_group, proc_cpu, proc_status_kb, stop_daemon
from tick_regularity import memagent_argv

N = 1000
INTERVAL = 0.1
WINDOW = 4.0
ROUNDS = 2
SCRAPES = 200


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read()
    finally:
        conn.close()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Daemon:
    def __init__(self, tmp: str, name: str, port: int | None) -> None:
        self.sock = os.path.join(tmp, f"{name}.sock")
        argv = [*memagent_argv(), "daemon", "--socket", self.sock, "--interval", str(INTERVAL), "--state-dir", "",
                "--no-stacks", "--no-record"] + (["--metrics", f"127.0.0.1:{port}"] if port else [])
        self.err = open(os.path.join(tmp, f"{name}.err"), "w+b")  # closed in stop()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.err, stderr=self.err,
                                     preexec_fn=in_group())

    def attach(self, pids: list[int]) -> None:
        from memagent.client import Client
        from memproto.client_side import DaemonNotRunning

        deadline = time.monotonic() + 30
        while True:
            try:
                with Client(self.sock, timeout=60) as c:
                    c.attach(pids)
                    return
            except DaemonNotRunning:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.err.seek(0)
                    raise RuntimeError(f"the daemon did not start: {self.err.read().decode()[-500:]}") from None
                time.sleep(0.05)

    def rss_mib(self) -> float:
        return float(proc_status_kb(self.proc.pid, "VmRSS")["VmRSS"]) / 1024

    def stop(self) -> None:
        stop_daemon(self.proc)
        self.err.close()


def tick_times(sock: str, seconds: float) -> list[float]:
    """The sample frames' times (each tick's start) over ``seconds``."""
    from memagent.client import Client
    from memproto.frames import Sample

    times: list[float] = []
    end = time.monotonic() + seconds
    with Client(sock, timeout=5) as c:
        c.subscribe()
        for frame in c.stream():
            if isinstance(frame, Sample):
                times.append(frame.time)
            if time.monotonic() > end:
                break
    return times


def lateness_ms(times: list[float]) -> list[float]:
    """Each tick's start against the INTERVAL grid through the window's earliest one."""
    t0 = times[0]
    off = [(t - t0) - round((t - t0) / INTERVAL) * INTERVAL for t in times]
    base = min(off)
    return [(x - base) * 1000 for x in off]


def tick_histogram(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(scrape(port).decode()):
        if family.name == "memagent_tick_duration_seconds":
            for s in family.samples:
                out[s.labels.get("le", s.name)] = s.value
    return out


def hist_line(before: dict[str, float], after: dict[str, float]) -> str:
    count = after["memagent_tick_duration_seconds_count"] - before["memagent_tick_duration_seconds_count"]
    mean = (after["memagent_tick_duration_seconds_sum"] - before["memagent_tick_duration_seconds_sum"]) / max(count, 1)
    bounds = [k for k in after if k[0].isdigit()]
    p99 = next((b for b in bounds if after[b] - before[b] >= 0.99 * count), "+Inf")
    return f"{count:.0f} ticks, mean duration {mean * 1000:.2f} ms, p99 <= {float(p99) * 1000:g} ms (histogram bucket)"


def window(sock: str, port: int, pid: int, scraping: bool) -> tuple[list[float], list[float], str, float]:
    stop = threading.Event()
    durations: list[float] = []

    def loop() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            scrape(port)
            durations.append(time.perf_counter() - t0)

    before = tick_histogram(port)
    cpu = proc_cpu(pid)
    thread = threading.Thread(target=loop, daemon=True) if scraping else None
    if thread is not None:
        thread.start()
    try:
        late = lateness_ms(tick_times(sock, WINDOW))
    finally:
        stop.set()
        if thread is not None:
            thread.join(15)
    cpu = proc_cpu(pid) - cpu
    return late, durations, hist_line(before, tick_histogram(port)), cpu


def held_lines(pids: list[int]) -> list[str]:
    """In this process, an agent watching the same processes: how long each piece of a
    scrape's work holds the event loop between two chances for the tick to run (taking the
    snapshot, then each chunk of the rendering): the most a scrape can delay a tick by."""
    from memagent.agent import Agent
    from memagent.config import AgentConfig
    from memagent.metrics.exposition import render

    with tempfile.TemporaryDirectory(prefix="memagent-bench-held-") as tmp:
        agent = Agent(AgentConfig(socket=os.path.join(tmp, "s"), interval=INTERVAL, gpu=False))
        for pid in pids:
            agent.registry.attach(pid)
        agent.on_tick(time.time())
        source = agent.metrics.source
        takes, pieces, totals = [], [], []
        for _ in range(50):
            t0 = time.perf_counter()
            snap = source.take(time.time())
            t1 = last = time.perf_counter()
            takes.append(t1 - t0)
            for _chunk in render(snap):
                now = time.perf_counter()
                pieces.append(now - last)
                last = now
            totals.append(last - t0)
        agent.registry.close()
    ms = lambda xs: (f"median {statistics.median(xs) * 1000:.2f} ms, p99 {pct(xs, 0.99) * 1000:.2f}, "  # noqa: E731
                     f"max {max(xs) * 1000:.2f}")
    return [f"  one scrape's work on the event loop, in-process over the same {len(pids)} processes, 50 times: "
            f"snapshot {ms(takes)}; each rendered chunk {ms(pieces)}; whole {ms(totals)}. The tick waits at most "
            f"for the piece under way (pieces start only when the tick is more than 5 ms away)"]


def renderer_lines() -> list[str]:
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from memagent.core.histogram import Histogram
    from memagent.metrics.exposition import PROCESS_FAMILIES, render_text
    from memagent.metrics.snapshot import HeadroomFigures, MetricsSnapshot, ProcessFigures, TickFigures

    h = Histogram()
    rows = tuple(ProcessFigures(10_000 + i, f"python{i % 10}", f"label{i % 5}", (100 + i) << 20, (200 + i) << 20,
                                None, None, 0.0, True) for i in range(N))
    host = HeadroomFigures("host", "host memory", 1 << 30, 1 << 34, 1 / 16)
    snap = MetricsSnapshot(False, rows, (host,), (), 0.9, (), (), N, TickFigures(h.bounds, h.cumulative(), 0, 0.0), 0)

    class Collector:
        def collect(self) -> list[GaugeMetricFamily]:
            fams = []
            for name, help_text, figure in PROCESS_FAMILIES:
                g = GaugeMetricFamily(name, help_text, labels=["pid", "name", "label"])
                for r in rows:
                    v = figure(r)
                    if v is not None:
                        g.add_metric([str(r.pid), r.name, r.label], v)
                fams.append(g)
            return fams

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())  # type: ignore[arg-type]

    def timed(fn: object) -> float:
        runs = []
        for _ in range(15):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs) * 1000

    ours, theirs = timed(lambda: render_text(snap)), timed(lambda: generate_latest(registry))
    ours_om = timed(lambda: render_text(snap, True))
    base = "import asyncio, memagent.agent"
    code = "import sys; print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
    rss = [int(subprocess.run([sys.executable, "-c", f"{imp}; {code}"], capture_output=True, text=True,
                              check=True).stdout) for imp in (base, f"{base}, prometheus_client")]
    return [
        f"  renderer, same {N}-process snapshot, median of 15: memagent.metrics.exposition {ours:.1f} ms "
        f"(OpenMetrics {ours_om:.1f} ms); prometheus-client generate_latest {theirs:.1f} ms "
        f"= {theirs / ours:.0f}x ours",
        f"  importing prometheus-client: +{(rss[1] - rss[0]) / 1024:.1f} MiB RSS ({rss[0] / 1024:.1f} -> "
        f"{rss[1] / 1024:.1f} MiB in a fresh interpreter with the agent imported)",
    ]


def main() -> None:
    from memagent.agent import raise_fd_limit

    raise_fd_limit()
    out = [f"metrics endpoint: 2 real daemons, {N} idle watched processes, interval {INTERVAL:g} s, "
           f"no stacks, no recorder"]
    with Fleet(N) as fleet, tempfile.TemporaryDirectory(prefix="memagent-bench-metrics-") as tmp:
        port = free_port()
        daemons = [Daemon(tmp, "with", port), Daemon(tmp, "without", None)]
        try:
            for d in daemons:
                d.attach(fleet.pids)
            for _ in range(50):  # what serving costs the daemon's memory, after some scrapes
                scrape(port)
            with_rss, without_rss = daemons[0].rss_mib(), daemons[1].rss_mib()
            daemons.pop().stop()  # the timings with one daemon on the box
            times, size = [], 0
            for _ in range(SCRAPES):
                t0 = time.perf_counter()
                size = len(scrape(port))
                times.append(time.perf_counter() - t0)
            ms = [t * 1000 for t in times]
            verdict = "PASS" if pct(ms, 0.99) <= 50 else "MISS"
            out.append(f"  scrape GET /metrics, {SCRAPES} in a row: median {statistics.median(ms):.1f} ms, "
                       f"p99 {pct(ms, 0.99):.1f} ms, max {max(ms):.1f} ms, {size / 1024:.0f} KiB; "
                       f"target p99 <= 50 ms: {verdict}")
            quiet, busy, during, quiet_hist, busy_hist = [], [], [], [], []
            cpu_quiet = cpu_busy = 0.0
            for _ in range(ROUNDS):  # interleaved: the box's other load falls on both alike
                late, _, hist, cpu = window(daemons[0].sock, port, daemons[0].proc.pid, scraping=False)
                quiet += late
                quiet_hist.append(hist)
                cpu_quiet += cpu
                late, durations, hist, cpu = window(daemons[0].sock, port, daemons[0].proc.pid, scraping=True)
                busy += late
                during += durations
                busy_hist.append(hist)
                cpu_busy += cpu
        finally:
            for d in daemons:
                d.stop()
        held = held_lines(fleet.pids)
    out.append(f"  daemon RSS after 50 scrapes: with --metrics {with_rss:.1f} MiB, without {without_rss:.1f} MiB: "
               f"ratio {with_rss / without_rss:.3f} ({with_rss - without_rss:+.1f} MiB; part 4 has the absolute "
               f"figure against the 30 MB target, with full history)")
    for label, late, hists in (("no scrapes", quiet, quiet_hist), ("scraping in a loop", busy, busy_hist)):
        out.append(f"  tick lateness, {label:<18} {len(late)} ticks in {ROUNDS} windows of {WINDOW:g} s: median "
                   f"{statistics.median(late):.2f} ms, p99 {pct(late, 0.99):.2f} ms, max {max(late):.2f} ms")
        out += [f"    tick durations, window {i + 1}: {h}" for i, h in enumerate(hists)]
    delay = max(busy) - max(quiet)
    out.append(f"  scrapes during the busy windows: {len(during)}, median {statistics.median(during) * 1000:.1f} ms; "
               f"tick delay added by scraping: max {delay:+.2f} ms, p99 {pct(busy, 0.99) - pct(quiet, 0.99):+.2f} ms "
               f"(busy - quiet, whatever the cause: the box's other load too); target max <= 5 ms: "
               f"{'PASS' if delay <= 5 else 'MISS'}")
    out.append(f"  the daemon's CPU per scrape (busy windows minus quiet ones, /proc/PID/stat): "
               f"{(cpu_busy - cpu_quiet) / max(len(during), 1) * 1000:.2f} ms")
    out += held
    out += renderer_lines()
    print("\n".join(out))


if __name__ == "__main__":
    main()
