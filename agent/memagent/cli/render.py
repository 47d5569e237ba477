"""Text for people: the process table, the status report and Python stacks (``stack``'s
reply), as the ``memagent`` commands print them (``--json`` prints the wire records instead)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from memproto.schema import to_wire
from memproto.text import printable
from memproto.vocabulary import AtPeakState, Resource

from ..prose import frame_text, human_bytes

if TYPE_CHECKING:  # annotations only: ``ls`` then loads no stack or status records
    from memproto.frames import StackOk
    from memproto.records import DaemonStatus, ProcessInfo, StackDump


def process_json(p: ProcessInfo) -> dict[str, Any]:
    return to_wire(p)  # type: ignore[no-any-return]


def container_text(p: ProcessInfo) -> str:
    """A process's container for people: its name, else the short ID (as Docker shows it)."""
    c = p.container
    return "-" if c is None else c.name or c.id[:12]


def format_table(processes: list[ProcessInfo]) -> str:
    gpu = any(p.vram_bytes is not None or p.vram_peak_bytes is not None or p.gpus for p in processes)
    vram_title = f" {'VRAM':>10} {'VPEAK':>10}" if gpu else ""
    boxed = any(p.container is not None for p in processes)
    box_title = f"{'CONTAINER':<20} " if boxed else ""
    nested = any(p.ns_pid is not None and p.ns_pid != p.pid for p in processes)
    ns_title = f" {'NSPID':>7}" if nested else ""  # its PID in its own namespace, where that differs
    oom = any(p.oom_score_adj is not None for p in processes)  # the daemon set it ([oom_score_adj])
    oom_title = f" {'OOMADJ':>6}" if oom else ""
    header = (f"{'PID':>7}{ns_title}  {'NAME':<20} {box_title}{'RSS':>10} {'PEAK':>10} {'ANON':>10} {'SWAP':>9}"
              f"{vram_title}{oom_title}  {'STATE':<6} COMMAND")
    lines = [header]
    for p in sorted(processes, key=lambda p: p.rss_peak_bytes, reverse=True):
        name = printable(p.label or p.name)
        state = "alive" if p.alive else "exited"
        peak = human_bytes(p.rss_peak_bytes) + ("" if p.rss_peak_exact else "~")
        cmd = printable(" ".join(p.cmdline))[:60]
        vram = ""
        if gpu:
            vpeak = human_bytes(p.vram_peak_bytes) + ("" if p.vram_peak_exact or p.vram_peak_bytes is None else "~")
            vram = f" {human_bytes(p.vram_bytes):>10} {vpeak:>10}"
        box = f"{printable(container_text(p))[:20]:<20} " if boxed else ""
        ns = "" if not nested else f" {p.ns_pid if p.ns_pid is not None and p.ns_pid != p.pid else '-':>7}"
        adj = "" if not oom else f" {'-' if p.oom_score_adj is None else p.oom_score_adj:>6}"
        lines.append(
            f"{p.pid:>7}{ns}  {name[:20]:<20} {box}{human_bytes(p.rss_bytes):>10} {peak:>10} "
            f"{human_bytes(p.anon_bytes):>10} {human_bytes(p.swap_bytes):>9}{vram}{adj}  {state:<6} {cmd}"
        )
    return "\n".join(lines)


def status_lines(status: DaemonStatus) -> list[str]:
    """``memagent status`` without ``--json``."""
    lines = [f"{status.software}, pid {status.pid}, uid {status.uid}, socket {printable(status.socket)}",
             f"watching {status.watched} processes ({status.alive} alive), {status.clients} clients"]
    hidden = (status.watched_total or 0) - status.watched
    if hidden > 0:
        lines.append(f"  and {hidden} more the daemon watches that you may not see (other users'): the headroom "
                     "and its Σ peaks below are the whole box's")
    t = status.tick
    lines.append(f"interval {status.interval:g} s: {t.ticks} ticks, mean {t.mean_interval * 1000:.1f} ms, "
          f"max lateness {t.max_lateness * 1000:.1f} ms, {t.overruns} overruns, "
          f"last tick took {t.last_duration * 1000:.2f} ms")
    h = status.host
    lines.append(f"host memory: {human_bytes(h.total_bytes - h.available_bytes)} used of {human_bytes(h.total_bytes)}, "
          f"swap {human_bytes(h.swap_total_bytes - h.swap_free_bytes)} of {human_bytes(h.swap_total_bytes)}")
    if not status.gpu_available:
        lines.append(f"GPU memory: not available ({status.gpu_note or 'unknown reason'})")
    lines.append(f"GPU source: {printable(status.gpu_source)}"
                 + (f" ({printable(status.gpu_source_note)})" if status.gpu_source_note else ""))
    lines.append(f"stack sampler: {printable(status.stack_sampler)}"
                 + (f" ({printable(status.stack_sampler_note)})" if status.stack_sampler_note else "")
                 + f", {status.sampler_bursts} bursts")
    if status.stack_cpu_budget:
        lines.append(f"stack CPU: {100 * status.stack_cpu_rate:.1f} % of a core over the last "
                     f"{status.stack_cpu_window:g} s (budget {100 * status.stack_cpu_budget:g} %); since start "
                     f"{status.stack_cpu_own_seconds:.1f} s the daemon's, {status.stack_cpu_helper_seconds:.1f} s "
                     "its helpers' (py-spy, Austin)")
    for g in status.gpus:
        state = "LOST" if g.lost else f"{human_bytes(g.used_bytes)} used of {human_bytes(g.total_bytes)}"
        lines.append(f"GPU {g.index}: {printable(g.name)} {printable(g.uuid)}: {state}")
    for hr in status.headroom:
        ratio = f"{hr.ratio:.0%}" if hr.ratio is not None else "n/a"
        is_cgroup = hr.resource.startswith(Resource.CGROUP_PREFIX)
        cgroup = hr.resource[len(Resource.CGROUP_PREFIX):] if is_cgroup else None
        lines.append(f"headroom {printable(hr.name)}: Σ peaks {human_bytes(hr.sum_peaks_bytes)} of "
                     f"{human_bytes(hr.capacity_bytes)} ({ratio})" + (" [configured]" if hr.configured else "")
                     + (f"; limit {human_bytes(hr.limit_bytes)} of cgroup {printable(cgroup)}" if cgroup else ""))
    lines.append(f"process events: {printable(status.process_events)}"
                 + (f" ({printable(status.process_events_note)})" if status.process_events_note else ""))
    where = f" in {printable(status.recording_dir)}" if status.recording_dir else ""
    lines.append(f"flight recorder: {printable(status.recording)}"
                 + (f", {human_bytes(status.recording_bytes)}{where}" if status.recording != "off" else "")
                 + (f" ({printable(status.recording_note)})" if status.recording_note else ""))
    if status.oom_adjusted or status.oom_refused:
        lines.append(f"oom_score_adj: {status.oom_adjusted} processes set from [oom_score_adj]"
                     + (f", {status.oom_refused} not lowered (security.md §15)" if status.oom_refused else ""))
    if status.pressure is not None:
        lines.append(f"memory pressure (PSI some avg10): {status.pressure:.1f}%")
    for fault in status.faults:
        lines.append(f"fault: {printable(fault)}")
    for a in status.alerts_active:
        lines.append(f"ALERT {printable(a.severity)} {printable(a.kind)} [{printable(a.resource)}]: "
                     f"{printable(a.message)}")
    if not status.host_pid_namespace:
        lines.append("warning: the daemon is in a nested PID namespace; NVML's host PIDs will not match "
                     "(run it in the host PID namespace)")
    return lines


def format_stack(dump: StackDump, title: str) -> list[str]:
    when = time.strftime("%H:%M:%S", time.localtime(dump.time))
    rise = f", rising {human_bytes(dump.rss_rise)}" if dump.rss_rise is not None and dump.rss_rise > 0 else ""
    lines = [f"{title} (taken {when} on {dump.trigger}, RSS {human_bytes(dump.rss_bytes)}{rise}"
             + (f", VRAM {human_bytes(dump.vram_bytes)})" if dump.vram_bytes is not None else ")")]
    for t in dump.threads:
        mark = "*" if t.thread_id == dump.attributed_thread else " "
        state = "active" if t.active else "idle"
        lines.append(f" {mark} thread {printable(t.name) if t.name else t.thread_id} "
                     f"({state}{', holds the GIL' if t.owns_gil else ''})")
        lines.extend(f"      {frame_text(f.name, f.filename, f.line)}" for f in t.frames)
    return lines


def stack_reply_lines(reply: StackOk) -> list[str]:
    """``memagent stack`` without ``--json``: the state, the latest stack, the stack at the
    peak, and where memory grew."""
    lines = [f"{reply.pid}: stack state {reply.state}" + (f": {printable(reply.message)}" if reply.message else "")]
    if reply.latest:
        lines += format_stack(reply.latest, "latest stack")
    if reply.at_peak and reply.at_peak != reply.latest:
        lines += format_stack(reply.at_peak, "stack at peak")
    elif reply.at_peak:
        lines.append("stack at peak: the latest stack")
    elif reply.stack_at_peak_state == AtPeakState.MISSED:
        lines.append("stack at peak: missed (no stack was taken while memory rose to the peak)")
    if reply.by_line:
        lines.append("where memory grew (stacks read while the RSS rose; correlation, not proof):")
        lines += [f"  {human_bytes(s.bytes):>10}  {s.samples:>4}x  {frame_text(s.function, s.filename, s.line)}"
                  for s in reply.by_line[:10]]
    return lines
