"""A small fleet whose two bounds differ (issue 30, docs/headroom.md "Two bounds"): a real
daemon (its state directory and flight recorder in a temporary directory, ``[host]
capacity`` configured) watches three model-like services whose peaks take turns and never
meet, then two of them peak together once; the script prints ``memagent status``'s two
bounds, ``memagent admit`` on each basis, ``memagent report`` of the recording, and writes
a plot of it.

Run: ``PYTHONPATH=agent:protocol:tui .venv/bin/python bench/observed_demo.py [OUT.html|OUT.png]``
(default ``observed_demo.html`` in the current directory). As root or not: the daemon
runs on a private socket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20
#: name, MiB at its peak (over a 20 MiB idle).
SERVICES = (("llama", 300), ("bert", 200), ("whisper", 150))
CAPACITY_MIB = 600
SERVICE = """
import sys
held = []
sys.stdout.write("ready\\n"); sys.stdout.flush()
for line in sys.stdin:
    if line.startswith("peak"):
        held.append(bytearray(b"x") * (int(line.split()[1]) << 20))
    else:
        held.clear()
    sys.stdout.write("ok\\n"); sys.stdout.flush()
"""


def cli(sock: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memagent.cli", "--socket", sock, *args],
                          capture_output=True, text=True, timeout=60)


def host(sock: str) -> dict[str, object]:
    for _ in range(200):
        status = json.loads(cli(sock, "status", "--json").stdout)
        found = next((h for h in status["headroom"] if h["resource"] == "host"), None)
        if found is not None and found.get("sum_now_bytes") is not None:
            return found  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise SystemExit("the daemon reported no host headroom")


def tell(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    proc.stdout.readline()
    time.sleep(1.5)  # several ticks at the peak, and a headroom snapshot


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "observed_demo.html").resolve()
    root = Path(tempfile.mkdtemp(prefix="memagent-observed-"))
    os.chmod(root, 0o700)
    sock, state = str(root / "demo.sock"), root / "state"
    (root / "memagent.toml").write_text(f'[host]\ncapacity = "{CAPACITY_MIB}MiB"\n')
    daemon = subprocess.Popen([sys.executable, "-m", "memagent.cli", "daemon", "--socket", sock, "--interval", "0.1",
                               "--state-dir", str(state), "--config", str(root / "memagent.toml")],
                              stderr=subprocess.DEVNULL)
    services: list[subprocess.Popen[str]] = []
    try:
        while not os.path.exists(sock):
            time.sleep(0.05)
        for name, _ in SERVICES:
            p = subprocess.Popen([sys.executable, "-c", SERVICE, name], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout is not None
            p.stdout.readline()
            services.append(p)
            cli(sock, "attach", str(p.pid), "--label", name)
        host(sock)
        time.sleep(1.0)
        for p, (_, mib) in zip(services, SERVICES, strict=True):  # take turns: the peaks never meet
            tell(p, f"peak {mib}")
            tell(p, "idle")
        h = host(sock)
        print(f"apart:    Σ peaks {h['sum_peaks_bytes'] // MiB} MiB, seen together "  # type: ignore[operator]
              f"{h['observed_sum_max_bytes'] // MiB} MiB, capacity {CAPACITY_MIB} MiB")  # type: ignore[operator]
        need = f"{CAPACITY_MIB - 350}MiB"
        for basis in ("worst-case", "observed"):
            r = cli(sock, "admit", "--rss", need, "--basis", basis)
            print(f"$ memagent admit --rss {need} --basis {basis}  (exit {r.returncode})\n{r.stdout}", end="")
        for p, (_, mib) in list(zip(services, SERVICES, strict=True))[:2]:  # two of them at once
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(f"peak {mib}\n")
            p.stdin.flush()
            p.stdout.readline()
        time.sleep(1.5)
        for p in services[:2]:
            tell(p, "idle")
        h = host(sock)
        print(f"together: Σ peaks {h['sum_peaks_bytes'] // MiB} MiB, seen together "  # type: ignore[operator]
              f"{h['observed_sum_max_bytes'] // MiB} MiB")  # type: ignore[operator]
        time.sleep(2.0)  # the recorder's last batch on disk
        record = str(state / "record")
        print(f"$ memagent report {record}\n" + cli(sock, "report", record).stdout, end="")
        r = cli(sock, "plot", record, "-o", str(out))
        print(f"$ memagent plot {record} -o {out}  (exit {r.returncode}) {r.stderr.strip()}")
    finally:
        for p in services:
            p.kill()
            p.wait()
        daemon.terminate()
        daemon.wait(10)


if __name__ == "__main__":
    main()
