"""The observed bound (issue 30, docs/headroom.md "Two bounds"): the highest total the
watched processes reached at the same tick, beside Σ peaks, against a real daemon (its
state directory and flight recorder on) watching two real targets.

Sizes scaled down from the issue's 500 MiB to 200 MiB (faulting in is slow on the shared
test box). Synchronisation: each step waits, with a deadline, until the daemon's own
figures (its ``list``, its ``status``) show what the step did, so every assertion is about
ticks the daemon sampled, never about wall-clock time.
"""

from __future__ import annotations

import json
import pwd
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Daemon, MiB, Target, as_user, memagent_cli, poll

from memagent.client import Client
from memproto.records import Headroom

HELD = 200
#: What a Python target's own pages may move by between two figures (its interpreter, the
#: daemon's rounding of PSS).
SLACK = 24 * MiB
CAPACITY = 1024 * MiB


def _host(d: Daemon) -> Headroom:
    """The daemon's host headroom (after its first tick: a daemon just started has none yet)."""
    def host() -> Headroom | None:
        with d.client() as c:
            return next((h for h in c.status().headroom if h.resource == "host"), None)
    found: Headroom = poll("the daemon's host headroom", host)
    return found


def _rss(d: Daemon, pid: int) -> int:
    with d.client() as c:
        return next(p.rss_bytes for p in c.list() if p.pid == pid)


def _hold(d: Daemon, t: Target) -> None:
    t.do(f"alloc {HELD}")
    poll(f"the daemon sees {t.pid} hold {HELD} MiB", lambda: _rss(d, t.pid) >= HELD * MiB)


def _free(d: Daemon, t: Target) -> None:
    t.do("free")
    poll(f"the daemon sees {t.pid} give it back", lambda: _rss(d, t.pid) < HELD * MiB // 2)


def _cli(d: Daemon, *args: str) -> tuple[int, str]:
    r = memagent_cli("--socket", d.socket, *args)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, r.stdout


def _report(d: Daemon, record: Path) -> dict[str, Any]:
    code, out = _cli(d, "report", str(record), "--json")
    assert code == 0
    return json.loads(out)  # type: ignore[no-any-return]


def _observed_in(report: dict[str, Any]) -> dict[str, Any] | None:
    return next((o for o in report["observed"] if o["resource"] == "host"), None)


def test_peaks_that_never_meet_are_seen_apart_and_together_when_they_overlap(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    config = tmp_path / "memagent.toml"
    config.write_text(f'[host]\ncapacity = "{CAPACITY // MiB}MiB"\n')
    args = ("--interval", "0.1", "--state-dir", str(state), "--config", str(config))
    d = start_daemon(*args)
    a, b = make_target(), make_target()
    with d.client() as c:
        c.attach([a.pid, b.pid], label="model")
    # Both share-adjusted (PSS read): the daemon's total now is a figure, not a guess.
    start = poll("the daemon's total now", lambda: (h := _host(d)).sum_now_bytes is not None and h)
    base, base_peaks = start.sum_now_bytes, start.sum_peaks_bytes

    for t in (a, b):  # alternate: one holds, gives back, then the other
        _hold(d, t)
        _free(d, t)
    apart = _host(d)
    assert apart.sum_peaks_bytes >= base_peaks + 2 * HELD * MiB - SLACK
    assert apart.observed_sum_max_bytes is not None and apart.observed_sum_max_at is not None
    assert abs(apart.observed_sum_max_bytes - (base + HELD * MiB)) < SLACK
    assert apart.sum_peaks_bytes - apart.observed_sum_max_bytes > HELD * MiB - 2 * SLACK
    assert {c.pid for c in apart.observed_top} <= {a.pid, b.pid}

    # A newcomer between the two bounds: the worst case refuses it, the observed admits it.
    need = CAPACITY - (apart.observed_sum_max_bytes + apart.sum_peaks_bytes) // 2
    code, out = _cli(d, "admit", "--rss", str(need), "--json")
    verdicts = json.loads(out)
    assert code == 3 and verdicts["fits"] is False and verdicts["basis"] == "worst-case"
    assert verdicts["worst_case"]["fits"] is False and verdicts["observed"]["fits"] is True
    assert _cli(d, "admit", "--rss", str(need), "--basis", "observed")[0] == 0

    # The recorded range gives what the live daemon says (the recorder writes each new maximum).
    record = state / "record"
    seen = poll("the recording's observed maximum", lambda: (o := _observed_in(_report(d, record)))
                and o["bytes"] == apart.observed_sum_max_bytes and o)
    assert seen["time"] == apart.observed_sum_max_at
    assert seen["sum_peaks_bytes"] >= seen["bytes"] + HELD * MiB - 2 * SLACK
    code, text = _cli(d, "report", str(record))
    assert code == 0 and "seen together (observed: a lower bound" in text and "peaks together" in text

    _hold(d, a)  # now they overlap: the observed rises to Σ peaks
    _hold(d, b)
    together = poll("the observed maximum reaches Σ peaks", lambda: (h := _host(d)).observed_sum_max_bytes
                    is not None and h.observed_sum_max_bytes >= h.sum_peaks_bytes - SLACK and h)
    assert together.observed_sum_max_bytes is not None
    assert together.observed_sum_max_bytes >= apart.observed_sum_max_bytes + HELD * MiB - SLACK
    assert _cli(d, "admit", "--rss", str(need), "--basis", "observed")[0] == 3
    code, out = _cli(d, "status", "--json")
    host = next(h for h in json.loads(out)["headroom"] if h["resource"] == "host")
    assert host["observed_sum_max_bytes"] >= together.observed_sum_max_bytes  # it may have risen since: never falls
    assert host["observed_sum_max_at"] >= together.observed_sum_max_at
    plot = tmp_path / "fleet.html"
    assert _cli(d, "plot", str(record), "-o", str(plot))[0] == 0
    assert "seen together (observed" in plot.read_text()

    # Kept across a restart: the state file holds it, the next daemon reports it.
    for t in (a, b):
        _free(d, t)
    kept = _host(d)
    poll("the state file holds the observed maximum", lambda: json.loads((state / "state.json").read_text())
         .get("observed", {}).get("host", {}).get("bytes") == kept.observed_sum_max_bytes)
    d.stop()
    again = _host(start_daemon(*args))
    assert (again.observed_sum_max_bytes, again.observed_sum_max_at) == \
        (kept.observed_sum_max_bytes, kept.observed_sum_max_at)


def test_another_user_sees_the_totals_but_not_roots_processes_among_them(
    test_user: pwd.struct_passwd, shared_dir: str, start_daemon: Callable[..., Daemon],
    make_target: Callable[..., Target],
) -> None:
    d = start_daemon("--interval", "0.1", "--socket-group", test_user.pw_name, socket=f"{shared_dir}/m.sock")
    t = make_target()
    with d.client() as c:
        c.attach([t.pid])
    _hold(d, t)
    mine = poll("root's process counted together", lambda: t.pid in {c.pid for c in _host(d).observed_top}
                and _host(d))

    def ask() -> dict[str, object]:
        with Client(d.socket, timeout=30) as c:
            h = next(h for h in c.status().headroom if h.resource == "host")
        return {"observed": h.observed_sum_max_bytes, "pids": [c.pid for c in (*h.observed_top, *h.now_top)]}

    out = as_user(test_user, ask)
    assert isinstance(out, dict)
    assert isinstance(out["observed"], int) and out["observed"] >= HELD * MiB  # the box's figure
    assert mine.observed_sum_max_bytes is not None and out["observed"] >= mine.observed_sum_max_bytes
    assert out["pids"] == []  # root's process is not named to another user
