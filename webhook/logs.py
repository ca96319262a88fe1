"""Structured JSON logs: one line per decision, errors with their cause.

Objects are never logged whole (they may hold secrets in env vars); a decision line
names the object, the user, the verdict and the rules.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

LOGGER = logging.getLogger("gpu_webhook")


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(msg: str, level: int = logging.INFO, **fields: Any) -> None:
    if LOGGER.isEnabledFor(level):
        LOGGER.log(level, msg, extra={"fields": fields})
