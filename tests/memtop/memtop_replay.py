"""A fixed frame sequence for memtop's snapshot tests: what a daemon would send about a
small fleet, with every time and value fixed so the screen is the same on every run."""

from __future__ import annotations

import math

from memproto.frames import AlertRaised, Exited, Frame, HistoryOk, ListOk, Sample, StackOk, StatusOk
from memproto.records import (
    SAMPLE_COLUMNS,
    SAMPLE_FIELDS,
    Alert,
    Contributor,
    DaemonStatus,
    GpuInfo,
    GrowthSite,
    Headroom,
    HostMemory,
    ProcessInfo,
    Series,
    StackDump,
    StackFrame,
    ThreadStack,
    TickStats,
)

MiB = 1024 * 1024
T0 = 1_800_000_000.0
INTERVAL = 0.5
TICKS = 40

#: label, base RSS MiB, amplitude MiB, shape
FLEET = [
    ("resnet50-train", 2900, 600, "saw"),
    ("bert-serve", 1800, 40, "steady"),
    ("xgb-batch", 900, 700, "spike"),
    ("onnx-detector", 640, 10, "steady"),
    ("tokenizer-pool", 310, 0, "steady"),
    ("feature-etl", 420, 90, "leak"),
    ("whisper-small", 1200, 30, "steady"),
    ("ranker", 260, 5, "steady"),
    ("sklearn-refit", 150, 400, "saw"),
    ("metrics-exporter", 45, 0, "steady"),
]
EXITED_LABEL = "nightly-export"


def _rss(base: int, amp: int, shape: str, tick: int) -> int:
    if shape == "saw":
        value = base + amp * ((tick % 10) / 10)
    elif shape == "spike":
        value = base + (amp if tick % 13 == 5 else 0)
    elif shape == "leak":
        value = base + amp * tick / TICKS
    else:
        value = base + amp * math.sin(tick / 6)
    return int(value * MiB)


def _info(i: int, label: str, alive: bool = True, rss: int = 0, peak: int = 0) -> ProcessInfo:
    pid = 4100 + i * 7
    return ProcessInfo(
        pid=pid, start_time=T0 - 3600 + i, name="python3", cmdline=["python3", "-m", f"models.{label}"],
        label=label, uid=1000, alive=alive, attached_at=T0 - 600, exited_at=None if alive else T0 - 30,
        rss_bytes=rss, rss_peak_bytes=peak, anon_bytes=int(rss * 0.9), swap_bytes=0,
        rss_peak_exact=(label != "ranker"), peak_since=T0 - 3600 + i,
    )


#: GiB of VRAM per label, on a box with GPUs.
VRAM = {"resnet50-train": 30.0, "bert-serve": 11.5, "whisper-small": 6.2, "onnx-detector": 2.1}
GiB = 1024 * MiB


def frames(gpus: bool = False) -> list[Frame]:
    """The sequence; with ``gpus`` the daemon also reports two GPUs and sends every column
    (``SAMPLE_COLUMNS``: the v1.1 VRAM ones, v1.5's ``rss_peak_exact``, the list's flag)."""
    infos = [
        _info(i, label, rss=_rss(base, amp, shape, 0), peak=int((base + amp) * MiB))
        for i, (label, base, amp, shape) in enumerate(FLEET)
    ]
    exited = _info(len(FLEET), EXITED_LABEL, alive=False, rss=700 * MiB, peak=1900 * MiB)
    out: list[Frame] = [ListOk(1, [*infos, exited])]
    # Ten minutes of history for the first process: a slow climb with one tall peak.
    hist = [int((2000 + 600 * (i / 600) + (900 if i == 420 else 0)) * MiB) for i in range(600)]
    out.append(HistoryOk(2, 1.0, [Series(infos[0].pid, infos[0].start_time, T0, hist)]))
    status = DaemonStatus(
        software="memagent 0.1.0", pid=1, uid=0, started_at=T0 - 7200, interval=INTERVAL,
        socket="/run/memagent/memagent.sock", watched=11, alive=10, clients=1,
        tick=TickStats(14400, INTERVAL, 0.002, 0, 0.0004),
        host=HostMemory(16 * 1024 * MiB, 7 * 1024 * MiB, 0, 0),
        headroom=[Headroom("host", "host memory", 13 * GiB, int(12.1 * GiB), 12.1 / 13, 16 * GiB, GiB,
                           2 * GiB, False, [Contributor(4100, "resnet50-train", int(3.4 * GiB))])],
        alerts_active=[Alert(1, "headroom", "firing", "warning", "host", 0.93, 0.9,
                             "Σ peaks 12.1 GiB would use 93% of the 13.0 GiB headroom of host memory", T0 - 5,
                             [Contributor(4100, "resnet50-train", int(3.4 * GiB))], "ratio")],
        alerts_recent=[Alert(2, "oom-kill", "firing", "critical", "pid:4177", float(2 * GiB), 0.0,
                             "etl [shard 3] (4177) was killed by the OOM killer; its peak was 2.00 GiB", T0 - 90,
                             [], "bytes", pid=4177, source="cgroup",
                             details="last RSS per second: 1.9 GiB, 2.0 GiB\nstack at peak: load (etl.py:40)")],
        gpu_available=gpus,
        gpus=[GpuInfo(0, "NVIDIA A100-SXM4-80GB", "GPU-5b1c9e2a", 80 * GiB, 41 * GiB),
              GpuInfo(1, "NVIDIA A100-SXM4-80GB", "GPU-77d0f31c", 80 * GiB, 12 * GiB)] if gpus else [],
    )
    out.append(StatusOk(3, status))
    peaks = [0] * len(FLEET)
    for tick in range(TICKS):
        rows = []
        for i, (label, base, amp, shape) in enumerate(FLEET):
            rss = _rss(base, amp, shape, tick)
            peaks[i] = max(peaks[i], rss, int((base + amp) * MiB))
            row = [infos[i].pid, infos[i].start_time, True, rss, peaks[i], int(rss * 0.9), 0]
            if gpus:
                vram = int(VRAM.get(label, 0) * GiB * (1 + 0.1 * (tick % 5 == 0)))
                row += [vram, int(VRAM.get(label, 0) * GiB * 1.1), infos[i].rss_peak_exact, None]
            rows.append(row)
        exited_row = [exited.pid, exited.start_time, False, exited.rss_bytes, exited.rss_peak_bytes,
                      exited.anon_bytes, 0]
        rows.append(exited_row + ([None, 4 * GiB, exited.rss_peak_exact, None] if gpus else []))
        fields = SAMPLE_COLUMNS if gpus else SAMPLE_FIELDS
        out.append(Sample(tick + 1, T0 + tick * INTERVAL, INTERVAL, list(fields), rows))
    out.append(Exited(exited.pid, exited.start_time, T0 - 30, exited.rss_peak_bytes))
    out.append(stack_reply(infos[0]))
    out.append(AlertRaised(Alert(3, "leak", "firing", "warning", "pid:4135", 90.0 * MiB, 60.0 * MiB,
                                 "feature-etl (4135) grows 90 MiB/min over 300 s; the headroom is gone in "
                                 "9.9 min at this pace", T0 + 19, [], "bytes/min", pid=4135, eta_seconds=594.0)))
    return out


def stack_reply(p: ProcessInfo) -> StackOk:
    """Stacks of the first process. Names are the target's data, markup-like on purpose:
    the screen must show them verbatim."""
    main = ThreadStack(1, "MainThread", True, True, [
        StackFrame("train_step", "/srv/models/resnet/train.py", 88),
        StackFrame("run_epoch", "/srv/models/resnet/train.py", 120),
        StackFrame("<module>", "/srv/models/resnet/train.py", 200),
    ])
    loader = ThreadStack(2, "[bold red]loader[/] <b>", False, False, [
        StackFrame("[link=x]fetch[/link]", "/srv/[data]/loader.py", 14),
    ])
    dump = StackDump(T0 + 10, "peak", int(3.4 * GiB), None, [loader, main], attributed_thread=1)
    return StackOk(9, p.pid, p.start_time, "ok", None, dump, dump,
                   [GrowthSite("train_step", "/srv/models/resnet/train.py", 88, int(1.2 * GiB), 14),
                    GrowthSite("load_weights", "/srv/models/resnet/io.py", 31, 600 * MiB, 2)],
                   [GrowthSite("run_epoch", "/srv/models/resnet/train.py", None, int(1.2 * GiB), 14)])
