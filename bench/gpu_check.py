"""Real-GPU check: memagent's per-process VRAM against NVML's own figure and PyTorch's.

Needs a Linux box with an NVIDIA GPU (about 7 GiB free), its driver, and PyTorch with
CUDA in the interpreter that runs this script. From the repository root:

    .venv/bin/python bench/gpu_check.py                 # workers of 1, 2 and 3 GiB
    .venv/bin/python bench/gpu_check.py --gib 1,2,3 --interval 0.5 --device 0

Anywhere else (no torch, no CUDA GPU, no NVML) it prints ``skipped: ...`` and exits 0.
It runs in well under 3 minutes (mostly the workers importing torch).

What it does:

1. starts one Python worker per ``--gib`` value (``sys.executable -c WORKER``); each
   allocates that much CUDA memory with ``torch.empty(n, dtype=torch.uint8,
   device="cuda").fill_(1)``, prints ``torch.cuda.memory_reserved()`` and waits on stdin;
   by default the workers are spread over the GPUs round-robin (``--device`` pins them);
2. starts the real daemon (``memagent daemon --socket <tmp> --interval 0.5``, the
   ``memagent`` script next to ``sys.executable``, else ``python -m memagent.cli``) and
   attaches the workers with ``memagent attach PID --socket <tmp>``;
3. waits (at most 60 s) until ``memagent ls --json`` reports ``vram_bytes`` for every
   worker, and prints a table per worker: requested size, torch's reserved memory,
   NVML's ``usedGpuMemory`` read here with pynvml (compute and graphics lists of every
   GPU, a process listed twice on one GPU counted once), memagent's ``vram_bytes``,
   ``vram_peak_bytes`` and ``vram_peak_exact``, and the differences memagent - NVML and
   memagent - torch reserved (the CUDA context and what the driver adds);
4. makes the largest worker free its tensor (``del`` + ``torch.cuda.empty_cache()``),
   waits a few ticks and shows that ``vram_bytes`` dropped while ``vram_peak_bytes``
   stayed;
5. stops workers and daemon and removes the temporary directory in every case
   (``finally``; the children also get SIGKILL if this script dies: PR_SET_PDEATHSIG).

Exit status: 0 when memagent's ``vram_bytes`` equals NVML's figure for every worker
(before and after the free) and, for the freed worker, ``vram_bytes`` dropped while
``vram_peak_bytes`` did not; 1 otherwise, or when the daemon or a worker fails; 0 with
``skipped: ...`` where there is nothing to check. Exact peaks (``vram_peak_exact``) need
accounting mode on the GPU when the daemon starts (``sudo nvidia-smi -am 1``,
docs/gpu.md); the check reports them but does not require them.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

GiB = 1024**3
MiB = 1024**2
#: Seconds, counted from the workers' start: torch import + CUDA init + allocation.
READY_TIMEOUT = 90.0
#: Seconds for memagent to report vram_bytes for every worker once attached.
VRAM_TIMEOUT = 60.0
#: Seconds for the freeing worker to answer, and for memagent to see the drop.
FREE_TIMEOUT = 15.0
#: The whole check gives up after about this many seconds (it must stay within ~3 minutes).
TOTAL_TIMEOUT = 150.0

#: The worker: allocate, report, wait for "free", free, report, wait for EOF.
WORKER = r"""
import sys
import torch

n_bytes, device = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.set_device(device)
t = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
t.fill_(1)
torch.cuda.synchronize()
print("ready", torch.cuda.memory_reserved(), torch.cuda.memory_allocated(), flush=True)
if sys.stdin.readline().strip() == "free":
    del t
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    print("freed", torch.cuda.memory_reserved(), torch.cuda.memory_allocated(), flush=True)
    sys.stdin.readline()
"""

_PR_SET_PDEATHSIG = 1
try:  # looked up before any fork: the child only calls it
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when this script dies, even by SIGKILL."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Skip(Exception):
    """Nothing to check on this machine."""


class CheckFailed(Exception):
    """The check could not be carried out (daemon or worker failure)."""


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise Skip(f"no CUDA GPU/torch: cannot import {name} ({exc})") from None


def mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MiB:,.1f}"


def diff_mib(a: int | None, b: int | None) -> str:
    return "n/a" if a is None or b is None else f"{(a - b) / MiB:+,.1f}"


# --------------------------------------------------------------------------- NVML, directly


class NvmlReader:
    """Per-process GPU memory straight from NVML, independently of memagent's code."""

    def __init__(self, pynvml: ModuleType) -> None:
        self.nv = pynvml
        self.handles: list[Any] = []

    def start(self) -> None:
        nv = self.nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise Skip(f"no CUDA GPU/torch: NVML unavailable ({exc})") from None
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            raise Skip("no CUDA GPU/torch: NVML sees no GPU")
        self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()

    def describe(self) -> list[str]:
        nv = self.nv
        lines = [f"driver {_text(nv.nvmlSystemGetDriverVersion())}, NVML {len(self.handles)} GPU(s)"]
        for i, h in enumerate(self.handles):
            try:
                acct = "on" if nv.nvmlDeviceGetAccountingMode(h) == nv.NVML_FEATURE_ENABLED else "off"
            except nv.NVMLError as exc:
                acct = f"n/a ({exc})"
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            lines.append(f"  GPU {i}: {_text(nv.nvmlDeviceGetName(h))} {_text(nv.nvmlDeviceGetUUID(h))}, "
                         f"{mib(int(mem.used))} of {mib(int(mem.total))} MiB used, accounting mode {acct}")
        return lines

    def free_bytes(self, index: int) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.handles[index]).free)

    def _list(self, handle: Any, kind: str) -> list[Any]:
        nv = self.nv
        try:
            return list(getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses")(handle))
        except (nv.NVMLLibraryMismatchError, nv.NVMLError_FunctionNotFound):
            return list(getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses_v2")(handle))

    def per_process(self) -> dict[int, int | None]:
        """pid -> bytes summed over GPUs; a process in both lists of one GPU counts once
        (the larger figure); None when the driver gives no figure on some GPU."""
        total: dict[int, int | None] = {}
        for handle in self.handles:
            on_gpu: dict[int, int | None] = {}
            for kind in ("Compute", "Graphics"):
                for p in self._list(handle, kind):
                    mem = None if p.usedGpuMemory is None else int(p.usedGpuMemory)
                    old = on_gpu.get(p.pid, 0)
                    on_gpu[p.pid] = None if mem is None or old is None else max(old, mem)
            for pid, mem in on_gpu.items():
                before = total.get(pid, 0)
                total[pid] = None if mem is None or before is None else before + mem
        return total


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- workers


@dataclass
class Worker:
    gib: float
    device: int
    proc: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    reserved: int | None = None
    allocated: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def n_bytes(self) -> int:
        return int(self.gib * GiB)

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def expect(self, word: str, deadline: float) -> list[int]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckFailed(f"worker {self.pid} ({self.gib:g} GiB): no {word!r} line in time")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    raise CheckFailed(f"worker {self.pid} ({self.gib:g} GiB) exited with {self.proc.returncode}; "
                                      "its stderr is above") from None
                continue
            parts = line.split()
            if parts and parts[0] == word:
                return [int(x) for x in parts[1:]]
            print(f"  worker {self.pid}: {line.rstrip()}")

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()


def start_worker(gib: float, device: int) -> Worker:
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(int(gib * GiB)), str(device)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    w = Worker(gib, device, proc)
    threading.Thread(target=w.pump, daemon=True).start()
    return w


def stop_process(proc: subprocess.Popen[Any], timeout: float = 5.0) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


# --------------------------------------------------------------------------- memagent


class Memagent:
    def __init__(self, workdir: Path, interval: float) -> None:
        self.socket = str(workdir / "memagent.sock")
        self.log = workdir / "daemon.log"
        script = Path(sys.executable).with_name("memagent")
        self.argv0 = [str(script)] if script.exists() else [sys.executable, "-m", "memagent.cli"]
        self.interval = interval
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*self.argv0, "daemon", "--socket", self.socket, "--interval", str(self.interval), "-v"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if os.path.exists(self.socket):
                with contextlib.suppress(CheckFailed):
                    self.run("status", "--json")
                    return
            time.sleep(0.1)
        raise CheckFailed(f"the daemon did not answer within {timeout:g} s\n{self.log_tail()}")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise CheckFailed(f"the daemon exited with status {self.proc.returncode}\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no daemon log)"
        return "--- daemon log (tail) ---\n" + "\n".join(text) + "\n---"

    def run(self, *args: str) -> str:
        done = subprocess.run([*self.argv0, *args, "--socket", self.socket],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise CheckFailed(f"memagent {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def ls(self) -> dict[int, dict[str, Any]]:
        self.check_alive()
        return {p["pid"]: p for p in json.loads(self.run("ls", "--json"))}

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=10.0)


# --------------------------------------------------------------------------- the check


def print_table(workers: list[Worker], listed: dict[int, dict[str, Any]], nvml: dict[int, int | None]) -> bool:
    """One row per worker; True when memagent's vram_bytes equals NVML's for every one."""
    head = (f"{'PID':>8} {'GiB':>4} {'GPU':>3} {'torch MiB':>10} {'NVML MiB':>10} {'vram MiB':>10} "
            f"{'peak MiB':>10} {'exact':>5}  {'ma-NVML':>9} {'ma-torch':>9}  match")
    print(head)
    ok = True
    for w in workers:
        p = listed.get(w.pid, {})
        vram, peak = p.get("vram_bytes"), p.get("vram_peak_bytes")
        nv = nvml.get(w.pid)
        match = vram is not None and vram == nv
        ok &= match
        print(f"{w.pid:>8} {w.gib:>4g} {w.device:>3} {mib(w.reserved):>10} {mib(nv):>10} {mib(vram):>10} "
              f"{mib(peak):>10} {p.get('vram_peak_exact', False)!s:>5}  {diff_mib(vram, nv):>9} "
              f"{diff_mib(vram, w.reserved):>9}  {'yes' if match else 'NO'}")
    print("(ma = memagent vram_bytes; ma-torch: the CUDA context and what the driver adds to torch's reserve)")
    return ok


def settle(agent: Memagent, reader: NvmlReader, workers: list[Worker], ticks: int = 10
           ) -> tuple[dict[int, dict[str, Any]], dict[int, int | None]]:
    """memagent's and NVML's views, retried over a few ticks until they agree."""
    listed: dict[int, dict[str, Any]] = {}
    nvml: dict[int, int | None] = {}
    for _ in range(ticks):
        listed, nvml = agent.ls(), reader.per_process()
        if all(nvml.get(w.pid) is not None and listed.get(w.pid, {}).get("vram_bytes") == nvml.get(w.pid)
               for w in workers):
            break
        time.sleep(agent.interval)
    return listed, nvml


def run_check(args: argparse.Namespace) -> int:
    torch = _import("torch")
    pynvml = _import("pynvml")
    if not torch.cuda.is_available():
        raise Skip(f"no CUDA GPU/torch: torch {torch.__version__} sees no CUDA device")
    reader = NvmlReader(pynvml)
    reader.start()
    workdir = Path(tempfile.mkdtemp(prefix="memagent-gpu-check-"))
    workers: list[Worker] = []
    agent = Memagent(workdir, args.interval)
    started = time.monotonic()
    try:
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}; " + "\n".join(reader.describe()))
        sizes = [float(x) for x in args.gib.split(",") if x.strip()]
        devices = [args.device if args.device is not None else i % len(reader.handles) for i in range(len(sizes))]
        for d in set(devices):
            mine = [s for s, dd in zip(sizes, devices, strict=True) if dd == d]
            need = int(sum(mine) * GiB) + len(mine) * GiB  # + about 1 GiB of CUDA context per worker, at most
            if reader.free_bytes(d) < need:
                raise CheckFailed(f"GPU {d} has {mib(reader.free_bytes(d))} MiB free; the workers need about "
                                  f"{mib(need)} MiB")

        print(f"\nstarting {len(sizes)} workers ({', '.join(f'{s:g} GiB' for s in sizes)}) and the daemon ...")
        workers = [start_worker(s, d) for s, d in zip(sizes, devices, strict=True)]
        agent.start()
        status = json.loads(agent.run("status", "--json"))
        print(f"memagent: gpu_available={status.get('gpu_available')} gpu_note={status.get('gpu_note')!r} "
              f"host_pid_namespace={status.get('host_pid_namespace')}")
        if not status.get("gpu_available"):
            raise CheckFailed(f"the daemon does not read GPU memory: {status.get('gpu_note')}\n{agent.log_tail()}")
        if status.get("host_pid_namespace") is False:
            print("warning: the daemon is in a nested PID namespace; NVML's PIDs will not match")

        deadline = started + READY_TIMEOUT
        for w in workers:
            w.reserved, w.allocated = w.expect("ready", deadline)
            agent.run("attach", str(w.pid), "--label", f"gpu-check-{w.gib:g}GiB")
        print(f"workers ready and attached after {time.monotonic() - started:.1f} s: "
              + ", ".join(str(w.pid) for w in workers))

        deadline = min(time.monotonic() + VRAM_TIMEOUT, started + TOTAL_TIMEOUT - 2 * FREE_TIMEOUT)
        while True:
            listed = agent.ls()
            if all(listed.get(w.pid, {}).get("vram_bytes") is not None for w in workers):
                break
            if time.monotonic() > deadline:
                missing = [w.pid for w in workers if listed.get(w.pid, {}).get("vram_bytes") is None]
                raise CheckFailed(f"memagent reports no vram_bytes for {missing} in time "
                                  f"(NVML sees {reader.per_process()})\n{agent.log_tail()}")
            time.sleep(args.interval)

        print("\n== allocated ==")
        listed, nvml = settle(agent, reader, workers)
        ok = print_table(workers, listed, nvml)

        victim = max(workers, key=lambda w: w.gib)
        before = listed[victim.pid]
        print(f"\n== worker {victim.pid} frees its {victim.gib:g} GiB ==")
        victim.say("free")
        victim.reserved, victim.allocated = victim.expect("freed", time.monotonic() + FREE_TIMEOUT)
        deadline = min(time.monotonic() + FREE_TIMEOUT, started + TOTAL_TIMEOUT)
        while True:
            time.sleep(args.interval)
            now = agent.ls().get(victim.pid, {})
            vram = now.get("vram_bytes")
            if vram is not None and vram < before["vram_bytes"]:
                break
            if time.monotonic() > deadline:
                break
        time.sleep(3 * args.interval)  # a few more ticks
        listed, nvml = settle(agent, reader, workers)
        ok &= print_table(workers, listed, nvml)
        after = listed.get(victim.pid, {})
        dropped = after.get("vram_bytes") is not None and after["vram_bytes"] < before["vram_bytes"]
        kept = (after.get("vram_peak_bytes") is not None and before.get("vram_peak_bytes") is not None
                and after["vram_peak_bytes"] >= before["vram_peak_bytes"])
        print(f"worker {victim.pid}: vram_bytes {mib(before.get('vram_bytes'))} -> {mib(after.get('vram_bytes'))} "
              f"MiB ({'dropped' if dropped else 'DID NOT DROP'}); vram_peak_bytes "
              f"{mib(before.get('vram_peak_bytes'))} -> {mib(after.get('vram_peak_bytes'))} MiB "
              f"({'kept' if kept else 'NOT KEPT'}); exact {after.get('vram_peak_exact')}")
        ok = ok and dropped and kept
        print(f"\n{'PASS' if ok else 'FAIL'}: memagent's vram_bytes "
              f"{'equals' if ok else 'does not equal (or the free was not seen)'} NVML's per-process figure "
              f"({time.monotonic() - started:.1f} s)")
        return 0 if ok else 1
    finally:
        for w in workers:
            with contextlib.suppress(OSError, ValueError):
                w.say("exit")
        for w in workers:
            stop_process(w.proc)
        agent.stop()
        reader.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", default="1,2,3", help="sizes of the workers' allocations, GiB (1,2,3)")
    parser.add_argument("--interval", type=float, default=0.5, help="the daemon's sample interval, s (0.5)")
    parser.add_argument("--device", type=int, default=None, help="put every worker on this GPU (round-robin)")
    args = parser.parse_args(argv)
    try:
        return run_check(args)
    except Skip as exc:
        print(f"skipped: {exc}")
        return 0
    except CheckFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
