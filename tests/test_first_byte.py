"""First-byte deadlines (gateway/first_byte.py): one watch, one timer, every request held to its own deadline."""
from __future__ import annotations

import asyncio
import time

from gateway.first_byte import FirstByteWatch


async def _served(watch: FirstByteWatch, work: asyncio.Future[None] | float) -> str:
    """A request as dispatch serves it: 'answered', 'deadline' (cancelled by the watch) or cancelled otherwise."""
    task = watch.enter(time.perf_counter())
    try:
        if isinstance(work, float):
            await asyncio.sleep(work)
        else:
            await work
        return "answered"
    except asyncio.CancelledError:
        if not watch.expired(task):
            raise
        return "deadline"
    finally:
        watch.leave(task)


def test_each_request_is_cancelled_at_its_own_deadline_and_the_quick_ones_are_not() -> None:
    async def main() -> None:
        watch = FirstByteWatch(0.3)
        began = time.perf_counter()
        first = asyncio.create_task(_served(watch, 5.0))
        quick = asyncio.create_task(_served(watch, 0.05))
        await asyncio.sleep(0.1)
        second = asyncio.create_task(_served(watch, 5.0))  # arrives 0.1 s later: its deadline is 0.1 s later
        assert await quick == "answered"
        assert await first == "deadline"
        first_at = time.perf_counter() - began
        assert await second == "deadline"
        second_at = time.perf_counter() - began
        # each at its own deadline (the bounds above it are loose: the machine may be busy), never at 5 s
        assert 0.29 < first_at < 2.0, first_at
        assert 0.39 < second_at < 2.1, second_at
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    asyncio.run(main())


def test_a_request_after_the_oldest_answered_keeps_its_full_deadline() -> None:
    async def main() -> None:
        watch = FirstByteWatch(0.3)
        assert await _served(watch, 0.01) == "answered"  # the timer waits for this one's deadline
        await asyncio.sleep(0.2)
        began = time.perf_counter()
        late = asyncio.create_task(_served(watch, 5.0))
        assert await late == "deadline"
        assert 0.29 < time.perf_counter() - began < 2.0  # not cut short at the first request's deadline

    asyncio.run(main())


def test_a_cancellation_that_is_not_the_deadline_goes_on() -> None:
    async def main() -> None:
        watch = FirstByteWatch(5.0)
        request = asyncio.create_task(_served(watch, 5.0))
        await asyncio.sleep(0.05)
        request.cancel()
        try:
            await request
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the request's own cancellation was swallowed")
        assert not watch.expired(request)

    asyncio.run(main())


def test_a_request_that_answers_after_its_cancellation_leaves_its_task_uncancelled() -> None:
    async def stubborn(watch: FirstByteWatch, done: asyncio.Future[int]) -> None:
        task = watch.enter(time.perf_counter())
        try:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                pass  # a plugin that keeps the cancellation to itself and answers
        finally:
            watch.leave(task)
        done.set_result(task.cancelling())

    async def main() -> None:
        watch = FirstByteWatch(0.1)
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await asyncio.create_task(stubborn(watch, done))
        assert await done == 0

    asyncio.run(main())
