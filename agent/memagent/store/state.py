"""The state directory: the watched set and the peaks of exited processes, kept across
restarts in ``state.json`` (what is kept and how it is taken back: :mod:`memagent.core.restore`).

The directory. A root daemon must not be steered by another user's files, so the directory
must be a real directory (not a symbolic link), owned by the daemon's user, and not
writable by group or others; else the daemon refuses to start (one line, exit 2), never
repairs it. A missing one is created, mode 0700. It is opened once (``O_NOFOLLOW``) and
every later access goes through that descriptor: a parent renamed or replaced afterwards
changes nothing. The daemon holds an ``flock`` on it while it runs, so a second daemon given
the same directory (on another socket) is refused rather than overwriting the first's
state and recordings.

The file holds the watched set and the group rules of ``attach --cgroup/--unit/
--container`` (each with its owner's UID: restored with that user's rights only), and
the observed maximum of each headroom resource (the highest total seen together,
:mod:`memagent.alerting.observed`: over the daemon's window, restarts included).
Written whole, atomically: a temporary file in the directory, ``fsync``, ``rename`` over
``state.json``, ``fsync`` of the directory, so a crash (SIGKILL, power) leaves the
previous file or the new one, never half of one. It is written in a thread, never on the
event loop (:class:`StateKeeper`): within a second of a change of the set (attach, detach,
exit, reset-peaks, a label, a group rule), every 10 s while only peaks (or an observed
maximum) grow, and at
shutdown; a write that failed (a full disk) is tried again until it works. A file that cannot be read or
understood (corrupt, truncated, another format version) is renamed aside
(``state.json.corrupt-<time>``) with one warning line, and the daemon starts with
nothing restored.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..alerting.observed import HighestTogether
from ..core.groups import GroupRule, Groups
from ..core.registry import Registry
from ..core.restore import Saved
from ..errors import ConfigError

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
#: The format of ``state.json``; a file of another version is moved aside, not guessed at.
FORMAT_VERSION = 1
#: A bigger file is not ours (256 exited entries and thousands of live ones fit easily).
MAX_STATE = 64 * 1024 * 1024
DIR_MODE = 0o700
FILE_MODE = 0o600
#: Seconds between two checks for a change to save (a burst of attaches: one write).
SAVE_EVERY = 1.0
#: Seconds between two tries of a save that failed, while nothing changes (a full disk).
RETRY_EVERY = 10.0
#: While only peaks grow, a write at most this often (a process that dies while the daemon
#: is down is listed with the last peak saved).
PEAK_SAVE_EVERY = 10.0


def _refuse(path: str, why: str) -> ConfigError:
    return ConfigError("state_dir", f"{path} {why}; not using it")


class StateDir:
    """The checked, opened state directory; :class:`ConfigError` (key ``state_dir``) when
    it is not one to trust."""

    def __init__(self, path: str) -> None:
        self.path = path
        euid = os.geteuid()
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            try:
                os.makedirs(path, DIR_MODE)
            except OSError as exc:
                raise _refuse(path, f"cannot be created: {exc.strerror or exc}") from None
            log.info("created state directory %s (mode %04o, less the umask)", path, DIR_MODE)
            st = os.lstat(path)
        except OSError as exc:
            raise _refuse(path, f"cannot be read: {exc.strerror or exc}") from None
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(path, "is a symbolic link")
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise _refuse(path, f"cannot be opened as a directory: {exc.strerror or exc}") from None
        st = os.fstat(self.fd)
        why = None
        if st.st_uid != euid:
            why = f"is owned by uid {st.st_uid}, not by the daemon's uid {euid}"
        elif st.st_mode & 0o022:
            why = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        if why is None:
            try:  # on the directory itself: held while the descriptor is open, let go at any death
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                why = "is in use by another memagent daemon (each daemon needs its own state_dir)"
        if why is not None:
            os.close(self.fd)
            raise _refuse(path, why)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def load(self) -> tuple[list[Saved], list[GroupRule], HighestTogether]:
        """The saved entries, group rules (``attach --cgroup/--unit/--container``) and
        observed maxima (both absent from older files); none when there is no file, and
        none (the file moved aside, one warning) when it cannot be read or understood."""
        try:
            fd = os.open(STATE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.fd)
        except FileNotFoundError:
            return [], [], HighestTogether()
        except OSError as exc:
            self._move_aside(f"cannot be opened: {exc.strerror or exc}")
            return [], [], HighestTogether()
        try:
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise ValueError("not a regular file")
                raw = f.read(MAX_STATE + 1)
            if len(raw) > MAX_STATE:
                raise ValueError(f"larger than {MAX_STATE // (1024 * 1024)} MiB")
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
                found = data.get("version") if isinstance(data, dict) else None
                raise ValueError(f"format version {found!r:.20}, not {FORMAT_VERSION}")
            entries, rules = data.get("entries"), data.get("rules", [])
            if not isinstance(entries, list) or not isinstance(rules, list):
                raise ValueError("no list of entries or rules")
            observed = HighestTogether.from_json(data.get("observed", {}))
            return [Saved.from_json(e) for e in entries], [GroupRule.from_json(r) for r in rules], observed
        except (OSError, ValueError, RecursionError) as exc:  # json.JSONDecodeError, UnicodeError: ValueError
            self._move_aside(str(exc))
            return [], [], HighestTogether()

    def _move_aside(self, why: str) -> None:
        aside = f"{STATE_FILE}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
        try:
            os.rename(STATE_FILE, aside, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            log.warning("state file %s/%s not usable (%s) and not moved aside (%s); starting with nothing "
                        "restored", self.path, STATE_FILE, why, exc.strerror or exc)
            return
        log.warning("state file %s/%s not usable (%s): moved aside to %s; starting with nothing restored",
                    self.path, STATE_FILE, why, aside)

    def save(self, saved: list[Saved], rules: list[GroupRule] | None = None,
             observed: dict[str, object] | None = None) -> None:
        """Replace the file atomically (module doc); OSError when it could not be.
        ``observed``: :meth:`HighestTogether.to_json`'s."""
        body = json.dumps({"version": FORMAT_VERSION, "saved_at": time.time(),
                           "entries": [s.to_json() for s in saved],
                           "rules": [r.to_json() for r in rules or []],
                           "observed": observed or {}}, separators=(",", ":")).encode()
        tmp = f"{STATE_FILE}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=self.fd)  # O_EXCL below: never write through a planted file
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE,
                     dir_fd=self.fd)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, STATE_FILE, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        os.fsync(self.fd)  # the rename itself, durable


class StateKeeper:
    """Saves the registry's state when it changed (module doc), off the event loop.

    What is saved is taken on the loop (a list of frozen records: cheap, and consistent
    with one moment); it is encoded, written, synced and renamed in a thread of the
    keeper's own, one write at a time. Changes made while a write is in flight are saved by
    the next one, so a burst of changes makes one write a second at most, the latest state
    winning. A write that fails (a full disk, an I/O error) leaves the state unsaved: it is
    tried again at the next change, and every :data:`RETRY_EVERY` seconds without one, so a
    change made while the disk is full reaches it once there is room; the failure is one
    warning line (one line again when a save works) and a line in the status's ``faults``
    meanwhile."""

    def __init__(self, state: StateDir, registry: Registry, groups: Groups | None = None,
                 observed: HighestTogether | None = None) -> None:
        """``observed``: the alert engine's fold of the observed maxima, saved with the rest."""
        self.state = state
        self.registry = registry
        self.groups = groups
        self.observed = observed
        self._edits = registry.edits
        self._peaks = self._growth_mark()
        self._saved_at = time.monotonic()
        #: A change is not on disk (the last write failed); when to try again without a change.
        self._unsaved = False
        self._retry_at = 0.0
        #: Why the last write failed (status ``faults``); None while saving works.
        self.fault: str | None = None
        self._io = ThreadPoolExecutor(1, thread_name_prefix="memagent-state")

    def _growth_mark(self) -> tuple[int, int]:
        """What grows without an edit: the peaks' sum, and the observed fold's version (a new maximum)."""
        return sum(w.peak for w in self.registry.entries.values()), self.observed.version if self.observed else 0

    def due(self, now: float) -> bool:
        if self.registry.edits != self._edits:
            return True
        if self._unsaved:
            return now >= self._retry_at
        return now - self._saved_at >= PEAK_SAVE_EVERY and self._growth_mark() != self._peaks

    def _take(self) -> Callable[[], None]:
        """What to save, taken now (on the loop), as the write to run in the thread."""
        self._edits, self._peaks, self._saved_at = self.registry.edits, self._growth_mark(), time.monotonic()
        saved = [Saved.of(w) for w in self.registry.entries.values()]
        rules = self.groups.rules if self.groups is not None else []
        observed = self.observed.to_json() if self.observed is not None else None
        return lambda: self.state.save(saved, rules, observed)

    def _done(self, error: OSError | None) -> None:
        """Note how a write ended: a failure keeps the state unsaved (module doc)."""
        if error is None:
            if self._unsaved:
                log.info("state saved in %s again", self.state.path)
            self._unsaved, self.fault = False, None
            return
        why = error.strerror or str(error)
        if not self._unsaved:
            log.warning("cannot save the state in %s: %s; retrying on the next change and every %.0f s",
                        self.state.path, why, RETRY_EVERY)
        self._unsaved, self._retry_at = True, time.monotonic() + RETRY_EVERY
        if self.fault is None:  # since the first failure, not the latest
            self.fault = f"state changes not saved since {time.strftime('%H:%M:%S')}: {why}; retrying"

    async def save_now(self) -> None:
        """Save what there is now, in the keeper's thread (after a write in flight)."""
        write = self._take()
        try:
            await asyncio.get_running_loop().run_in_executor(self._io, write)
        except OSError as exc:
            self._done(exc)
        else:
            self._done(None)

    def save(self) -> None:
        """Save now and wait for it (at shutdown, and in tests): a write in flight first."""
        write = self._take()
        try:
            self._io.submit(write).result()
        except OSError as exc:
            self._done(exc)
        else:
            self._done(None)

    def close(self) -> None:
        self._io.shutdown(wait=True)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SAVE_EVERY)
            if self.due(time.monotonic()):
                await self.save_now()
