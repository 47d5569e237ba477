"""Container names, looked up off the tick and cached.

A process's container (runtime and ID) is known at attach from its cgroup path, which
costs nothing (:mod:`memagent.proc.cgroup_identity`). Its name is in the engine's files
(:mod:`memagent.proc.runtimes`): a JSON file on some disk, which the tick must never wait
for. So the first process of a container is announced with ``name: nil``; a thread of
this module reads the name once per container ID, and :func:`apply_names` (on the
agent's loop, woken by ``notify``) sets it on every entry of that container and
announces each again (an ``attached`` event with the same identity: clients upsert).

A name not found is tried again after :data:`RETRY_S` (the engine may write its files
just after the container's first process starts); a found one is kept for the
container's life (an ID is never reused).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from ..proc.cgroup_identity import CgroupIdentity
from ..proc.runtimes import container_name
from .watched import Watched

log = logging.getLogger(__name__)

#: Seconds before a name that was not found is looked up again.
RETRY_S = 30.0


class ContainerNames:
    """Names by container ID; ``root`` None: names are not looked up (all nil)."""

    def __init__(self, root: str | None = "/", notify: Callable[[], None] | None = None) -> None:
        self.root = root
        #: Called from the lookup thread after each lookup; must be thread-safe.
        self.notify = notify or (lambda: None)
        self._names: dict[str, str | None] = {}
        self._tried: dict[str, float] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[CgroupIdentity | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def lookup(self, identity: CgroupIdentity) -> str | None:
        """The name if known now; else None, and a lookup is queued (at most one per ID
        at a time, and not again before :data:`RETRY_S`). Never blocks."""
        cid = identity.container_id
        if cid is None or self.root is None:
            return None
        with self._lock:
            name = self._names.get(cid)
            if name is not None:
                return name
            tried = self._tried.get(cid)
            if tried is not None and time.monotonic() - tried < RETRY_S:
                return None
            self._tried[cid] = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="memagent-container-names", daemon=True)
                self._thread.start()
        self._queue.put(identity)
        return None

    def resolve(self, identities: list[CgroupIdentity]) -> None:
        """Read the names not known yet, now (blocking: call it from a thread, as the
        attach of a container by name does)."""
        for identity in identities:
            cid = identity.container_id
            if self.root is None or cid is None or identity.runtime is None or self.cached(cid) is not None:
                continue
            name = container_name(self.root, identity.runtime, identity.engine, cid, identity.user)
            with self._lock:
                self._names[cid] = name
                self._tried[cid] = time.monotonic()

    def cached(self, container_id: str) -> str | None:
        with self._lock:
            return self._names.get(container_id)

    def _run(self) -> None:
        root = self.root or "/"
        while (identity := self._queue.get()) is not None:
            assert identity.runtime is not None and identity.container_id is not None
            name = container_name(root, identity.runtime, identity.engine, identity.container_id, identity.user)
            log.debug("container %s (%s): name %r", identity.container_id[:12], identity.runtime, name)
            with self._lock:
                self._names[identity.container_id] = name
            if name is not None:
                self.notify()

    def close(self) -> None:
        """End the lookup thread (it ends after the lookup under way, if any)."""
        if self._thread is not None:
            self._queue.put(None)


def apply_names(entries: Iterable[Watched], names: ContainerNames, announce: Callable[[Watched], None]) -> int:
    """Set the names found since on the entries still without one, announcing each; how many."""
    done = 0
    for w in entries:
        if w.container is not None and w.container.name is None:
            name = names.cached(w.container.id)
            if name is not None:
                w.container = replace(w.container, name=name)
                announce(w)
                done += 1
    return done
