"""The sample row's ``rss_peak_exact`` (v1.5) end to end, with a real daemon and real targets:
a subscriber (memtop) sees the peak turn sampled at ``reset-peaks`` and exact again once the
kernel's mark passes its value at the reset, and an exited process's flag, without asking
``list``. Before v1.5 the flag was in ``list`` only, so memtop kept a stale "~".
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import Daemon, MiB, Target, memagent_cli, wait_sample

#: The target's spike before the reset: VmHWM's value there (hwm₀) is the bar to pass.
SPIKE_MIB = 100
#: Held after the reset: resident memory above hwm₀.
ABOVE_MIB = 160


def test_reset_peaks_flag_reaches_subscribers(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    with daemon.client() as c:
        c.attach([t.pid])
        c.subscribe()
        t.do(f"spike {SPIKE_MIB}")
        hwm0 = t.status_kb("VmHWM") * 1024
        assert hwm0 >= SPIKE_MIB * MiB
        wait_sample(c, t.pid, lambda r: r["rss_peak_exact"] is True and r["rss_peak_bytes"] >= hwm0)
        r = memagent_cli("reset-peaks", "--socket", daemon.socket, str(t.pid))
        assert r.returncode == 0, r.stderr
        # The window restarted on the agent's side: sampled, and the old spike left out.
        row = wait_sample(c, t.pid, lambda r: r["rss_peak_exact"] is False)
        assert row["rss_peak_bytes"] < hwm0
        assert t.status_kb("VmHWM") * 1024 == hwm0  # the target's own mark is untouched
        # Memory above hwm₀: VmHWM rose after the reset, so it is the window's peak again.
        t.do(f"alloc {ABOVE_MIB}")
        # (A status read in the middle of the allocation may be exact already, its value lower.)
        row = wait_sample(c, t.pid, lambda r: r["rss_peak_exact"] is True)
        assert row["rss_peak_bytes"] > hwm0


@pytest.mark.parametrize("netlink", [True, False], ids=["netlink", "polling"])
def test_exited_row_carries_the_final_flag(start_daemon: Callable[..., Daemon],
                                           make_target: Callable[..., Target], netlink: bool) -> None:
    """Exact while alive; after the exit, exact only with the kernel's exit record
    (netlink), else sampled: the last VmHWM read is older than the exit."""
    d = start_daemon("--interval", "0.1", *(() if netlink else ("--no-netlink",)))
    t = make_target()
    with d.client() as c:
        if netlink and (status := c.status()).process_events != "netlink":
            pytest.skip(f"the daemon cannot listen to process events here: {status.process_events_note}")
        c.attach([t.pid])
        c.subscribe()
        wait_sample(c, t.pid, lambda r: r["alive"] is True and r["rss_peak_exact"] is True)
        t.exit()
        # With netlink the record may come just after the exit is seen (within 5 s, see
        # docs/sampling.md#exit-detection): wait for the flag, not for the first exited row.
        row = wait_sample(c, t.pid, lambda r: r["alive"] is False and r["rss_peak_exact"] is netlink)
        assert row["rss_peak_exact"] is netlink
