"""The policy serving now, and reloading it when its file changes.

A ConfigMap mount updates by swapping a symlink, so the file is watched by the identity
of what the path resolves to (device, inode, size, mtime) rather than by inotify on one
inode. A policy that fails to load is logged and counted, and the last good policy keeps
serving: a bad edit never takes the webhook down or opens it up.

The latest version of the file always wins: reloads run one at a time (a lock, since
they run on a worker thread), a file that changed while it was read is read again on
the next tick, and a success clears the last error *before* the new policy is
published, so a reader that sees the new generation never sees the old error with it
(``/readyz`` reads the policy, then the error).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from webhook.libs import logs
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import PolicyError, default_policy_text, load_file, load_text
from webhook.server import metrics


@dataclass(frozen=True, slots=True)
class Active:
    policy: CompiledPolicy
    generation: int
    source: str


class PolicySource:
    """Holds the active compiled policy; swaps it atomically on a successful reload."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        self.active: Active | None = None
        self.last_error: str | None = None
        self.on_change: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def load(self) -> Active:
        """First load; raises PolicyError (the server refuses to start on a bad policy)."""
        if self.path is None:
            compiled = compile_policy(load_text(default_policy_text(), "<embedded default>"))
            return self._install(compiled, "<embedded default>")
        stamp = self._stat()
        compiled = compile_policy(load_file(self.path))
        self._stamp = stamp
        return self._install(compiled, self.path)

    def _install(self, compiled: CompiledPolicy, source: str) -> Active:
        gen = (self.active.generation + 1) if self.active else 1
        # One reference assignment: a review in flight keeps the policy it started with.
        self.active = Active(compiled, gen, source)
        metrics.POLICY_GENERATION.set(gen)
        metrics.POLICY_RELOADS.labels("success").inc()
        metrics.POLICY_LAST_SUCCESS.set(time.time())
        logs.event("policy loaded", policy=compiled.name, generation=gen, source=source)
        return self.active

    def _stat(self) -> tuple[int, int, int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)  # follows the symlink a ConfigMap swaps
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def reload_if_changed(self) -> bool:
        """Reload when the file changed; returns True if a new policy is serving."""
        if self.path is None:
            return False
        with self._lock:
            stamp = self._stat()
            if stamp == self._stamp:
                return False
            if stamp is None:
                self._stamp = stamp
                self._fail(f"policy file {self.path} is missing; keeping the last good policy")
                return False
            try:
                compiled = compile_policy(load_file(self.path))
            except PolicyError as exc:
                self._stamp = stamp if self._stat() == stamp else None
                self._fail(f"policy reload rejected, keeping generation "
                           f"{self.active.generation if self.active else 0}:\n{exc}")
                return False
            # Changed while it was read: what was read may be either version, so the
            # next tick reads it again (None never equals a file's stamp).
            self._stamp = stamp if self._stat() == stamp else None
            self.last_error = None  # before the new generation is visible: see above
            self._install(compiled, self.path)
        for callback in self.on_change:
            callback()
        return True

    def _fail(self, message: str) -> None:
        self.last_error = message
        metrics.POLICY_RELOADS.labels("failure").inc()
        logs.event("policy reload failed", logging.ERROR, error=message)

    async def watch(self, interval: float = 2.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                # In a thread: parsing and validating a large policy takes seconds of
                # pure Python, and admissions must keep being answered meanwhile. The new
                # policy is installed by one reference assignment, safe from any thread.
                await asyncio.to_thread(self.reload_if_changed)
            except Exception:  # a watcher must never die: the next tick tries again
                logging.getLogger("gpu_webhook").exception("policy watch failed")


def resolve(path: str | None) -> str | None:
    return str(Path(path).expanduser()) if path else None
