"""The flight recorder's directory and segment files (docs/recording.md). Every method of
:class:`RecordFiles` but the constructor runs in the recorder's one I/O thread
(:mod:`memagent.store.recorder`), in the order the recorder submitted them, never on the
event loop and never two at a time.

The directory is ``<state_dir>/record``: made mode 0700, then opened ``O_NOFOLLOW``
through the state directory's descriptor and checked as the state directory is (a real
directory, the daemon's own, not writable by group or others); a symbolic link planted
there, or a directory not to trust, leaves the recorder off with one warning line. Every
file is reached through that descriptor: a segment is written under a temporary name
(``….mrec.part``, created ``O_EXCL | O_NOFOLLOW``, mode 0600) until its header and
keyframe are in, then renamed to its name, so a reader never meets a segment without
its header; what a SIGKILL leaves of a temporary is removed at the next start. The
temporary is synced before the rename and the directory after it, so a power loss leaves
either no segment or a whole header and keyframe, never a zero-length segment.

A full disk (ENOSPC, EDQUOT) is met by freeing the recorder's *own* oldest segments, one at
a time, and trying again; the newest is always kept, and only when nothing more is ours to
free does the write fail (and the recorder pause). The same at the start when the disk
has less free than a segment's room. A ``record/`` removed while the daemon runs (its
descriptor's link count is 0) is seen at the next write and made again, with the same
checks, through the state directory's descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import time

from memproto.recording import SUFFIX, pack_batch

from ..errors import RecordDirRefused

log = logging.getLogger(__name__)

RECORD_SUBDIR = "record"
DIR_MODE = 0o700
FILE_MODE = 0o600
#: A write that fails with these frees our oldest segments and tries again.
FULL = (errno.ENOSPC, errno.EDQUOT)
#: The suffix of a segment still being begun (header and keyframe not yet all written).
PART = ".part"
#: ``20261201T004959Z-000001.mrec``: the segment's UTC start, then its sequence number.
NAME = re.compile(r"^\d{8}T\d{6}Z-(\d{6,})" + re.escape(SUFFIX) + "$")


def segment_name(start: float, sequence: int) -> str:
    """Names sort in write order within a second and across days: UTC start, then sequence."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(start)) + f"-{sequence:06d}{SUFFIX}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # a regular file does not do this; never spin on it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


class RecordFiles:
    """The segments on disk: the closed ones (sequence → name, size) and the one being written."""

    def __init__(self, state_fd: int, state_path: str) -> None:
        self.path = os.path.join(state_path, RECORD_SUBDIR)
        self.state_fd = state_fd
        self.fd = self._open_dir()
        #: Closed segments by sequence number: (name, bytes).
        self.closed: dict[int, tuple[str, int]] = {}
        #: Their bytes together (an int the event loop may read while this thread works).
        self.closed_bytes = 0
        self.current_fd = -1
        self.current: tuple[int, str] | None = None
        #: Bytes of the current segment written whole (a failed write is cut back to this).
        self.size = 0
        #: Names of segments freed for room (a full disk) or lost (``record/`` removed)
        #: since the recorder last took them (:meth:`take_gone`): it keeps per-segment counts.
        self.gone: list[str] = []
        #: How many times ``record/`` was found removed and made again.
        self.remade = 0
        #: Segments removed for room on a full disk, since the start.
        self.freed_for_room = 0
        self._scan()
        self.next_sequence = max(self.closed, default=0) + 1

    def _open_dir(self) -> int:
        """``record/`` made if missing, opened without following a link, and checked: its fd."""
        state_fd = self.state_fd
        try:
            os.mkdir(RECORD_SUBDIR, DIR_MODE, dir_fd=state_fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise RecordDirRefused(f"{self.path} cannot be created: {exc.strerror or exc}") from None
        try:
            fd = os.open(RECORD_SUBDIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=state_fd)
        except OSError as exc:
            reason = "is a symbolic link or not a directory" if exc.errno in (errno.ELOOP, errno.ENOTDIR) \
                else f"cannot be opened: {exc.strerror or exc}"
            raise RecordDirRefused(f"{self.path} {reason}") from None
        st = os.fstat(fd)
        why: str | None = None
        if st.st_uid != os.geteuid():
            why = f"is owned by uid {st.st_uid}, not by the daemon's uid {os.geteuid()}"
        elif st.st_mode & 0o022:
            why = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        if why is not None:
            os.close(fd)
            raise RecordDirRefused(f"{self.path} {why}")
        return fd

    def _scan(self) -> None:
        """The segments there are (regular files only: a link is not followed, nor counted),
        and the temporaries a killed recorder left, removed."""
        with os.scandir(self.fd) as entries:
            for entry in entries:
                if entry.name.endswith(SUFFIX + PART):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=self.fd)
                    continue
                m = NAME.match(entry.name)
                if m is None or not entry.is_file(follow_symlinks=False):
                    continue
                self.closed[int(m.group(1))] = (entry.name, entry.stat(follow_symlinks=False).st_size)
        self.closed_bytes = sum(size for _, size in self.closed.values())

    @property
    def total(self) -> int:
        """Bytes in the directory's segments, the current one included."""
        return self.closed_bytes + self.size

    def begin(self, start: float, head: bytes, keyframe: bytes, level: int, room: int = 0) -> None:
        """Close the current segment (synced) and begin the next: its header and keyframe
        written under a temporary name, synced, then renamed into place (the directory
        synced too). ``room``: what the segment may grow to; when the disk has less free,
        the oldest segments are freed first (the newest kept)."""
        self.close()
        self._check_dir()
        data = head + pack_batch(keyframe, level)
        self._make_room(max(room, len(data)))
        while True:
            try:
                self._create(start, data)
                return
            except OSError as exc:
                if exc.errno not in FULL or not self._free_oldest(keep_newest=True):
                    raise

    def _create(self, start: float, data: bytes) -> None:
        sequence = self.next_sequence
        name = segment_name(start, sequence)
        part = name + PART
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part, dir_fd=self.fd)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_APPEND,
                     FILE_MODE, dir_fd=self.fd)
        try:
            _write_all(fd, data)
            os.fdatasync(fd)  # before the rename: a power loss leaves no zero-length segment
            os.rename(part, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            os.fsync(self.fd)  # the rename itself on disk
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(part, dir_fd=self.fd)
            raise
        self.next_sequence = sequence + 1
        self.current_fd, self.current, self.size = fd, (sequence, name), len(data)

    def append(self, raw: bytes, level: int) -> bool:
        """One batch at the end of the current segment; False (nothing written) when
        ``record/`` was removed: the caller begins a new segment, which makes it again. A
        full disk frees the oldest closed segments and tries again; on another failure,
        or nothing left to free, the segment is cut back to its last whole frame (when the
        kernel lets us) and closed: OSError."""
        if self.current_fd < 0:
            return True
        if self._dir_gone():
            self.close_quietly()
            return False
        batch = pack_batch(raw, level)
        while True:
            try:
                _write_all(self.current_fd, batch)
                break
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(self.current_fd, self.size)
                if exc.errno in FULL and self._free_oldest(keep_newest=False):
                    continue
                self.close(sync=False)
                raise
        self.size += len(batch)
        return True

    # ------------------------------------------------------------------ room, and record/ itself

    def _free_oldest(self, keep_newest: bool) -> bool:
        """Remove our oldest closed segment for room; False when none may go (with
        ``keep_newest``, the newest closed one stays: it is the newest there is)."""
        if len(self.closed) <= (1 if keep_newest else 0):
            return False
        name, size = self.closed.pop(min(self.closed))
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=self.fd)
        self.closed_bytes -= size
        self.gone.append(name)
        self.freed_for_room += 1
        return True

    def _make_room(self, room: int) -> None:
        """Free our oldest segments while the disk has less than ``room`` bytes free (the
        disk smaller than ``max_bytes``, or filled by others): history shrinks to what the
        disk gives, instead of the recorder pausing for good."""
        try:
            while (vfs := os.statvfs(self.fd)).f_bavail * vfs.f_frsize < room:
                if not self._free_oldest(keep_newest=True):
                    return
        except OSError:
            return  # statvfs unsupported: the write says

    def _dir_gone(self) -> bool:
        """Whether ``record/`` was removed under us (an open directory's link count is 0)."""
        try:
            return self.fd < 0 or os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True

    def _check_dir(self) -> None:
        """``record/`` made again (with the checks of the first time) if it was removed:
        its segments are gone, the sequence goes on. RecordDirRefused when it cannot be."""
        if not self._dir_gone():
            return
        self.close_quietly()
        self.gone.extend(name for name, _ in self.closed.values())
        self.closed, self.closed_bytes = {}, 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.fd = self._open_dir()
        self.remade += 1
        log.warning("flight recorder: %s was removed while recording; made again", self.path)

    def take_gone(self) -> list[str]:
        gone, self.gone = self.gone, []
        return gone

    def close(self, sync: bool = True) -> None:
        """Close the current segment; with ``sync``, its data on disk first (OSError if not)."""
        fd, current = self.current_fd, self.current
        if fd < 0 or current is None:
            return
        self.current_fd, self.current = -1, None
        self.closed[current[0]] = (current[1], self.size)
        self.closed_bytes += self.size
        self.size = 0
        try:
            if sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def close_quietly(self) -> None:
        with contextlib.suppress(OSError):
            self.close(sync=False)

    def enforce(self, max_bytes: int, room: int) -> list[str]:
        """Drop the oldest closed segments until they and ``room`` (what the current segment
        may grow to) fit in ``max_bytes``; the names dropped."""
        dropped = []
        while self.closed and self.closed_bytes + max(room, self.size) > max_bytes:
            name, size = self.closed.pop(min(self.closed))
            with contextlib.suppress(OSError):  # gone already; or unlinkable, then its bytes are not ours
                os.unlink(name, dir_fd=self.fd)
            self.closed_bytes -= size
            dropped.append(name)
        self.gone.extend(dropped)
        return dropped

    def shut(self) -> None:
        """The last call: the current segment synced and closed, the directory let go."""
        try:
            self.close()
        finally:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
