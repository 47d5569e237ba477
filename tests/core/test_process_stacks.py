"""ProcessStacks: growth is credited only to stacks read while memory rose, shared by the
threads that ran; the stack at peak is never one read after the rise."""

from __future__ import annotations

from memagent.core.process_stacks import RISE_MIN, ProcessStacks, credited_frame, learn, thread_weights
from memagent.proc.austin import SampledThread, SampleRound
from memproto.records import StackDump, StackFrame, ThreadStack

MiB = 1024 * 1024
MAIN, WORKER = 100, 101


def thread(tid: int, *names: str, active: bool = True) -> ThreadStack:
    return ThreadStack(tid * 10, None, active, active, [StackFrame(n, "app.py", i + 1) for i, n in enumerate(names)],
                       tid)


def dump(t: float, rss: int, rise: int, *threads: ThreadStack) -> StackDump:
    return StackDump(t, "sampling", rss, None, list(threads), None, rise)


def credited(ps: ProcessStacks) -> dict[str, int]:
    return {name: entry[0] for (name, _), entry in ps.by_function.items()}


def test_growth_goes_to_a_stack_read_while_memory_rose_and_is_dropped_at_one_read_after() -> None:
    ps = ProcessStacks()
    ps.on_tick(0.0, 100 * MiB)
    ps.on_tick(0.5, 120 * MiB)  # grew 20 MiB: no stack was read meanwhile
    ps.record(dump(0.6, 120 * MiB, 0, thread(MAIN, "idle", "main", active=False)), {MAIN: 0})
    assert credited(ps) == {} and ps.dropped == 20 * MiB
    ps.observe(121 * MiB)
    ps.observe(124 * MiB)  # read around the next dump: it rose by 3 MiB while it was read
    got = ps.record(dump(0.7, 124 * MiB, 3 * MiB, thread(MAIN, "grow", "main")), {MAIN: 5_000_000})
    assert credited(ps) == {"grow": 4 * MiB}
    assert got.attributed_thread == MAIN * 10 and ps.latest is got


def test_the_stack_at_peak_is_the_last_one_read_in_the_rise_never_a_later_idle_one() -> None:
    ps = ProcessStacks()
    ps.on_tick(0.0, 100 * MiB)
    ps.on_tick(0.5, 110 * MiB)
    rising = ps.record(dump(0.6, 115 * MiB, 2 * MiB, thread(MAIN, "grow", "main")), {MAIN: 1})
    assert ps.at_peak is rising and ps.at_peak_state == "ok"
    ps.on_tick(1.0, 130 * MiB)  # the same rise goes on to the peak
    assert ps.at_peak is rising and ps.at_peak_state == "ok"
    ps.on_tick(1.5, 130 * MiB)  # flat: a stack read now is idle, not the peak's
    ps.record(dump(1.6, 130 * MiB, 0, thread(MAIN, "idle", "main", active=False)), {MAIN: 0})
    assert ps.at_peak is rising
    ps.on_tick(2.0, 150 * MiB)  # a new rise to a new peak that no stack caught: missed
    assert ps.at_peak is None and ps.at_peak_state == "missed"
    assert ps.peak_text() is None


def test_a_stack_read_while_rising_by_less_than_rise_min_is_not_a_rise() -> None:
    ps = ProcessStacks()
    ps.on_tick(0.0, 100 * MiB)
    ps.record(dump(0.1, 100 * MiB, RISE_MIN - 4096, thread(MAIN, "work", "main")), {MAIN: 1})
    assert ps.at_peak is None and credited(ps) == {}


def test_a_sleeping_thread_is_not_credited_and_its_stack_is_not_the_peak() -> None:
    ps = ProcessStacks()
    ps.on_tick(0.0, 100 * MiB)
    ps.on_tick(0.5, 110 * MiB)
    ps.record(dump(0.6, 112 * MiB, 2 * MiB, thread(MAIN, "idle", "main", active=False)), {MAIN: 1})
    assert credited(ps) == {} and ps.at_peak is None


def test_a_thread_that_runs_whether_memory_rises_or_not_gets_the_smaller_share() -> None:
    history: dict[int, list[int]] = {}
    for i in range(20):  # the worker runs in every window; main only in the rising ones
        rose = i % 4 == 0
        learn(history, {MAIN: 1 if rose else 0, WORKER: 1}, rose)
    weights = thread_weights([thread(MAIN, "grow"), thread(WORKER, "spin")], {MAIN: 1, WORKER: 1}, history)
    assert weights[MAIN * 10] > 0.8 and abs(sum(weights.values()) - 1) < 1e-9
    # A thread that did not run in the window gets nothing; unknown CPU: all share.
    assert thread_weights([thread(MAIN, "grow"), thread(WORKER, "spin")], {MAIN: 0, WORKER: 1},
                          history).keys() == {WORKER * 10}
    assert len(thread_weights([thread(MAIN, "grow"), thread(WORKER, "spin")], None, {})) == 2


def test_the_caller_of_a_library_is_credited_not_the_library() -> None:
    numpy = "/venv/lib/python3.11/site-packages/numpy/_core/fromnumeric.py"
    frames = [StackFrame("_wrapfunc", numpy, 57), StackFrame("cumsum", numpy, 2700),
              StackFrame("grow", "/srv/app/load.py", 12), StackFrame("main", "/srv/app/load.py", 30)]
    assert credited_frame(frames).name == "grow"
    stdlib = [StackFrame("is_set", "/usr/lib/python3.11/threading.py", 570), StackFrame("spin", "/srv/app/x.py", 3)]
    assert credited_frame(stdlib).name == "spin"
    only = [StackFrame("_wrapfunc", numpy, 57)]
    assert credited_frame(only).name == "_wrapfunc"


# ---------------------------------------------------------------- sampled rounds (Austin)

SPIN = 200


def sampled(tid: int, *names: str, active: bool = True) -> SampledThread:
    """Austin's frames text: outermost first."""
    return SampledThread(tid, active, ";".join(f"/srv/app.py:{n}:{i + 1}" for i, n in enumerate(reversed(names))))


def rnd(change: int, *threads: SampledThread) -> SampleRound:
    return SampleRound(0.0, change, threads)


def test_a_single_threaded_process_gets_each_rise_of_a_round_credited_to_its_leaf() -> None:
    ps = ProcessStacks()
    ps.sampled = True
    ps.record_round(rnd(2 * MiB, sampled(MAIN, "grow", "main")), 102 * MiB, None, 1.0)
    ps.record_round(rnd(-MiB, sampled(MAIN, "free", "main")), 101 * MiB, None, 1.01)
    ps.record_round(rnd(0, sampled(MAIN, "idle", "main", active=False)), 101 * MiB, None, 1.02)
    assert credited(ps) == {"grow": 2 * MiB} and ps.dropped == 0


def test_growth_read_after_the_allocator_went_idle_goes_to_its_stack_of_the_round_before() -> None:
    ps = ProcessStacks()
    ps.record_round(rnd(0, sampled(MAIN, "grow", "main")), 100 * MiB, None, 1.0)
    ps.record_round(rnd(3 * MiB, sampled(MAIN, "idle", "main", active=False)), 103 * MiB, None, 1.01)
    assert credited(ps) == {"grow": 3 * MiB}


def test_a_spinner_in_every_round_gets_little_of_the_growth_its_neighbour_makes() -> None:
    ps = ProcessStacks()
    rss = 100 * MiB
    for i in range(200):  # 1 round in 10 rises, while the grower runs; the spinner runs always
        grows = i % 10 == 0
        rss += 4 * MiB if grows else 0
        ps.record_round(rnd(4 * MiB if grows else 0, sampled(MAIN, "grow" if grows else "idle", "main", active=grows),
                            sampled(SPIN, "spin", "run")), rss, None, i / 100)
    got = credited(ps)
    assert got["grow"] >= 0.9 * sum(got.values()), got
    # A rise the grower was not caught in: the spinner, its only runner, gets only the base rate.
    before = got.get("spin", 0)
    ps.record_round(rnd(10 * MiB, sampled(MAIN, "idle", "main", active=False), sampled(SPIN, "spin", "run")),
                    rss + 10 * MiB, None, 3.0)
    assert credited(ps).get("spin", 0) - before <= 3 * MiB
    # ... and its stack is not the peak's: the grower's last rising round stays.
    assert ps.at_peak is not None and in_frames(ps.at_peak, "grow")


def test_a_round_with_nobody_running_credits_nothing() -> None:
    ps = ProcessStacks()
    ps.record_round(rnd(5 * MiB, sampled(MAIN, "idle", "main", active=False)), 105 * MiB, None, 1.0)
    assert credited(ps) == {} and ps.dropped == 5 * MiB and ps.at_peak is None


def test_a_rising_round_is_the_stack_at_peak_and_a_tick_afterwards_keeps_it() -> None:
    ps = ProcessStacks()
    ps.on_tick(0.0, 100 * MiB)
    ps.sampled = True
    got = ps.record_round(rnd(8 * MiB, sampled(MAIN, "grow", "main")), 108 * MiB, None, 0.2)
    assert got is not None and ps.at_peak is got and ps.at_peak_state == "ok"
    assert got.trigger == "sampling" and got.rss_rise == 8 * MiB and got.attributed_thread == MAIN
    ps.on_tick(0.5, 108 * MiB)  # the tick's reading: no growth counted twice
    assert ps.pending_growth == 0 and ps.at_peak is got


def in_frames(dump: StackDump, name: str) -> bool:
    chosen = dump.attributed()
    return chosen is not None and any(f.name == name for f in chosen.frames)


def test_a_thread_sampled_idle_while_waiting_for_the_gil_is_credited_when_it_ran() -> None:
    ps = ProcessStacks()
    waiting = sampled(MAIN, "grow", "main", active=False)  # in grow, off CPU: the spinner has the GIL
    ps.record_round(rnd(0, waiting, sampled(SPIN, "spin", "run")), 100 * MiB, None, 1.0)
    for _ in range(20):  # it ran between the samples, and memory rose whenever it did
        ps.record_round(rnd(MiB, waiting, sampled(SPIN, "spin", "run")), 100 * MiB, None, 1.0, {MAIN: 3_000_000,
                                                                                               SPIN: 7_000_000})
        ps.record_round(rnd(0, sampled(MAIN, "idle", "main", active=False), sampled(SPIN, "spin", "run")),
                        100 * MiB, None, 1.0, {MAIN: 0, SPIN: 10_000_000})
    got = credited(ps)
    assert got.get("grow", 0) >= 0.8 * sum(got.values()), got
    # Without the CPU times, the same rounds credit only the spinner: the sampled flags alone miss it.
    blind = ProcessStacks()
    for _ in range(20):
        blind.record_round(rnd(MiB, waiting, sampled(SPIN, "spin", "run")), 100 * MiB, None, 1.0)
    assert "grow" not in credited(blind)
