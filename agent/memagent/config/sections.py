"""The daemon's configuration as typed sections, each field declared once with its key.

Each field that is a configuration key says everything about it where it is declared
(:func:`memagent.config.keys.key`): its file key, its check and range, its default,
whether SIGHUP applies it, its flag and one line of doc. :data:`KEYS` is derived from the
fields; the schema, the daemon's flags, the file-and-flags merge, the reload split and
the doc table are derived from :data:`KEYS`. A field declared plainly is no key: the
embedded agent, the demo or a test may set it, the file may not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .auto import DEFAULT_WRAPPERS, check_cmdline_patterns, check_names_list, check_template, check_users
from .checks import (
    RESERVED_FOR_ADMINS,
    Choice,
    KiB,
    MiB,
    Number,
    Size,
    Whole,
    boolean,
    group,
    nonempty,
    oom_scores,
    path_or_empty,
    program_path,
    user,
)
from .checks import (
    budgets as label_sizes,
)
from .checks import (
    hook as hook_command,
)
from .keys import LIVE, RESTART, Key, Table, flag, key, keys_of
from .metrics import PER_PROCESS, file_path
from .metrics import listen as listen_address

SECONDS, DAY = "seconds", 86_400.0


@dataclass
class HeadroomConfig:
    """What the headroom is measured against (docs/headroom.md)."""

    #: Memory the watched processes may use altogether; None: derived (see docs/headroom.md).
    host_capacity: int | None = key(
        "host.capacity", Size(MiB), None, reload=LIVE, shown_default="none: derived",
        doc="What the watched processes may use altogether; left out, derived at every tick (headroom.md).")
    #: Kept free for everything else (used only when capacity is derived).
    host_reserve: int = key("host.reserve", Size(), 256 * MiB, reload=LIVE,
                            doc="Memory kept free for everything else; used only when `capacity` is derived.")
    gpu_reserve: int = key("gpu.reserve", Size(), 256 * MiB, reload=LIVE,
                           doc="Per GPU: memory kept free, subtracted from the GPU's total in its headroom.")
    #: Seconds between two PSS reads of a process (smaps_rollup holds its mmap lock).
    pss_refresh: float = key("host.pss_refresh", Number(1.0, DAY, SECONDS), 30.0, reload=LIVE,
                             doc="Seconds between two reads of a process's PSS (it takes the process's mmap lock).")
    #: Re-read the PSS of sharing processes when the host's used memory drifts this far
    #: from what the watched processes are thought to use (see docs/headroom.md).
    pss_drift: int = key("host.pss_drift", Size(MiB), 64 * MiB, reload=LIVE,
                         doc="Host memory used drifting this far from the watched processes' re-reads their PSS.")


@dataclass
class AlertConfig:
    """When alerts fire and resolve, and the hook they run (docs/headroom.md)."""

    warn_fraction: float = key("alerts.warn_fraction", Number(0.0, 10.0, above=True), 0.9, reload=LIVE,
                               doc="Headroom ratio (Σ peaks / capacity) at which a `headroom` alert warns.")
    critical_fraction: float = key("alerts.critical_fraction", Number(0.0, 10.0, above=True), 1.0, reload=LIVE,
                                   doc="… and at which it is critical; not below `warn_fraction`.")
    #: A firing alert resolves only below threshold * (1 - hysteresis).
    hysteresis: float = key("alerts.hysteresis", Number(0.0, 0.5), 0.05, reload=LIVE,
                            doc="A firing alert ends only below its threshold × (1 − `hysteresis`).")
    hook: list[str] = key("alerts.hook", hook_command, [], reload=LIVE, shown_default="none: no hook",
                          doc="A command (argument vector) run for every alert delivery, the alert as JSON on stdin.")
    hook_timeout: float = key("alerts.hook_timeout", Number(0.1, 600.0, SECONDS), 5.0, reload=LIVE,
                              doc="Seconds a hook may run; it is then killed with whatever it started.")
    #: Whom the hook runs as when the daemon is root (a user name or a numeric UID).
    hook_user: str = key("alerts.hook_user", user, "nobody", reload=LIVE,
                         doc="Whom the hook runs as when the daemon is root: a user name or a UID as a string.")
    #: Per alert key (kind, resource): at most one hook run per this many seconds; a newer
    #: alert of the key waits, the latest one per key (see :mod:`memagent.alerting.hooks`).
    hook_min_interval: float = key("alerts.hook_min_interval", Number(0.0, DAY, SECONDS), 10.0, reload=LIVE,
                                   doc="Per alert key: at most one hook run per this many seconds (coalesced).")
    #: For the whole daemon: hook runs per second, and how many at once after a lull.
    hook_rate: float = key("alerts.hook_rate", Number(0.001, 100.0, "per second"), 1.0, reload=LIVE,
                           doc="For the whole daemon: hook runs per second, on average (a token bucket).")
    hook_burst: int = key("alerts.hook_burst", Whole(1, 100), 5, reload=LIVE,
                          doc="Hook runs allowed at once after a quiet spell (the token bucket's size).")
    #: Memory PSI ``some avg10`` (percent of time stalled) that fires a pressure alert.
    pressure_threshold: float = key("alerts.pressure_threshold", Number(0.0, 100.0, "percent", above=True), 10.0,
                                    reload=LIVE, doc="Memory PSI `some avg10` (percent) at which a `pressure` "
                                                     "alert warns; critical at 3 × this.")
    #: Leak: sustained growth of at least ``leak_min_rate`` bytes a minute, with the headroom
    #: gone within ``leak_horizon`` seconds at that pace; it must have lasted 1% of that
    #: time, 20 s to ``leak_window`` seconds (see memagent.alerting.growth).
    leak_window: float = key("alerts.leak_window", Number(1.0, DAY, SECONDS), 300.0, reload=LIVE,
                             doc="The most seconds of history a `leak` is judged on, and the longest it must last.")
    leak_min_rate: int = key("alerts.leak_min_rate", Size(KiB), 1 * MiB, reload=LIVE,
                             doc="Growth per minute below which nothing is a leak.")
    leak_horizon: float = key("alerts.leak_horizon", Number(60.0, 365 * DAY, SECONDS), 86400.0, reload=LIVE,
                              doc="A growth is a leak only if the headroom is gone within this many seconds.")
    #: Per-label budgets (Σ of the peaks of the processes with that label), bytes.
    budgets: dict[str, int] = key("budgets", label_sizes, {}, reload=LIVE, shown_default="none",
                                  doc="The `[budgets]` table: label = size, a budget for the label's Σ peaks.")
    #: How many ended alerts ``status`` keeps.
    recent: int = key("alerts.recent", Whole(0, 10_000), 100, reload=LIVE,
                      doc="How many ended (and `oom-kill`) alerts `memagent status` keeps.")


@dataclass
class StackConfig:
    """When and how Python stacks are read (see :mod:`memagent.core.stack_collector`)."""

    enabled: bool = key("stacks.enabled", boolean, True, reload=RESTART,
                        doc="Read Python stacks with py-spy (stacks.md).",
                        flag=flag("--no-stacks", switch_off=True, help="do not read Python stacks with py-spy"))
    #: py-spy executable; None: look on PATH, then beside this Python.
    py_spy: str | None = key("stacks.py_spy", program_path, None, reload=RESTART,
                             shown_default="none: on `PATH`, else beside Python", doc="The py-spy executable.",
                             flag=flag("--py-spy", metavar="PATH",
                                       help="py-spy executable (default: on PATH, then beside Python)"))
    #: Dumps per second for the whole box, and how many may be taken at once after a lull.
    budget: float = key("stacks.budget", Number(0.01, 100.0, "per second"), 4.0, reload=LIVE,
                        doc="py-spy dumps per second for the whole daemon.",
                        flag=flag("--stack-budget", metavar="PER_SECOND",
                                  help="py-spy dumps per second for the whole box (4)"))
    burst: int = 4
    #: py-spy processes running at the same time, at most.
    concurrency: int = 2
    timeout: float = key("stacks.timeout", Number(0.1, 60.0, SECONDS), 2.0, reload=LIVE,
                         doc="A py-spy dump still running after this many seconds is killed.",
                         flag=flag("--stack-timeout", metavar="SECONDS",
                                   help="a py-spy dump taking longer is killed (2)"))
    #: Growth between two ticks (RSS + VRAM) that triggers a dump.
    growth_threshold: int = key("stacks.growth_threshold", Size(64 * KiB), 32 * MiB, reload=LIVE,
                                doc="Growth of RSS + VRAM between two ticks that triggers a dump.")
    #: Every watched Python process gets a stack at least this often.
    rotation: float = key("stacks.rotation", Number(1.0, DAY, SECONDS), 30.0, reload=LIVE,
                          doc="A Python process with no dump and no request for this many seconds gets one.")
    #: What samples a growing process: "austin" (100 Hz), "dumps" (py-spy, costly) or "off".
    sampler: str = key("stacks.sampler", Choice("austin", "dumps", "off"), "austin", reload=RESTART,
                       doc="What samples a growing process: Austin bursts at 100 Hz, py-spy dumps, or none.",
                       flag=flag("--stack-sampler", choices=("austin", "dumps", "off"),
                                 help="what samples a growing process's stacks: austin (100 Hz, default), dumps "
                                      "(py-spy dumps in a row: slows an allocating target ~10 %%), off "
                                      "(docs/stacks.md)"))
    #: The share of one core all stack work may use: the daemon's and its helpers' (py-spy,
    #: Austin), over a sliding window (memagent.core.stack_budget).
    cpu_budget: float = key("stacks.cpu_budget", Number(0.005, 16.0, "cores"), 0.04, reload=LIVE,
                            doc="The share of one core all stack work may use, the daemon's own and its "
                                "helpers' (py-spy, Austin), over the last 10 s; while spent, no burst starts, "
                                "the costliest stop and only `stack` requests are dumped (stacks.md).")
    austin: str | None = key("stacks.austin", program_path, None, reload=RESTART,
                             shown_default="none: on `PATH`, else beside Python", doc="The Austin executable (3.x).",
                             flag=flag("--austin", metavar="PATH",
                                       help="Austin executable (default: on PATH, then beside Python)"))


@dataclass
class RecordConfig:
    """The flight recorder (memagent.store.recorder, docs/recording.md)."""

    enabled: bool = key("record.enabled", boolean, True, reload=RESTART, doc="Record (docs/recording.md).",
                        flag=flag("--no-record", switch_off=True,
                                  help="no flight recorder (the sample stream and events kept on disk in the "
                                       "state directory)"))
    #: The recorder's segments together, at most (the oldest go first).
    max_bytes: int = key("record.max_bytes", Size(MiB), 256 * MiB, reload=LIVE,
                         doc="The recorder's segments together, at most: the oldest are removed first.")
    #: A segment's size before the next begins; None: max_bytes / 16, from 256 KiB to 16 MiB.
    segment_bytes: int | None = key("record.segment_bytes", Size(4 * KiB, 16 * MiB), None, reload=LIVE,
                                    shown_default="`max_bytes` / 16, from 256 KiB to 16 MiB",
                                    doc="A segment ends once this large and the next begins; at most half of "
                                        "`max_bytes`.")
    #: Seconds between two tries to write again after a full disk.
    retry_interval: float = key("record.retry_interval", Number(0.1, 3600.0, SECONDS), 10.0, reload=LIVE,
                                doc="Seconds between two tries to write again once a write failed (a full disk).")

    @property
    def segment_size(self) -> int:
        return self.segment_bytes or min(16 * MiB, max(MiB // 4, self.max_bytes // 16))


@dataclass
class MetricsConfig:
    """The Prometheus endpoint and the node_exporter textfile (docs/metrics.md), each off unless configured."""

    #: ``ADDR:PORT`` of the HTTP endpoint; None: no endpoint.
    listen: str | None = key("metrics.listen", listen_address, None, reload=RESTART, shown_default="none: no endpoint",
                             doc="Serve Prometheus metrics at `http://ADDR:PORT/metrics` (unauthenticated).",
                             flag=flag("--metrics", metavar="ADDR:PORT",
                                       help="serve Prometheus metrics at http://ADDR:PORT/metrics, e.g. "
                                            "127.0.0.1:9478 ([metrics] listen; docs/metrics.md)"))
    #: The file written for node_exporter's textfile collector; None: none.
    textfile: str | None = key("metrics.textfile", file_path, None, reload=LIVE, shown_default="none: no file",
                               doc="Write the exposition here every `textfile_interval`, for node_exporter.")
    textfile_interval: float = key("metrics.textfile_interval", Number(1.0, DAY, SECONDS), 15.0, reload=LIVE,
                                   doc="Seconds between two writes of the textfile.")
    #: Seconds an exited process stays in the exposition.
    exited_ttl: float = key("metrics.exited_ttl", Number(0.0, DAY, SECONDS), 300.0, reload=LIVE,
                            doc="Seconds an exited process stays in the exposition.")
    per_process: str = key("metrics.per_process", Choice(*PER_PROCESS), "pid", reload=LIVE,
                           doc="`\"label\"`: the per-process metrics are one series per label (sums).")


class Origin(Protocol):
    """Where a configuration came from, to make it again the same way on SIGHUP
    (:class:`memagent.config.source.ConfigSource`)."""

    @property
    def path(self) -> str | None: ...

    def load(self) -> AgentConfig: ...


def _socket_key() -> Any:
    """``socket``: the one key without a default here (a daemon's comes from
    memproto.paths.socket_path), hence the only field that must be given."""
    meta = Key("socket", nonempty, None, RESTART, "Path of the daemon's Unix socket (clients do not read it).",
               shown_default="see protocol.md §2.2")
    return field(metadata={"key": meta})


@dataclass
class OomConfig:
    """What the kernel's OOM killer is told of each label (docs/oom.md): the operator's
    ``oom_score_adj`` per label, and whose processes may be given a lower one."""

    #: Per label, the ``oom_score_adj`` written for its processes (-1000 to 1000).
    scores: dict[str, int] = key(
        "oom_score_adj", oom_scores, {}, reload=LIVE, shown_default="none: no process touched",
        doc="The `[oom_score_adj]` table: label = -1000 to 1000, written to its processes' `oom_score_adj` "
            "(oom.md); a lower value only as security.md §15 allows.")
    #: Users besides root whose processes may be given a lower score than their own.
    trusted_users: list[str] = key(
        "oom.trusted_users", check_users, [], reload=LIVE, shown_default="none: root's processes only",
        doc="Users besides root whose processes an operator's label may give a lower `oom_score_adj` "
            "(security.md §15).")


@dataclass
class AgentConfig:
    """Everything an agent (daemon, embedded or demo) is built from."""

    socket: str = _socket_key()
    interval: float = key("interval", Number(0.01, 60.0, SECONDS), 0.5, reload=RESTART,
                          doc="Seconds between two ticks (samples).",
                          flag=flag("--interval", metavar="SECONDS", help="sample interval (0.5)"))
    #: Executable names (comm or exe basename), fnmatch.
    auto: list[str] = key("auto", check_names_list, [], reload=LIVE,
                          doc="Attach every process whose executable name matches one of these shell patterns.",
                          flag=flag("--auto", metavar="PATTERN", repeat=True, checked=False,
                                    help="attach every process whose executable name matches (repeatable), e.g. "
                                         "'python*'"))
    #: Command-line patterns (glob, or ``re:REGEX``).
    auto_cmdline: list[str] = key(
        "auto_cmdline", check_cmdline_patterns, [], reload=LIVE,
        doc="Attach every process whose command line matches one of these: a glob, or `re:REGEX`.",
        flag=flag("--auto-cmdline", metavar="PATTERN", repeat=True,
                  help="attach every process whose command line matches (repeatable): a glob, e.g. '*serve.py*', "
                       "or 're:REGEX' whose groups feed --auto-label (docs/containers.md)"))
    #: Programs that only start another (sh -c, runuser, env, ...): not attached by a
    #: command-line pattern when a child of theirs matches it too ([] attaches them as any).
    auto_wrappers: list[str] = key(
        "auto_wrappers", check_names_list, list(DEFAULT_WRAPPERS), reload=LIVE,
        shown_default="sh bash dash zsh su sudo runuser setpriv env timeout nice ionice nohup stdbuf taskset "
                      "chrt numactl tini dumb-init",
        doc="Names of wrapper programs: a wrapper whose command line matches `auto_cmdline` is not attached when "
            "its own child matches too (containers.md).")
    #: Label template of auto-attached processes (None: a regex's first group, else none).
    auto_label: str | None = key(
        "auto_label", check_template, None, reload=LIVE, shown_default="none: a `re:` match's first group",
        doc="Label of auto-attached processes: text and placeholders (containers.md).",
        flag=flag("--auto-label", "--label", metavar="TEMPLATE",
                  help="label of auto-attached processes: text and {comm} {exe} {container} {unit} {pid} "
                       "{1} {NAME} (regex groups), e.g. '{container}'"))
    #: Users (names or UIDs) whose auto-attached processes' labels count in budgets, as root's do.
    auto_trusted_users: list[str] = key(
        "auto_trusted_users", check_users, [], reload=LIVE, shown_default="none: root and the daemon's own user",
        doc="Users whose auto-attached processes' labels are trusted (budgets, alerts), as root's are "
            "(security.md §8).")
    #: Members of this group see and change every watched process, as root does.
    admin_group: str | None = key("admin_group", group, None, reload=LIVE, shown_default="none",
                                  doc="Members see and change every watched process, as root does (security.md).",
                                  flag=flag("--admin-group", metavar="GROUP",
                                            help="members see every process, as root does"))
    #: The socket file's group: its members may connect.
    socket_group: str | None = key("socket_group", group, None, reload=RESTART, shown_default="none",
                                   doc="The socket file's group: its members may connect.",
                                   flag=flag("--socket-group", metavar="GROUP",
                                             help="group of the socket file: its members may connect"))
    #: Where the watched set and the peaks of exited processes are kept across restarts
    #: (memagent.store.state); None: nowhere (embedded, demo, or ``state_dir = ""``).
    state_dir: str | None = key(
        "state_dir", path_or_empty, None, reload=RESTART,
        shown_default="`/var/lib/memagent` as root, `$XDG_STATE_HOME/memagent` otherwise, on the default socket only",
        doc="Where the watched set and the exited peaks are kept across restarts (`\"\"`: nowhere).",
        flag=flag("--state-dir", metavar="DIR",
                  help="keep the watched set and exited peaks here across restarts ('' : none; default: "
                       "/var/lib/memagent as root, $XDG_STATE_HOME/memagent otherwise, on the default socket)"))
    history_seconds: float = key("history", Number(1.0, DAY, SECONDS), 600.0, reload=RESTART,
                                 doc="Seconds of per-process RSS history kept (4 bytes a value).",
                                 flag=flag("--history", metavar="SECONDS", help="history kept (600)"))
    history_step: float = 1.0
    #: Longest time between two reads of a process's VmHWM and swap (when statm is unchanged).
    status_refresh: float = key(
        "status_refresh", Number(0.01, 600.0, SECONDS), 1.0, reload=LIVE,
        doc="Longest time between two reads of an unchanged process's kernel peak and swap.",
        flag=flag("--status-refresh", metavar="SECONDS",
                  help="longest time between two reads of an unchanged process's kernel peak and swap (1)"))
    scan_interval: float = 1.0
    max_exited: int = 256
    #: Connections at once; the last 8 are kept for root and admin-group clients.
    max_clients: int = key("clients.max", Whole(RESERVED_FOR_ADMINS + 1, 10_000), 64, reload=LIVE,
                           doc=f"Connections at once; the last {RESERVED_FOR_ADMINS} are kept for root and "
                               "`admin_group`.")
    #: Connections one non-admin UID may hold at once.
    max_clients_per_uid: int = key("clients.max_per_uid", Whole(1, 10_000), 8, reload=LIVE,
                                   doc="Connections one UID may hold at once, unless root or in `admin_group`.")
    #: Group rules (attach --cgroup/--unit/--container) one non-admin UID may keep at once.
    max_rules_per_uid: int = key("clients.max_rules_per_uid", Whole(0, 100_000), 64, reload=LIVE,
                                 doc="Group rules (`attach --cgroup/--unit/--container`) one UID may keep, "
                                     "unless root or in `admin_group`.")
    #: Group rules all non-admin UIDs together may keep; root and admin_group have as many again.
    max_rules: int = key("clients.max_rules", Whole(0, 100_000), 1024, reload=LIVE,
                         doc="Group rules all users together may keep; root and `admin_group` have as many "
                             "again of their own.")
    #: A client neither subscribed nor sending requests for this long is closed (seconds).
    client_idle_timeout: float = key("clients.idle_timeout", Number(0.1, DAY, SECONDS), 60.0, reload=LIVE,
                                     doc="Seconds after which a client neither subscribed nor asking is closed.")
    headroom: HeadroomConfig = field(default_factory=HeadroomConfig)
    #: Read GPU memory through NVML (when a driver is there).
    gpu: bool = key("gpu.enabled", boolean, True, reload=RESTART, doc="Read GPU memory through NVML.",
                    flag=flag("--no-gpu", switch_off=True, help="do not read GPU memory through NVML"))
    #: Jetson's nvmap clients file (None: memagent.proc.nvmap's default; "": not read): docs/gpu.md.
    nvmap_clients: str | None = key(
        "gpu.nvmap_clients", path_or_empty, None, reload=RESTART,
        shown_default="`/sys/kernel/debug/nvmap/iovmm/clients`",
        doc="A Jetson's nvmap clients file, the GPU source when readable at start (`\"\"`: never; gpu.md).")
    #: Hear process events from the kernel over netlink (fork, exec, exit records) where
    #: the daemon may; false: poll /proc only (see memagent.core.process_events).
    netlink: bool = key("events.netlink", boolean, True, reload=RESTART,
                        doc="Listen to the kernel's process events over netlink (fork, exec, exit records).",
                        flag=flag("--no-netlink", switch_off=True,
                                  help="do not listen to the kernel's process events (fork, exec, exit records): "
                                       "poll /proc only"))
    #: Where the container engines' files are (``/`` on a box; "": names off): docs/containers.md.
    containers_root: str = key("containers.root", path_or_empty, "/", reload=RESTART,
                               doc="Where the container engines' files are read from to name containers "
                                   "(`\"\"`: no names).")
    stacks: StackConfig = field(default_factory=StackConfig)
    alerts: AlertConfig = field(default_factory=AlertConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    oom: OomConfig = field(default_factory=OomConfig)
    #: Where the daemon's configuration came from, to read it again on SIGHUP (set by
    #: :func:`memagent.config.agent_config`; None for an agent built otherwise: embedded, demo, tests).
    source: Origin | None = field(default=None, compare=False, repr=False)


#: Every key of the daemon's configuration, in field order: the one table.
KEYS: Table = keys_of(AgentConfig)
#: Each key by its file key.
KEY = {row.key.file: row for row in KEYS}
#: Keys the file may no longer hold, each with the one line that names its replacement:
#: refused rather than ignored, so that a bound the operator set is never silently gone.
RETIRED = {
    "stacks.sampler_cpu": "no longer a key: [stacks] cpu_budget replaces it (the share of one core all stack "
                          "work may use, the daemon's own and py-spy's with Austin's; stacks.md)",
}


def default_of(file_key: str) -> Any:
    """A key's default (the one place it is written is its field)."""
    return KEY[file_key].key.default
