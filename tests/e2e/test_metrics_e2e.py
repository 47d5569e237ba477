"""The metrics endpoint and textfile of a real daemon (docs/metrics.md): what a scrape
says is what ``memagent status --json`` and ``ls --json`` say; the textfile; exited
processes leaving; aggregation by label; bad settings and hostile clients."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Daemon, Target, as_user, free_port, memagent_cli, poll, scrape
from fakes.fakenvml import FakeGpuState, nvml_env
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from memproto.version import PROTOCOL_MAJOR, PROTOCOL_MINOR

MiB = 1024 * 1024
#: A tick later than this means something held the daemon's loop (as in test_security_requests).
ON_TIME = 0.25
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str, openmetrics: bool = False) -> Samples:
    families = parse_openmetrics(text) if openmetrics else parse_text(text)
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def key(metric: str, /, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return metric, frozenset(labels.items())


def cli_json(d: Daemon, command: str) -> Any:
    out = memagent_cli("--socket", d.socket, command, "--json")
    assert out.returncode in (0, 4, 5), out.stderr  # status: 4/5 when an alert fires
    return json.loads(out.stdout)


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "memagent.toml"
    path.write_text(text)
    return str(path)


def attach(d: Daemon, t: Target, label: str) -> None:
    out = memagent_cli("--socket", d.socket, "attach", str(t.pid), "--label", label)
    assert out.returncode == 0, out.stderr


def test_a_scrape_says_what_status_and_ls_say(start_daemon: Callable[..., Daemon],
                                              make_target: Callable[..., Target]) -> None:
    port = free_port()
    d = start_daemon("--interval", "0.1", "--metrics", f"127.0.0.1:{port}")
    t = make_target()
    t.do("alloc 64")
    attach(d, t, "m16")

    def agree() -> bool:
        body = scrape(port)[2]
        ls, st = cli_json(d, "ls"), cli_json(d, "status")  # read after: counters only grow
        got = samples(body)
        proc = next(p for p in ls if p["pid"] == t.pid)
        host = next(h for h in st["headroom"] if h["resource"] == "host")
        series = {"pid": str(t.pid), "name": proc["name"], "label": "m16"}
        return (proc["rss_peak_bytes"] >= 64 * MiB
                and got.get(key("memagent_process_rss_peak_bytes", **series)) == proc["rss_peak_bytes"]
                and got.get(key("memagent_process_rss_bytes", **series)) == proc["rss_bytes"]
                and got.get(key("memagent_process_peak_exact", **series)) == int(proc["rss_peak_exact"])
                and got.get(key("memagent_headroom_sum_peaks_bytes", resource="host")) == host["sum_peaks_bytes"]
                and got.get(key("memagent_watched_processes")) == st["alive"] == 1
                and got[key("memagent_stack_dumps_total")] <= st["stack_dumps"]
                and 0 < got[key("memagent_tick_duration_seconds_count")] <= st["tick"]["ticks"])

    poll("a scrape equal to status --json and ls --json", agree)
    status, ctype, body = scrape(port)
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    assert "target_proc.py" not in body  # never the command line
    got = samples(body)
    assert got[key("memagent_headroom_warn_fraction")] == 0.9
    assert got[key("memagent_build_info", version="0.1.0", protocol=f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}")] == 1

    status, ctype, body = scrape(port, accept="application/openmetrics-text; version=1.0.0")
    assert status == 200 and ctype.startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith("# EOF\n") and samples(body, openmetrics=True)[key("memagent_watched_processes")] == 1
    assert scrape(port, method="HEAD")[:2] == (200, ctype.replace("application/openmetrics-text; version=1.0.0",
                                                                  "text/plain; version=0.0.4"))
    assert scrape(port, path="/nothing")[0] == 404
    assert scrape(port, method="POST")[0] == 405


def test_the_textfile_is_written_whole_and_retried(tmp_path: Path, start_daemon: Callable[..., Daemon],
                                                   make_target: Callable[..., Target]) -> None:
    where = tmp_path / "textfile"
    path = where / "memagent.prom"
    d = start_daemon("--interval", "0.1", "--config", config(tmp_path, f'[metrics]\ntextfile = "{path}"\n'
                                                                       "textfile_interval = 1\n"))
    poll("the warning about the missing directory", lambda: "cannot write the textfile" in d.log)
    ticks = cli_json(d, "status")["tick"]["ticks"]
    poll("2 s more of failed tries", lambda: cli_json(d, "status")["tick"]["ticks"] >= ticks + 20)
    where.mkdir()
    t = make_target()
    attach(d, t, "tf")
    poll("the textfile, with the process", lambda: path.exists() and f'pid="{t.pid}"' in path.read_text())
    # Each reading is a whole exposition: never half a file.
    for _ in range(200):
        got = samples(path.read_text())
        assert got[key("memagent_watched_processes")] == 1
    assert d.log.count("cannot write the textfile") == 1, d.log  # one line for the whole failing spell
    assert "textfile" in d.log and "written again" in d.log
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(where) == ["memagent.prom"]  # no temporary file left beside it
    assert cli_json(d, "status")["alive"] == 1  # the daemon went on serving throughout


def test_an_exited_process_leaves_after_exited_ttl(tmp_path: Path, start_daemon: Callable[..., Daemon],
                                                   make_target: Callable[..., Target]) -> None:
    port = free_port()
    d = start_daemon("--interval", "0.1", "--metrics", f"127.0.0.1:{port}",
                     "--config", config(tmp_path, "[metrics]\nexited_ttl = 2\n"))
    t = make_target()
    attach(d, t, "ttl")
    peak = f'memagent_process_rss_peak_bytes{{pid="{t.pid}"'
    poll("the process in a scrape", lambda: peak in scrape(port)[2])
    t.exit()
    ls = poll("the exit, in ls", lambda: [p for p in cli_json(d, "ls") if p["pid"] == t.pid and not p["alive"]])
    exited_at = ls[0]["exited_at"]
    body = scrape(port)[2]
    assert peak in body or _now() >= exited_at + 2  # still shown within the TTL
    poll("the process gone from the scrape", lambda: peak not in scrape(port)[2], timeout=10)
    assert _now() >= exited_at + 2 - 0.2
    assert [p["pid"] for p in cli_json(d, "ls")] == [t.pid]  # the daemon still keeps it: only the metrics drop it


def _now() -> float:
    import time

    return time.time()


def test_per_process_label_sums_a_label(tmp_path: Path, start_daemon: Callable[..., Daemon],
                                        make_target: Callable[..., Target]) -> None:
    port = free_port()
    d = start_daemon("--interval", "0.1", "--metrics", f"127.0.0.1:{port}",
                     "--config", config(tmp_path, '[metrics]\nper_process = "label"\n[budgets]\nworkers = "1GiB"\n'))
    a, b = make_target(), make_target()
    attach(d, a, "workers")
    attach(d, b, "workers")

    def agree() -> bool:
        got = samples(scrape(port)[2])
        peaks = [p["rss_peak_bytes"] for p in cli_json(d, "ls")]
        return (len(peaks) == 2 and got.get(key("memagent_process_rss_peak_bytes", label="workers")) == sum(peaks)
                and got.get(key("memagent_label_budget_bytes", label="workers")) == 1024 * MiB
                and key("memagent_label_rss_peak_bytes", label="workers") in got)

    poll("one series for the label, the sum of its processes' peaks", agree)
    assert f'pid="{a.pid}"' not in scrape(port)[2]


def test_bad_metrics_settings_are_one_line(tmp_path: Path, sock_path: str) -> None:
    for value in ("127.0.0.1:99999", "example.com:9478", "9478"):
        out = memagent_cli("daemon", "--socket", sock_path, "--metrics", value)
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
        assert "argument --metrics" in out.stderr
    out = memagent_cli("check-config", config(tmp_path, '[metrics]\nlisten = "127.0.0.1"\nper_process = "pid"\n'))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "metrics.listen" in out.stderr, out.stderr
    out = memagent_cli("check-config", config(tmp_path, '[metrics]\nper_process = "host"\n'))
    assert out.returncode == 2 and "metrics.per_process" in out.stderr, out.stderr
    out = memagent_cli("check-config", config(tmp_path, "[metrics]\ntextfile = \"relative.prom\"\n"))
    assert out.returncode == 2 and "metrics.textfile" in out.stderr, out.stderr
    out = memagent_cli("check-config", config(tmp_path, "[metrics]\nlistne = \"127.0.0.1:1\"\n"))
    assert "did you mean 'listen'" in out.stderr, out.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = memagent_cli("daemon", "--socket", sock_path, "--metrics", f"127.0.0.1:{port}")
    assert out.returncode == 1, out.stderr
    (line,) = [x for x in out.stderr.splitlines() if "INFO" not in x]
    assert line == f"memagent: cannot listen on 127.0.0.1:{port} for metrics: Address already in use"
    assert not os.path.exists(sock_path)


def test_hostile_clients_delay_neither_the_tick_nor_a_scrape(start_daemon: Callable[..., Daemon]) -> None:
    port = free_port()
    d = start_daemon("--interval", "0.05", "--metrics", f"127.0.0.1:{port}")
    # More than the 16 connections served at once: each new one pushes out the oldest silent one.
    hanging = [socket.create_connection(("127.0.0.1", port)) for _ in range(24)]
    try:
        hanging[-1].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        with socket.create_connection(("127.0.0.1", port), timeout=5) as garbage:
            garbage.sendall(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + os.urandom(64) + b"\r\n\r\n")
            assert garbage.recv(100).startswith(b"HTTP/1.1 400 ")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as flood:
            flood.sendall(b"A" * 40_000)  # past the request's limit, no end
            assert flood.recv(100).startswith(b"HTTP/1.1 400 ")
        start = cli_json(d, "status")["tick"]["ticks"]
        for _ in range(20):
            assert scrape(port)[0] == 200
        tick = poll("ticks while the clients hang", lambda: (t := cli_json(d, "status")["tick"])["ticks"] > start + 5
                    and t)
        assert tick["max_lateness"] < ON_TIME, tick
    finally:
        for s in hanging:
            s.close()


def test_sighup_applies_the_metrics_keys_but_listen(tmp_path: Path, start_daemon: Callable[..., Daemon],
                                                    make_target: Callable[..., Target]) -> None:
    port = free_port()
    path = config(tmp_path, f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    d = start_daemon("--interval", "0.1", "--config", path)
    t = make_target()
    attach(d, t, "hup")
    poll("the process by PID", lambda: f'pid="{t.pid}"' in scrape(port)[2])
    config(tmp_path, f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\nper_process = "label"\n')
    d.proc.send_signal(signal.SIGHUP)
    poll("the reload", lambda: "reloaded" in d.log)
    assert "applied metrics.per_process" in d.log and "metrics.listen changed but only a restart" in d.log, d.log

    def by_label() -> str | None:
        body = scrape(port)[2]
        return body if 'pid="' not in body else None

    body = poll("the label's series, no PID", by_label)
    assert 'memagent_process_rss_peak_bytes{label="hup"}' in body


def test_vram_and_gpu_headroom_as_status_and_ls_say(lib_dir: Path, tmp_path: Path,
                                                    start_daemon: Callable[..., Daemon],
                                                    make_target: Callable[..., Target]) -> None:
    gpus = FakeGpuState()
    t = make_target()
    gpus.add_device(total=80 * 1024 * MiB, used=20 * 1024 * MiB, uuid="GPU-m16")
    gpus.add_proc(0, t.pid, 3 * 1024 * MiB)
    gpus.write(tmp_path / "gpu-state")
    port = free_port()
    d = start_daemon("--interval", "0.1", "--metrics", f"127.0.0.1:{port}",
                     env=nvml_env(lib_dir, tmp_path / "gpu-state"))
    attach(d, t, "gpu")

    def agree() -> bool:
        got = samples(scrape(port)[2])
        proc = next(p for p in cli_json(d, "ls") if p["pid"] == t.pid)
        gpu = next((h for h in cli_json(d, "status")["headroom"] if h["resource"] == "GPU-m16"), None)
        series = {"pid": str(t.pid), "name": proc["name"], "label": "gpu"}
        return (gpu is not None and proc["vram_peak_bytes"] == 3 * 1024 * MiB
                and got.get(key("memagent_process_vram_bytes", **series)) == proc["vram_bytes"]
                and got.get(key("memagent_process_vram_peak_bytes", **series)) == proc["vram_peak_bytes"]
                and got.get(key("memagent_headroom_sum_peaks_bytes", resource="GPU-m16")) == gpu["sum_peaks_bytes"]
                and got.get(key("memagent_headroom_capacity_bytes", resource="GPU-m16")) == gpu["capacity_bytes"]
                and got.get(key("memagent_headroom_ratio", resource="GPU-m16")) == gpu["ratio"])

    poll("the GPU's figures in a scrape, as status and ls say", agree)


# ---------------------------------------------------------------------- clients that never read

DEAF_SCRAPERS = Path(__file__).resolve().parents[2] / "bench" / "deaf_scrapers.py"
#: A label as long as the protocol allows: 350 processes with it make an exposition of ~290 KB,
#: as 1000 processes with short labels do (docs/security.md §7).
LONG_LABEL = "l" * 128


def tcp_memory() -> int:
    """Bytes of TCP memory on the whole box (``/proc/net/sockstat``: pages)."""
    with open("/proc/net/sockstat") as f:
        line = next(x for x in f if x.startswith("TCP:"))
    words = line.split()
    return int(words[words.index("mem") + 1]) * os.sysconf("SC_PAGESIZE")


class Sleepers:
    """Idle processes the daemon watches under :data:`LONG_LABEL`: a large exposition."""

    def __init__(self, d: Daemon, n: int) -> None:
        self.procs = [subprocess.Popen(["sleep", "1000"]) for _ in range(n)]
        with d.client() as c:
            c.attach([p.pid for p in self.procs], label=LONG_LABEL)

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def deaf_scrapers(user: pwd.struct_passwd, port: int, count: int, rate: float) -> subprocess.Popen[str]:
    """``count`` clients of ``user`` asking for /metrics and never reading, held open until
    :func:`release` (bench/deaf_scrapers.py); returns once all are open."""

    def drop() -> None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    attacker = subprocess.Popen(["/usr/bin/python3", str(DEAF_SCRAPERS), str(port), str(count), str(rate)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=drop)
    assert attacker.stdout is not None
    assert json.loads(attacker.stdout.readline())["opened"] == count
    return attacker


def release(attacker: subprocess.Popen[str]) -> int:
    """Close the clients; how many of them the daemon had reset."""
    assert attacker.stdin is not None and attacker.stdout is not None
    attacker.stdin.close()
    reset = int(json.loads(attacker.stdout.readline())["reset"])
    attacker.wait(timeout=30)
    return reset


def test_clients_that_never_read_pin_no_kernel_memory(test_user: pwd.struct_passwd,
                                                      start_daemon: Callable[..., Daemon]) -> None:
    """Each answer goes through a 32 KiB send buffer as the client takes it, and one that
    stalls past the write timeout is reset, not left to the kernel as an orphan with the
    whole answer queued: the old code held ~600 KB of TCP memory per such client."""
    port = free_port()
    d = start_daemon("--interval", "0.1", "--no-stacks", "--metrics", f"127.0.0.1:{port}")
    sleepers = Sleepers(d, 350)
    try:
        poll("an exposition of 250 KB", lambda: len(scrape(port)[2]) > 250_000)
        before = tcp_memory()
        attacker = deaf_scrapers(test_user, port, 300, 50)
        try:
            time.sleep(6)
            held = tcp_memory() - before
            assert scrape(port)[0] == 200  # a scraper still gets its answer
        finally:
            release(attacker)
        assert held < 8 * MiB, f"{held / MiB:.1f} MiB of TCP memory for 300 clients that never read"
        tick = cli_json(d, "status")["tick"]
        assert tick["max_lateness"] < ON_TIME, tick
    finally:
        sleepers.stop()


def test_answers_in_flight_per_address_are_capped(test_user: pwd.struct_passwd,
                                                  start_daemon: Callable[..., Daemon]) -> None:
    """Four answers at most in flight to one address: a fifth request gets 503 or takes
    the place of a stalled one (reset); once they have stalled, a scraper's request
    always finds room, whoever holds the other four."""
    port = free_port()
    d = start_daemon("--interval", "0.1", "--no-stacks", "--metrics", f"127.0.0.1:{port}")
    sleepers = Sleepers(d, 350)
    try:
        poll("an exposition of 250 KB", lambda: len(scrape(port)[2]) > 250_000)
        attacker = deaf_scrapers(test_user, port, 4, 100)
        try:
            time.sleep(0.2)
            first = scrape(port)[0]  # 503, unless one of the four had already stalled for 1 s (slow box)
            time.sleep(1.5)  # now all four have taken nothing for longer than STALLED
            later = [scrape(port)[0] for _ in range(3)]
        finally:
            reset = release(attacker)
        assert first in (200, 503) and later == [200, 200, 200], (first, later)
        assert reset >= 1  # room made by resetting a stalled answer, never a fifth answer at once
        assert "Traceback" not in d.log, d.log
    finally:
        sleepers.stop()


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def huge_heads(port: int, rounds: int) -> int:
    """16 clients at once, each sending ``rounds`` requests of 400 KB of headers (the
    limit is 16 KiB); how many of them the daemon accepted. A connection that a loaded box
    does not accept in time is counted out, and the client goes on with its next one."""
    accepted = []

    def client() -> None:
        for _ in range(rounds):
            with socket.socket() as s:
                s.settimeout(10)
                try:  # bytes: a str needs the idna codec, which the user cannot import
                    s.connect((b"127.0.0.1", port))
                except OSError:
                    continue
                accepted.append(1)
                # Reset once the daemon has read its 16 KiB and answered 400: the rest is refused.
                with contextlib.suppress(OSError):
                    s.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"A" * 400_000 + b"\r\n\r\n")
                    s.recv(100)

    threads = [threading.Thread(target=client) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(accepted)


def test_huge_request_heads_leave_no_memory_behind(test_user: pwd.struct_passwd,
                                                   start_daemon: Callable[..., Daemon]) -> None:
    """The request is read into one 16 KiB buffer per connection, never more: the old
    stream reader took up to 256 KiB a read and kept ~13 MiB of RSS after such a burst."""
    port = free_port()
    d = start_daemon("--interval", "0.1", "--no-stacks", "--metrics", f"127.0.0.1:{port}")
    as_user(test_user, lambda: huge_heads(port, 2))  # the first connections' one-time allocations
    before = vm_rss_kib(d.proc.pid)
    accepted = as_user(test_user, lambda: huge_heads(port, 40))
    assert isinstance(accepted, int) and accepted >= 600, f"{accepted} of 640 connections accepted"
    assert scrape(port)[0] == 200
    grown = vm_rss_kib(d.proc.pid) - before
    assert grown < 4 * 1024, f"RSS grew {grown} KiB after 640 requests with 400 KB heads"
