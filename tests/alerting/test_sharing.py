"""When PSS is re-read (:mod:`memagent.alerting.sharing`), over a fixture /proc tree with
the real registry, sampler and alert engine on a real event loop; the parser of the
sharing keys on maps texts as the kernel writes them.

Each test changes a process's PSS in the tree behind the agent's back (as copy-on-write
writes or a new sharer do: RSS stays) and checks that the trigger under test, and only
it, makes the agent read the new value before ``pss_refresh`` is up.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from proctree import TRAINER, GiB, MiB, ProcTree

from memagent.alerting.engine import AlertEngine
from memagent.alerting.sharing import EXIT_SETTLE, SHARED_MOVE, ReadBudget
from memagent.config import AlertConfig, HeadroomConfig
from memagent.core.registry import Registry
from memagent.core.sampler import Sampler
from memagent.proc.kmsg import KernelLog
from memagent.proc.sharing import BIG_FILE_MAPPING, parse_sharing_keys

SHM_MAPS = ("7f0000000000-7f0010000000 rw-s 00000000 00:1a 4711                       /dev/shm/segment\n"
            "7f2a10000000-7f2a10200000 r-xp 00000000 08:01 1234567                    /usr/lib/libc.so.6\n")
OTHER_SHM_MAPS = "7f0000000000-7f0010000000 rw-s 00000000 00:1a 4712                       /dev/shm/other\n"


class Box:
    """A registry, the sampler and the engine over the tree, ticked as the agent ticks them."""

    def __init__(self, tree: ProcTree, registry: Registry, kmsg: Path) -> None:
        self.tree = tree
        self.registry = registry
        kmsg.write_bytes(b"")
        self.sampler = Sampler(registry, interval=0.5)
        self.engine = AlertEngine(registry, HeadroomConfig(host_capacity=100 * GiB), AlertConfig(),
                                  lambda alert: None, lambda w: None, kmsg=KernelLog(str(kmsg)))
        self.now = 1000.0
        tree.set_meminfo(16 * GiB, 12 * GiB)

    def start(self, pid: int, rss: int, pss: int, *, ppid: int = 1, maps: str | None = None) -> None:
        if pid != TRAINER:
            self.tree.add_process(pid, f"worker-{pid}", ppid=ppid)
        self.tree.set_memory(pid, rss, hwm=rss)
        self.share(pid, rss, pss, maps)
        self.registry.attach(pid, now=self.now)

    def share(self, pid: int, rss: int, pss: int, maps: str | None = None, shared: int = 0,
              anon_excess: int | None = None) -> None:
        if maps is None:
            self.tree.set_smaps_rollup(pid, rss, pss, shared=shared, anon_excess=anon_excess)
        else:
            self.tree.set_smaps_rollup(pid, rss, pss, maps, shared=shared, anon_excess=anon_excess)

    async def tick(self) -> None:
        self.now += 0.5
        sampled = self.sampler.sample(self.now)
        self.engine.on_tick(self.now, sampled.exited, [], changed=True, moved=sampled.changed)
        await self.engine.pss_settled()

    def excess(self, pid: int) -> int:
        w = self.registry.find_alive(pid)
        assert w is not None
        return w.shared


@pytest.fixture
def box(proc_tree: ProcTree, registry: Registry, tmp_path: Path) -> Iterator[Box]:
    b = Box(proc_tree, registry, tmp_path / "kmsg")
    yield b
    b.engine.close()


async def test_a_process_is_read_at_attach_and_not_again_before_pss_refresh(box: Box) -> None:
    box.start(TRAINER, 400 * MiB, 300 * MiB)
    await box.tick()
    assert box.excess(TRAINER) == 100 * MiB
    box.share(TRAINER, 400 * MiB, 200 * MiB)
    for _ in range(6):
        await box.tick()
    assert box.excess(TRAINER) == 100 * MiB  # nothing triggered a read: still the old value


async def test_a_new_child_makes_its_parent_be_read_again(box: Box) -> None:
    """A fork: the parent's pages are now shared with the child (a forked worker)."""
    box.start(TRAINER, 400 * MiB, 400 * MiB)
    await box.tick()
    assert box.excess(TRAINER) == 0
    box.share(TRAINER, 400 * MiB, 200 * MiB)
    box.start(5001, 400 * MiB, 200 * MiB, ppid=TRAINER)
    await box.tick()
    assert (box.excess(5001), box.excess(TRAINER)) == (200 * MiB, 200 * MiB)


async def test_siblings_are_partners_but_orphans_of_init_are_not(box: Box) -> None:
    box.start(TRAINER, 100 * MiB, 100 * MiB)
    box.start(5001, 300 * MiB, 300 * MiB, ppid=4100)  # TRAINER's parent is 4100 too
    box.start(5002, 300 * MiB, 300 * MiB, ppid=1)
    await box.tick()
    box.share(5001, 300 * MiB, 200 * MiB)
    box.share(5002, 300 * MiB, 200 * MiB)
    box.start(5003, 300 * MiB, 200 * MiB, ppid=4100)
    await box.tick()
    assert box.excess(5001) == 100 * MiB  # a sibling of the new one: read again
    assert box.excess(5002) == 0  # its parent is init: not a partner


async def test_a_new_process_mapping_the_same_segment_makes_the_others_be_read_again(box: Box) -> None:
    box.start(TRAINER, 400 * MiB, 400 * MiB, maps=SHM_MAPS)
    box.start(5001, 400 * MiB, 400 * MiB, maps=OTHER_SHM_MAPS)
    await box.tick()
    box.share(TRAINER, 400 * MiB, 200 * MiB, SHM_MAPS)
    box.share(5001, 400 * MiB, 200 * MiB, OTHER_SHM_MAPS)
    box.start(5002, 400 * MiB, 200 * MiB, maps=SHM_MAPS)
    await box.tick()
    assert box.excess(TRAINER) == 200 * MiB  # maps /dev/shm/segment too
    assert box.excess(5001) == 0  # another segment: left alone


async def test_a_partner_that_exits_makes_the_others_be_read_again(box: Box) -> None:
    box.start(TRAINER, 400 * MiB, 200 * MiB)
    box.start(5001, 400 * MiB, 200 * MiB, ppid=TRAINER)
    await box.tick()
    assert box.excess(TRAINER) == 200 * MiB
    box.share(TRAINER, 400 * MiB, 400 * MiB)
    box.tree.exit(5001)
    await box.tick()
    assert EXIT_SETTLE <= 0.5  # one tick of the box
    assert box.excess(TRAINER) == 200 * MiB  # not read while the kernel unmaps the worker (EXIT_SETTLE)
    await box.tick()
    assert box.excess(TRAINER) == 0


def sum_peaks(box: Box) -> int:
    (host,) = box.engine.headroom
    return host.sum_peaks_bytes


async def test_an_exited_partner_leaves_its_shared_pages_to_the_survivor(box: Box) -> None:
    """Parent and worker share 400 MiB. The worker exits; the parent, read again, now owns
    the pages (PSS = RSS): the worker's part of Σ peaks keeps none of them, so Σ stays
    400 MiB instead of 600 (a pool whose workers come and go counts its memory once)."""
    box.start(TRAINER, 400 * MiB, 200 * MiB)
    box.share(TRAINER, 400 * MiB, 200 * MiB, shared=400 * MiB)
    box.start(5001, 400 * MiB, 200 * MiB, ppid=TRAINER)
    box.share(5001, 400 * MiB, 200 * MiB, shared=400 * MiB)
    await box.tick()
    await box.tick()  # the sums are made at a tick, before that tick's reads are applied
    assert sum_peaks(box) == 400 * MiB
    box.share(TRAINER, 400 * MiB, 400 * MiB)
    box.tree.exit(5001)
    box.now += 0.5
    sampled = box.sampler.sample(box.now)
    box.engine.on_tick(box.now, sampled.exited, [], changed=True, moved=sampled.changed)
    assert box.excess(TRAINER) == 0  # at once: the worker's fair share, before TRAINER's re-read
    await box.engine.pss_settled()
    await box.tick()
    assert box.excess(TRAINER) == 0 and sum_peaks(box) == 400 * MiB
    box.tree.exit(TRAINER)  # the last one: no partner lives on, its figure stays as read
    await box.tick()
    await box.tick()
    assert sum_peaks(box) == 400 * MiB


async def test_a_kernel_fork_or_exec_event_makes_the_process_be_read_again(box: Box) -> None:
    """touch() is what memagent.core.process_events calls for a watched process's fork
    (a child it does not watch) or exec."""
    box.start(TRAINER, 400 * MiB, 400 * MiB)
    await box.tick()
    box.share(TRAINER, 400 * MiB, 200 * MiB)
    await box.tick()
    assert box.excess(TRAINER) == 0
    box.engine.sharing.touch(TRAINER)
    await box.tick()
    assert box.excess(TRAINER) == 200 * MiB


async def test_file_backed_memory_that_moved_makes_the_process_be_read_again(box: Box) -> None:
    """Mapping a segment raises statm's shared part (RSS moves too, but not each time)."""
    box.start(TRAINER, 400 * MiB, 400 * MiB)
    await box.tick()
    box.share(TRAINER, 400 * MiB, 300 * MiB)
    box.tree.set_memory(TRAINER, 400 * MiB, hwm=400 * MiB, shared=SHARED_MOVE // 2)
    await box.tick()
    assert box.excess(TRAINER) == 0  # moved less than SHARED_MOVE
    box.tree.set_memory(TRAINER, 400 * MiB, hwm=400 * MiB, shared=SHARED_MOVE)
    await box.tick()
    assert box.excess(TRAINER) == 100 * MiB


async def test_host_memory_drift_makes_sharing_processes_be_read_again(box: Box) -> None:
    """Copy-on-write pages written: the box uses more, RSS does not move; only the host's
    used memory tells. A drift below pss_drift does nothing; one above re-reads."""
    box.start(TRAINER, 400 * MiB, 200 * MiB)
    box.start(5001, 400 * MiB, 200 * MiB, ppid=TRAINER)
    box.start(5002, 100 * MiB, 100 * MiB, ppid=1)  # shares nothing: not re-read
    await box.tick()
    await box.tick()  # the baseline of what unwatched processes use
    for pid in (TRAINER, 5001):
        box.share(pid, 400 * MiB, 300 * MiB)
    box.share(5002, 100 * MiB, 50 * MiB)
    box.tree.set_meminfo(16 * GiB, 12 * GiB - 32 * MiB)
    await box.tick()
    assert box.excess(TRAINER) == 200 * MiB
    box.tree.set_meminfo(16 * GiB, 12 * GiB - 200 * MiB)
    await box.tick()
    assert (box.excess(TRAINER), box.excess(5001), box.excess(5002)) == (100 * MiB, 100 * MiB, 0)
    assert box.engine.sharing.drift_waves == 1
    await box.tick()  # the sums of the next evaluation use them
    assert box.engine.sharing.drift_waves == 1
    assert box.engine.headroom[0].sum_peaks_bytes == 300 * MiB + 300 * MiB + 100 * MiB


async def test_a_drift_wave_rereads_only_what_copy_on_write_can_move(box: Box) -> None:
    """Where the kernel says which part of the excess is anonymous (Linux 5.9+), a drift
    wave re-reads only the processes that share anonymous pages (forked workers): one that
    shares only libraries and files keeps its figure however the box's memory moves."""
    box.start(TRAINER, 400 * MiB, 200 * MiB)
    box.start(5001, 400 * MiB, 200 * MiB, ppid=TRAINER)
    box.start(5002, 300 * MiB, 200 * MiB, ppid=1)  # 100 MiB of excess, all of it files
    box.share(TRAINER, 400 * MiB, 200 * MiB, anon_excess=200 * MiB)
    box.share(5001, 400 * MiB, 200 * MiB, anon_excess=200 * MiB)
    box.share(5002, 300 * MiB, 200 * MiB, anon_excess=0)
    box.engine.sharing.touch(TRAINER)
    box.engine.sharing.touch(5002)
    await box.tick()
    await box.tick()  # the baseline of what unwatched processes use
    for pid in (TRAINER, 5001):
        box.share(pid, 400 * MiB, 300 * MiB, anon_excess=100 * MiB)
    box.share(5002, 300 * MiB, 250 * MiB, anon_excess=0)  # were it read, its figure would move
    box.tree.set_meminfo(16 * GiB, 12 * GiB - 200 * MiB)
    await box.tick()
    assert box.engine.sharing.drift_waves == 1
    assert (box.excess(TRAINER), box.excess(5001), box.excess(5002)) == (100 * MiB, 100 * MiB, 100 * MiB)


def test_the_read_budget_lets_a_burst_through_and_holds_a_stream_to_its_duty() -> None:
    """A bucket of 0.25 s filling at 1 % of a CPU: the reads of one event run back to back;
    reads that keep coming wait until what they took is earned back."""
    budget = ReadBudget(duty=0.01, burst=0.25)
    assert budget.spend(0.1, now=100.0) == 100.0  # within the burst: the next batch at once
    assert budget.spend(0.1, now=100.0) == 100.0
    assert budget.spend(0.1, now=100.0) == pytest.approx(105.0)  # 0.05 s overdrawn: 5 s at 1 %
    assert budget.spend(0.0, now=1000.0) == 1000.0  # refilled, to the burst only
    assert budget.credit == pytest.approx(0.25)


async def test_an_excess_that_moved_makes_partners_read_before_it_be_read_again(box: Box) -> None:
    """A periodic read finds a worker's excess changed: its parent's changed with it."""
    box.start(TRAINER, 400 * MiB, 200 * MiB)
    box.start(5001, 400 * MiB, 200 * MiB, ppid=TRAINER)
    await box.tick()
    box.share(TRAINER, 400 * MiB, 300 * MiB)
    box.share(5001, 400 * MiB, 300 * MiB)
    box.engine.sharing.touch(5001)  # only the worker (and so its partners)
    await box.tick()
    assert box.excess(TRAINER) == 100 * MiB


def test_sharing_keys_are_shared_mappings_and_big_private_files() -> None:
    big = BIG_FILE_MAPPING
    maps = (
        "55d0c0a00000-55d0c0b00000 r-xp 00000000 08:01 100 /usr/bin/python3.11\n"
        "7f0000000000-7f0010000000 rw-s 00000000 00:1a 4711 /dev/shm/segment\n"
        "7f1000000000-7f1000100000 rw-s 00000000 00:01 2048 /SYSV00000000 (deleted)\n"
        "7f1100000000-7f1100100000 rw-s 00000000 00:05 77 /memfd:weights (deleted)\n"
        f"7f2000000000-{0x7f2000000000 + big:x} r--p 00000000 08:01 555 /models/w.safetensors\n"
        f"7f3000000000-{0x7f3000000000 + big - 4096:x} r--p 00000000 08:01 556 /usr/lib/libbig.so\n"
        "7f4000000000-7f4000100000 rw-s 00000000 00:00 0 \n"  # shared anonymous: a fork's, found by parent
        "7f5000000000-7f5000100000 rw-p 00000000 00:00 0 [heap]\n"
        "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]\n"
        "7f6000000000-7f60"  # cut off by the read
    ).encode()
    assert parse_sharing_keys(maps) == {(0, 0x1a, 4711), (0, 1, 2048), (0, 5, 77), (8, 1, 555)}


def test_sharing_keys_of_two_real_processes_mapping_one_shm_file(tmp_path: Path) -> None:
    """Against the kernel: our own maps show a /dev/shm mapping as a key."""
    import mmap
    import os

    path = f"/dev/shm/memagent-test-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 1 << 20)
        with mmap.mmap(fd, 1 << 20) as m:
            st = os.fstat(fd)
            keys = parse_sharing_keys(Path("/proc/self/maps").read_bytes())
            assert (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in keys
            m[0] = 1
    finally:
        os.close(fd)
        os.unlink(path)


async def test_first_reads_are_not_held_by_spent_re_reads(box: Box) -> None:
    """Re-reads overdrew their 1 % (a box whose memory never rests): processes attached
    then are still read at their next tick, on the first reads' own budget, while the
    re-reads wait their turn (their figures stay as they were)."""
    box.start(TRAINER, 400 * MiB, 200 * MiB)
    box.start(5001, 400 * MiB, 200 * MiB, ppid=TRAINER)
    await box.tick()
    tracker = box.engine.sharing
    tracker._next_batch = tracker._budget.spend(1.0, box.now)  # 1 s of re-reading: none for ~75 s
    box.share(TRAINER, 400 * MiB, 300 * MiB)  # were the partners re-read, this would show
    for pid in range(5101, 5141):  # 40 newcomers: two batches
        box.start(pid, 100 * MiB, 60 * MiB, ppid=TRAINER)
    for _ in range(3):  # as the agent ticks: the budgets' pauses kept (no settled())
        box.now += 0.5
        sampled = box.sampler.sample(box.now)
        box.engine.on_tick(box.now, sampled.exited, [], changed=True, moved=sampled.changed)
        while tracker._task is not None and not tracker._task.done():
            await tracker._task
    assert all(box.excess(pid) == 40 * MiB for pid in range(5101, 5141))
    assert box.excess(TRAINER) == 200 * MiB  # its re-read (a partner came) waits for the budget


async def test_a_pool_attached_at_once_is_read_about_twice_not_once_per_batch(box: Box) -> None:
    """100 siblings (a pool of workers): first reads come before re-reads, so each process
    is read once, then re-read once for the newcomers: about 2n reads, not n²/batch."""
    pool = range(5001, 5101)
    for pid in pool:
        box.start(pid, 100 * MiB, 60 * MiB, ppid=4100)
    for _ in range(4):
        await box.tick()
    assert all(box.excess(pid) == 40 * MiB for pid in pool)
    assert len(pool) <= box.engine.sharing.reads <= 2 * len(pool) + 32
