"""Sample tests for bench/pytest_compare.py: one kind of allocation each, 150 MiB (over the
bench's 100 MiB budget) unless said otherwise. Each docstring says what memory it makes
resident and what memray's allocation tracking sees of it."""

from __future__ import annotations

import ctypes
import mmap
import subprocess
import sys
import threading

import pytest

MiB = 1 << 20
SIZE = 150 * MiB
PAGE = mmap.PAGESIZE


def test_python_objects() -> None:
    """1.5 M small tuples (~140 MiB in pymalloc arenas): resident, and allocated."""
    objects = [(i, i) for i in range(1_500_000)]
    assert len(objects) == 1_500_000


def test_bytes() -> None:
    """One bytes object, every page written: resident and allocated."""
    data = b"x" * SIZE
    assert len(data) == SIZE


def test_numpy() -> None:
    """A numpy array filled with ones (numpy is not a dependency: skipped without it)."""
    np = pytest.importorskip("numpy")
    array = np.ones(SIZE // 8)
    assert array.nbytes == SIZE


def test_mmap_touched() -> None:
    """An anonymous mmap, one byte written per page: resident, and an mmap memray records."""
    with mmap.mmap(-1, SIZE) as buf:
        for offset in range(0, SIZE, PAGE):
            buf[offset] = 1
        assert buf[0] == 1


def test_malloc_untouched() -> None:
    """malloc(150 MiB) through ctypes, never written: allocated but never resident (RSS does
    not grow). ctypes calls libc's malloc through a pointer from dlsym, not through a library's
    symbol table, where memray's hooks are."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    pointer = libc.malloc(SIZE)
    assert pointer
    libc.free(pointer)


def test_zeros_untouched() -> None:
    """bytes(150 MiB): calloc'd, fresh zero pages never written (as numpy.zeros): allocated,
    never resident."""
    zeros = bytes(SIZE)
    assert len(zeros) == SIZE


def test_freed_quickly() -> None:
    """150 MiB written and freed at once, then a small steady state: a peak only the
    high-water marks (the kernel's, memray's) see afterwards."""
    data = b"x" * SIZE
    del data
    small = b"y" * MiB
    assert len(small) == MiB


def test_in_a_thread() -> None:
    """150 MiB written in another thread of the process: the process's RSS, and memray traces every thread."""
    held: list[bytes] = []
    worker = threading.Thread(target=lambda: held.append(b"x" * SIZE))
    worker.start()
    worker.join()
    assert len(held[0]) == SIZE


def test_in_a_subprocess() -> None:
    """150 MiB written by a child process: neither the pytest process's RSS nor its heap
    (``memagent run -- pytest`` would count the child)."""
    code = f"data = b'x' * {SIZE}; print(len(data))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(SIZE)


def test_small() -> None:
    """The control: 10 MiB, under every budget."""
    data = b"x" * (10 * MiB)
    assert len(data) == 10 * MiB
