"""Jetson GPU memory end to end: a real daemon whose ``[gpu] nvmap_clients`` is a file the
test writes in the nvmap clients format, with the PIDs of real target processes, rewritten
while they grow, shrink, come and go. No Jetson, no NVML needed: the nvmap file, when
readable, is chosen before NVML."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Daemon, Target, memagent_cli, poll

K = 1024
HEADER = "CLIENT                        PROCESS      PID        SIZE\n"


def write_clients(path: Path, rows: dict[int, int], *, raw: str | None = None) -> None:
    """Replace the file at once (the kernel's file is never half written either)."""
    text = raw if raw is not None else HEADER + "".join(
        f"user {'python3':>24} {pid:>8} {kib:>9}K\n" for pid, kib in rows.items()) + \
        f"total {'':>33} {sum(rows.values()):>9}K\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def ls(d: Daemon) -> dict[int, dict[str, Any]]:
    r = memagent_cli("ls", "--json", "--socket", d.socket)
    assert r.returncode == 0, r
    return {p["pid"]: p for p in json.loads(r.stdout)}


def vram(d: Daemon, pid: int) -> tuple[int | None, int | None]:
    p = ls(d)[pid]
    return p["vram_bytes"], p["vram_peak_bytes"]


def test_per_process_gpu_memory_from_nvmap_while_processes_come_and_go(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path
) -> None:
    clients = tmp_path / "clients"
    a, b = make_target(), make_target()
    write_clients(clients, {a.pid: 1024, b.pid: 4096})
    cfg = tmp_path / "memagent.toml"
    cfg.write_text(f'[gpu]\nnvmap_clients = "{clients}"\n')
    d = start_daemon("--config", str(cfg), "--interval", "0.1", "--no-stacks")
    status = json.loads(memagent_cli("status", "--json", "--socket", d.socket).stdout)
    assert (status["gpu_source"], status["gpu_available"]) == ("nvmap", True)
    assert str(clients) in status["gpu_source_note"]
    assert [g["uuid"] for g in status["gpus"]] == ["nvmap"]
    text = memagent_cli("status", "--socket", d.socket).stdout
    assert "GPU source: nvmap" in text
    with d.client() as c:
        c.attach([a.pid, b.pid])
    poll("both figures", lambda: vram(d, a.pid) == (1024 * K, 1024 * K) and vram(d, b.pid) == (4096 * K, 4096 * K))
    # a grows then shrinks: its peak is the highest figure sampled, flagged not exact.
    write_clients(clients, {a.pid: 8192, b.pid: 4096})
    poll("a grew", lambda: vram(d, a.pid) == (8192 * K, 8192 * K))
    write_clients(clients, {a.pid: 2048})  # b released all of its GPU memory
    poll("a shrank, b holds none", lambda: vram(d, a.pid) == (2048 * K, 8192 * K) and vram(d, b.pid) == (0, 4096 * K))
    assert ls(d)[a.pid]["vram_peak_exact"] is False
    # A new process, attached while it holds memory; one that exits keeps its last figures.
    c3 = make_target()
    write_clients(clients, {a.pid: 2048, c3.pid: 512})
    with d.client() as c:
        c.attach([c3.pid])
    poll("the new one", lambda: vram(d, c3.pid) == (512 * K, 512 * K))
    a.exit()
    poll("a exited", lambda: not ls(d)[a.pid]["alive"])
    assert vram(d, a.pid) == (2048 * K, 8192 * K)
    # A file that stops parsing: unknown (null), never 0; the daemon goes on; then back.
    write_clients(clients, {}, raw="garbage\n")
    poll("unknown", lambda: vram(d, c3.pid)[0] is None)
    assert any("nvmap clients file" in line for line in d.lines)
    write_clients(clients, {c3.pid: 256})
    poll("back", lambda: vram(d, c3.pid) == (256 * K, 512 * K))
    # Unified memory: no GPU headroom of its own; the GPU peaks count in the host's.
    write_clients(clients, {c3.pid: 4 << 20})  # 4 GiB (only a figure: nothing is allocated)

    def host_sum() -> int:
        views = json.loads(memagent_cli("status", "--json", "--socket", d.socket).stdout)["headroom"]
        assert [v["resource"] for v in views] == ["host"]
        return int(views[0]["sum_peaks_bytes"])

    poll("the host's Σ peaks counts 4 GiB of GPU memory", lambda: host_sum() >= 4 << 30)


def test_without_the_file_the_status_says_why(start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-clients"
    cfg = tmp_path / "memagent.toml"
    cfg.write_text(f'[gpu]\nnvmap_clients = "{missing}"\n')
    d = start_daemon("--config", str(cfg), "--interval", "0.1")
    status = json.loads(memagent_cli("status", "--json", "--socket", d.socket).stdout)
    assert status["gpu_source"] in ("nvml", "none")  # nvml on a box with an NVIDIA GPU
    assert f"nvmap: {missing} not found" in status["gpu_source_note"]


def test_a_label_budget_counts_gpu_memory_on_unified_memory(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path
) -> None:
    """On a Jetson (nvmap) RAM and GPU memory are one pool: a label's budget counts both."""
    clients = tmp_path / "clients"
    t = make_target()
    write_clients(clients, {t.pid: 1024})  # 1 MiB of GPU memory: far under the budget
    cfg = tmp_path / "memagent.toml"
    cfg.write_text(f'[gpu]\nnvmap_clients = "{clients}"\n[budgets]\nmodels = "2GiB"\n')
    d = start_daemon("--config", str(cfg), "--interval", "0.1", "--no-stacks")
    with d.client() as c:
        c.attach([t.pid], label="models")
    poll("its GPU memory", lambda: vram(d, t.pid) == (1024 * K, 1024 * K))

    def budget_alert() -> dict[str, Any] | None:
        status = json.loads(memagent_cli("status", "--json", "--socket", d.socket).stdout)
        return next((a for a in status["alerts_active"] if a["kind"] == "budget"), None)

    assert budget_alert() is None  # RSS (~20 MiB) + 1 MiB of a 2 GiB budget
    write_clients(clients, {t.pid: 3 << 20})  # 3 GiB of GPU memory: the RSS alone is far under 2 GiB
    alert = poll("the budget alert, counting the GPU memory", budget_alert)
    assert alert["resource"] == "models" and "of a 2.00 GiB budget" in alert["message"], alert
