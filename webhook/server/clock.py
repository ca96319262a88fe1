"""The clock the admission pipeline decides quota windows by.

In production it is the system's (``time.time``). For tests only, ``serve
--test-clock-offset-file FILE`` moves it: the file holds a number of seconds (``3600``,
``-86400.5``) added to the system's time, re-read whenever the file changes, so a test
switches a quota window across several replicas at once by writing one file, instead of
waiting for the boundary. A missing or unreadable file leaves the offset as it was (0 at
first) and is logged once. Never set it on a cluster that enforces quota: whoever can
write the file moves every tenant's windows.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from webhook.libs import logs


class OffsetClock:
    """``time.time()`` plus the offset written in a file (tests only)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0.0
        self._seen: tuple[int, int] | None = None
        self._told = False

    def __call__(self) -> float:
        try:
            st = os.stat(self.path)
            seen = (st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                with open(self.path, encoding="utf-8") as f:
                    self.offset = float(f.read().strip() or 0)
                self._seen = seen
                self._told = False
                logs.event("test clock offset", logging.WARNING, file=self.path,
                           offset_seconds=self.offset)
        except (OSError, ValueError) as exc:
            if not self._told:
                logs.event("test clock offset file unreadable; the offset is kept",
                           logging.WARNING, file=self.path, error=str(exc),
                           offset_seconds=self.offset)
                self._told = True
        return time.time() + self.offset


def clock(offset_file: str | None) -> Callable[[], float]:
    """The pipeline's clock: the system's, or (tests only) moved by ``offset_file``."""
    return time.time if not offset_file else OffsetClock(offset_file)
