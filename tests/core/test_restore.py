"""core.restore on a fixture /proc: what an exited entry is listed with after a restart."""

from __future__ import annotations

import json
import logging

import pytest
from proctree import TRAINER

from memagent.core.registry import Registry
from memagent.core.restore import Saved, restore

MiB = 1024 * 1024


def saved(**over: object) -> Saved:
    base = dict(pid=4242, starttime=777, start_time=1_800_000_000.0, attached_at=1_800_000_001.0, name="train",
                cmdline=["python3", "train.py"], uid=1000, label="resnet", label_trusted=True,
                follow_children=False, alive=False, exited_at=1_800_000_100.0, peak=900 * MiB, peak_exact=True,
                peak_since=1_800_000_000.0, hwm_at_reset=None, vram_peak=3 * 1024 * MiB)
    base.update(over)
    return Saved(**base)  # type: ignore[arg-type]


def test_an_exited_entry_keeps_its_gpu_peak(registry: Registry) -> None:
    assert restore(registry, [saved()], 1_800_000_200.0) == (0, 1)
    (w,) = registry.entries.values()
    info = w.info()
    assert (info.alive, info.rss_peak_bytes, info.rss_peak_exact) == (False, 900 * MiB, True)
    assert info.vram_peak_bytes == 3 * 1024 * MiB
    assert info.vram_peak_exact is False  # one figure for all GPUs: not the driver's per-GPU mark


def test_a_process_gone_while_down_keeps_its_gpu_peak_not_exact(registry: Registry) -> None:
    restore(registry, [saved(alive=True, exited_at=None, pid=999_999)], 1_800_000_200.0)
    (w,) = registry.entries.values()
    assert (w.info().alive, w.info().rss_peak_exact, w.info().vram_peak_bytes) == (False, False, 3 * 1024 * MiB)


def test_a_file_from_before_the_gpu_peak_was_kept_still_loads() -> None:
    old = saved().to_json()
    del old["vram_peak"]
    assert Saved.from_json(json.loads(json.dumps(old))).vram_peak is None


def test_the_daemons_lines_give_sizes_and_times_for_people(registry: Registry,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """INFO lines say "peak 1.50 GiB" and a local time, not raw bytes and epoch seconds (issue 28)."""
    w = registry.attach(TRAINER)[0]
    with caplog.at_level(logging.INFO, logger="memagent"):
        registry.mark_exited([w], 1000.0)
    line = next(r.getMessage() for r in caplog.records if "exited; peak" in r.getMessage())
    assert "iB" in line.split("peak ")[1] and " bytes" not in line, line
