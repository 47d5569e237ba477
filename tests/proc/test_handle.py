"""ProcFS and process handles on real processes: identity, reads through open
descriptors, and the clear_refs reset of the high-water mark."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memagent.errors import NoSuchProcess, NotUserProcess
from memagent.proc.parse import (
    parse_btime,
    parse_stat,
    parse_statm,
    parse_status_memory,
    parse_status_uid,
)
from memagent.proc.procfs import ProcFS

MiB = 1024 * 1024


# --------------------------------------------------------------------------- real processes


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process that does nothing until killed."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.e2e
def test_procfs_pids_lists_real_processes(sleeper: subprocess.Popen[bytes]) -> None:
    """On the real /proc, our pid and our child's are listed."""
    pids = ProcFS().pids()
    assert os.getpid() in pids
    assert sleeper.pid in pids


@pytest.mark.e2e
def test_handle_on_a_real_process(sleeper: subprocess.Popen[bytes]) -> None:
    """A handle pins the process's identity and reads its files through open descriptors."""
    handle = ProcFS().open(sleeper.pid)
    try:
        assert handle.pid == sleeper.pid
        assert handle.starttime == parse_stat(Path(f"/proc/{sleeper.pid}/stat").read_bytes()).starttime
        statm = parse_statm(handle.statm_bytes())
        assert statm.resident > 0
        status = handle.status_bytes()
        assert status.startswith(b"Name:\tsleep\n")
        assert parse_status_uid(status) == os.getuid()
        mem = parse_status_memory(status)
        assert mem.rss_bytes is not None and mem.rss_bytes > 0
        facts = handle.facts()
        assert facts.cmdline == ["sleep", "600"]
        assert facts.stat.ppid == os.getpid()
        # pread rereads from offset 0: a second read gives the whole file again, not EOF.
        again = handle.statm_bytes()
        assert again.endswith(b"\n")
        assert len(again.split()) == 7
    finally:
        handle.close()
    assert handle.closed


@pytest.mark.e2e
def test_real_start_time_is_now(sleeper: subprocess.Popen[bytes]) -> None:
    """Boot time plus starttime ticks gives the Unix time the child was started."""
    fs = ProcFS()
    started = fs.unix_start_time(fs.stat(sleeper.pid).starttime)
    assert fs.boot_time == parse_btime(Path("/proc/stat").read_bytes())
    assert abs(started - time.time()) < 60


@pytest.mark.e2e
def test_handle_reads_fail_after_the_process_exits() -> None:
    """Reads on a handle whose process has been reaped raise NoSuchProcess, never stale data."""
    proc = subprocess.Popen(["sleep", "600"])
    handle = ProcFS().open(proc.pid)
    try:
        assert handle.statm_bytes()
        proc.kill()
        proc.wait()
        for read in (handle.statm_bytes, handle.status_bytes, handle.facts, handle.memory, handle.clear_refs):
            with pytest.raises(NoSuchProcess) as info:
                read()
            assert info.value.pid == proc.pid
    finally:
        handle.close()


@pytest.mark.e2e
def test_handle_close_is_idempotent(sleeper: subprocess.Popen[bytes]) -> None:
    """Closing twice (an error path and a finally) must not close someone else's descriptor."""
    handle = ProcFS().open(sleeper.pid)
    handle.close()
    handle.close()
    assert handle.closed


@pytest.mark.e2e
def test_open_nonexistent_pid() -> None:
    """Opening a pid that does not exist is NoSuchProcess."""
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: its pid is free (and not reused this quickly)
    with pytest.raises(NoSuchProcess) as info:
        ProcFS().open(proc.pid)
    assert info.value.pid == proc.pid
    with pytest.raises(NoSuchProcess):
        ProcFS().open(2**22 + 1)  # above pid_max's ceiling


def test_open_kernel_thread_is_refused() -> None:
    """A kernel thread has no memory of its own to watch."""
    try:
        stat = parse_stat(Path("/proc/2/stat").read_bytes())
    except FileNotFoundError:
        pytest.skip("no pid 2 in this PID namespace")
    if stat.comm != "kthreadd":
        pytest.skip(f"pid 2 is {stat.comm!r}, not kthreadd, in this PID namespace")
    with pytest.raises(NotUserProcess) as info:
        ProcFS().open(2)
    assert info.value.pid == 2


#: Allocates and touches 100 MiB, frees it, says "ready", then waits for stdin to close.
PEAK_CHILD = """
import sys
n = 100 * 1024 * 1024
block = bytearray(n)
block[::4096] = b"\\x01" * len(range(0, n, 4096))
del block
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.e2e
def test_clear_refs_resets_the_high_water_mark() -> None:
    """Writing 5 to clear_refs makes VmHWM restart from the current RSS: reset-peaks' mechanism."""
    child = subprocess.Popen(
        [sys.executable, "-c", PEAK_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    handle = ProcFS().open(child.pid)
    try:
        assert child.stdout.readline() == "ready\n"
        before = parse_status_memory(handle.status_bytes())
        assert before.hwm_bytes is not None and before.rss_bytes is not None
        assert before.hwm_bytes >= 100 * MiB
        assert before.rss_bytes < before.hwm_bytes - 80 * MiB

        handle.write("clear_refs", b"5")

        after = parse_status_memory(handle.status_bytes())
        assert after.hwm_bytes is not None and after.rss_bytes is not None
        assert after.hwm_bytes < 50 * MiB
        assert after.rss_bytes <= after.hwm_bytes <= after.rss_bytes + 4 * MiB
    finally:
        handle.close()
        child.stdin.close()
        assert child.wait(timeout=30) == 0


def test_thread_cpu_tells_which_threads_ran_and_resident_bytes_the_rss() -> None:
    """The readings taken around a stack dump: a spinning thread's CPU time moves between
    two readings, a sleeping thread's does not."""
    import threading

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    sleeper = threading.Thread(target=stop.wait, daemon=True)
    sleeper.start()
    try:
        h = ProcFS().open(os.getpid())
        # The sleeper runs a little between its start and its wait (longer on a loaded box):
        # the test begins once its time has stopped moving.
        first = h.thread_cpu()
        settle = time.monotonic() + 5
        while time.monotonic() < settle:
            time.sleep(0.02)
            again = h.thread_cpu()
            if again.get(sleeper.native_id or 0) == first.get(sleeper.native_id or 0):
                break
            first = again
        first = h.thread_cpu()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and h.thread_cpu()[spinner.native_id or 0] == first[spinner.native_id or 0]:
            time.sleep(0.01)
        second = h.thread_cpu()
        assert spinner.native_id in first and sleeper.native_id in first
        assert second[spinner.native_id or 0] > first[spinner.native_id or 0]
        assert second[sleeper.native_id or 0] == first[sleeper.native_id or 0]
        page = os.sysconf("SC_PAGE_SIZE")
        low = parse_statm(h.statm_bytes()).resident * page
        rss = h.resident_bytes()
        high = parse_statm(h.statm_bytes()).resident * page
        assert min(low, high) - 4 * MiB <= rss <= max(low, high) + 4 * MiB  # the test process moves a little
        h.close()
    finally:
        stop.set()
        spinner.join()
        sleeper.join()
