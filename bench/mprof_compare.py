"""memagent against the anchor, memory_profiler's ``mprof run`` (0.1 s), on one spiky workload.

Each run starts ``bench/spiky_workload.py`` under ``mprof run --interval 0.1`` and attaches a
private memagent daemon (interval 0.5 s, flight recorder on) to the same process before it
starts allocating. The workload's own ``VmHWM`` at its end is the truth. Printed per run:
the peak each tool reports and its error, and how many of the spikes mprof's samples saw.
Then both plots are written side by side into the output folder (not committed):
``mprof.png`` (``mprof plot``) and ``memagent.png`` / ``memagent.html`` (``memagent plot``
of the daemon's recording), plus ``report.json`` (``memagent report --json``).

    python bench/mprof_compare.py [--runs 5] [--seconds 12] [--out bench/out/mprof]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fleet import die_with_parent, in_group, stop_daemon, wait_listening

HERE = Path(__file__).resolve().parent
WORKLOAD = str(HERE / "spiky_workload.py")
MiB = 1024 * 1024
BIN = Path(sys.executable).parent


def mprof_series(dat: Path) -> list[tuple[float, float]]:
    """(time, MiB) of an ``mprof run`` output file."""
    out = []
    for line in dat.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["MEM"]:
            out.append((float(parts[2]), float(parts[1])))
    return out


def one_run(n: int, args: argparse.Namespace, sock: str, out: Path) -> dict[str, object]:
    from memagent.client import Client

    truth_file, dat = out / f"truth-{n}.json", out / f"mprof-{n}.dat"
    mprof = subprocess.Popen(
        [str(BIN / "mprof"), "run", "--interval", "0.1", "--output", str(dat), sys.executable, WORKLOAD,
         "--out", str(truth_file), "--seconds", str(args.seconds), "--seed", str(n)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    assert mprof.stdin is not None and mprof.stdout is not None
    pid = 0
    for line in mprof.stdout:
        if line.startswith("pid "):
            pid = int(line.split()[1])
            break
    if not pid:
        raise SystemExit(f"the workload did not start (mprof exit status {mprof.wait()})")
    with Client(sock) as client:
        client.attach([pid], f"spiky-{n}", False)
    mprof.stdin.write("go\n")
    mprof.stdin.close()
    mprof.wait(args.seconds + 60)
    truth = json.loads(truth_file.read_text())
    deadline = time.time() + 10
    peak = None
    while time.time() < deadline:  # the daemon hears the exit at its next tick
        with Client(sock) as client:
            info = next((p for p in client.list() if p.pid == pid), None)
        if info is not None and not info.alive:
            peak = info
            break
        time.sleep(0.2)
    if peak is None:
        raise SystemExit(f"the daemon did not see {pid} exit")
    series = mprof_series(dat)
    base = args.base * MiB
    seen = 0
    for s in truth["spikes"]:  # a spike is seen when a sample inside it shows it (half its size above the base)
        t0, t1 = s["time"], s["time"] + s["held"]
        if any(t0 <= t <= t1 + 0.01 and v * MiB > base + s["mib"] * MiB / 2 for t, v in series):
            seen += 1
    hwm = truth["vm_hwm_kb"] * 1024
    mprof_peak = max(v for _, v in series) * MiB if series else 0
    return {"run": n, "pid": pid, "vm_hwm": hwm, "memagent": peak.rss_peak_bytes, "exact": peak.rss_peak_exact,
            "mprof": int(mprof_peak), "spikes": len(truth["spikes"]), "seen": seen, "samples": len(series)}


def err(v: int, truth: int) -> str:
    return f"{100.0 * (v - truth) / truth:+.1f} %"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--base", type=int, default=80, help="the workload's base MiB")
    p.add_argument("--out", default=str(HERE / "out" / "mprof"))
    args = p.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    (out / "state").mkdir(parents=True, mode=0o700)
    sock = str(out / "d.sock")
    daemon = subprocess.Popen([sys.executable, "-m", "memagent.cli.main", "daemon", "--socket", sock,
                               "--state-dir", str(out / "state"), "--interval", "0.5"],
                              stderr=subprocess.PIPE, text=True, preexec_fn=in_group())
    results = []
    try:
        wait_listening(daemon)
        for n in range(1, args.runs + 1):
            results.append(one_run(n, args, sock, out))
    finally:
        stop_daemon(daemon)
    print(f"spiky workload: base {args.base} MiB, spikes of 64-256 MiB held 5-30 ms every ~0.5 s, "
          f"{args.seconds:g} s; truth = the process's own VmHWM at its end")
    print(f"{'run':>3} {'VmHWM':>10} {'memagent 0.5 s':>16} {'err':>8} {'mprof 0.1 s':>12} {'err':>8} "
          f"{'spikes seen by mprof':>21}")
    for r in results:
        hwm = int(r["vm_hwm"])  # type: ignore[call-overload]
        print(f"{r['run']:>3} {hwm / MiB:>7.1f} MiB {int(r['memagent']) / MiB:>12.1f} MiB "  # type: ignore[call-overload]
              f"{err(int(r['memagent']), hwm):>8} {int(r['mprof']) / MiB:>8.1f} MiB "  # type: ignore[call-overload]
              f"{err(int(r['mprof']), hwm):>8} {r['seen']:>12} of {r['spikes']}")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    first = results[0]
    cli = [sys.executable, "-m", "memagent.cli.main"]
    record = str(out / "state" / "record")
    steps = [
        ([str(BIN / "mprof"), "plot", "--output", str(out / "mprof.png"), str(out / "mprof-1.dat")], "mprof.png"),
        ([*cli, "plot", record, "--pid", str(first["pid"]), "-o", str(out / "memagent.png")], "memagent.png"),
        ([*cli, "plot", record, "-o", str(out / "memagent.html")], "memagent.html"),
        ([*cli, "report", record, "--json"], "report.json"),
    ]
    for argv, name in steps:
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
        if name.endswith(".json") and done.returncode == 0:
            (out / name).write_text(done.stdout)
        print(f"{name}: {'written' if done.returncode == 0 else 'FAILED: ' + (done.stderr.strip() or '?')[:200]}")
    print(f"output: {out}")


if __name__ == "__main__":
    main()
