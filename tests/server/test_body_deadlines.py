"""Body-read deadlines (``BodyDeadlines``): a stalled body ends in ``TimeoutError`` soon
after its deadline, a body that arrives in time leaves no cancellation behind, and a
cancellation from elsewhere (shutdown) is not mistaken for a timeout."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from webhook.server.web.app import SWEEP_SECONDS, BodyDeadlines

SCOPE: dict[str, Any] = {"type": "http", "headers": []}


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()  # a client that sent headers and then nothing
    raise AssertionError


async def _chunks() -> dict[str, Any]:
    return {"type": "http.request", "body": b"{}", "more_body": False}


def test_a_stalled_body_times_out_and_not_before_its_deadline() -> None:
    # No ceiling on how long it took: on a busy machine the sweeper runs late, and that
    # is not a defect. What is checked: a body that never comes ends in TimeoutError
    # (else this test hangs), never before its deadline, and leaves nothing behind.
    async def main() -> float:
        d = BodyDeadlines()
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await d.read(SCOPE, _never, 1000, start + 0.2)
        assert d.reading == {}
        return time.monotonic() - start

    assert asyncio.run(main()) >= 0.2


def test_a_body_in_time_leaves_the_request_free_to_await_past_the_deadline() -> None:
    async def main() -> bytes | None:
        d = BodyDeadlines()
        body = await d.read(SCOPE, _chunks, 1000, time.monotonic() + 0.05)
        # Later awaits of the same request (a quota commit) run past the body deadline
        # without being cancelled by the sweeper.
        await asyncio.sleep(0.05 + 3 * SWEEP_SECONDS)
        return body

    assert asyncio.run(main()) == b"{}"


def test_an_outside_cancellation_is_not_a_timeout() -> None:
    async def main() -> None:
        d = BodyDeadlines()
        task = asyncio.get_running_loop().create_task(
            d.read(SCOPE, _never, 1000, time.monotonic() + 60))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert d.reading == {}

    asyncio.run(main())


def test_many_reads_each_end_by_their_own_deadline() -> None:
    async def main() -> list[str]:
        d = BodyDeadlines()
        now = time.monotonic()

        async def one(receive: Any, deadline: float) -> str:
            try:
                await d.read(SCOPE, receive, 1000, deadline)
            except TimeoutError:
                return "timeout"
            return "body"

        return await asyncio.gather(one(_never, now + 0.1), one(_chunks, now + 0.1),
                                    one(_never, now + 0.3), one(_chunks, now - 1))

    assert asyncio.run(main()) == ["timeout", "body", "timeout", "body"]
