"""Structured JSON logs: one line per decision, errors with their cause.

Objects are never logged whole (they may hold secrets in env vars); a decision line
names the object, the user, the verdict and the rules.

Decision lines (one per review, :func:`decision`) are buffered and written at most every
200 ms (or when 64 KiB are waiting), not one write per line: a write system call per
admission was a fifth of the server's time per review. Every other line (:func:`event`,
start-up, reloads, errors) is written at once. ``flush()`` also runs at shutdown.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import sys
import threading
import time
from typing import Any

import orjson

LOGGER = logging.getLogger("gpu_webhook")
FLUSH_SECONDS = 0.2


_second: tuple[int, str] = (-1, "")  # no second has been formatted yet


def _timestamp(created: float) -> str:
    """RFC 3339 UTC with milliseconds. The date and time part changes once a second, so
    it is formatted once a second (strftime was a fair share of a decision line's cost)."""
    global _second
    whole = int(created)
    if _second[0] != whole:
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{_second[1]}.{int(created % 1 * 1000):03d}Z"





class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _timestamp(record.created),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class BufferedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that leaves flushing to a timer (and to warnings and errors)."""

    def flush(self) -> None:  # called by emit() after every record: a no-op here
        return

    def flush_now(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            stream = self.stream
            if stream is not None and hasattr(stream, "flush"):
                stream.flush()

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if record.levelno >= logging.WARNING:
            self.flush_now()

    def write_line(self, line: str) -> None:
        with self.lock:  # type: ignore[union-attr]
            self.stream.write(line)


_handler: BufferedHandler | None = None


def setup(level: str = "info") -> None:
    global _handler
    stream = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(os.dup(sys.stderr.fileno()), "w"), 1 << 16),
        encoding="utf-8", write_through=False) if _has_fd(sys.stderr) else sys.stderr
    handler = BufferedHandler(stream)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    first = _handler is None
    _handler = handler
    if first:
        threading.Thread(target=_flusher, name="log-flush", daemon=True).start()
        atexit.register(flush)


def _has_fd(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True


def _flusher() -> None:
    while True:
        time.sleep(FLUSH_SECONDS)
        flush()


def flush() -> None:
    handler = _handler
    if handler is not None:
        with contextlib.suppress(OSError, ValueError):  # stderr gone at exit
            handler.flush_now()


def event(msg: str, level: int = logging.INFO, **fields: Any) -> None:
    """A log line written at once: start-up, reloads, failures (rare, and read by people
    and tests as they happen)."""
    if LOGGER.isEnabledFor(level):
        LOGGER.log(level, msg, extra={"fields": fields})
        flush()


def decision(**fields: Any) -> None:
    """The one-line-per-review audit record, on the hot path: no LogRecord, one orjson
    call, one buffered write (flushed within FLUSH_SECONDS)."""
    if not LOGGER.isEnabledFor(logging.INFO):
        return
    handler = _handler
    if handler is None or handler not in logging.getLogger().handlers:
        LOGGER.info("decision", extra={"fields": fields})
        return
    out: dict[str, Any] = {"time": _timestamp(time.time()), "level": "info",
                           "msg": "decision"}
    out.update(fields)
    handler.write_line(orjson.dumps(out, default=str).decode() + "\n")
