"""The JSON log line format: one parseable object per line, RFC 3339 UTC timestamps."""

from __future__ import annotations

import datetime as dt
import io
import logging

import orjson
import pytest

from webhook.libs import logs


@pytest.mark.parametrize("t", [0.0, 1_795_000_000.0, 1_795_000_000.999, 1_795_000_001.5])
def test_timestamps_are_utc_with_milliseconds_across_second_boundaries(t: float) -> None:
    # Called out of order on purpose: the once-a-second cache must never serve a stale
    # second.
    for when in (t, t + 1.0, t):
        expected = dt.datetime.fromtimestamp(when, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
        assert logs._timestamp(when) == expected[:-3] + "Z"


def test_a_decision_line_is_one_json_object_written_on_flush() -> None:
    logs.setup("info")
    raw = io.BytesIO()  # what reaches the file descriptor
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logs.BufferedHandler)
    handler.setStream(io.TextIOWrapper(raw, encoding="utf-8", write_through=False))
    logs.decision(uid="u-1", decision="denied", rules=["quota"])
    assert raw.getvalue() == b""  # buffered: the hot path makes no write of its own
    logs.flush()
    (line,) = raw.getvalue().splitlines()
    doc = orjson.loads(line)
    assert doc["msg"] == "decision" and doc["level"] == "info"
    assert doc["uid"] == "u-1" and doc["rules"] == ["quota"]
    logs.event("debug detail", logging.DEBUG, uid="u-2")  # below the level: not written
    logs.event("policy loaded", generation=2)  # other lines are written at once
    lines = raw.getvalue().splitlines()
    assert len(lines) == 2 and orjson.loads(lines[1])["generation"] == 2
