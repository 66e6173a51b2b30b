"""First-byte deadlines: a request whose chain has not answered in time is cancelled (dispatch answers 504).

One watch per deadline length rather than a timer per request: a request in flight
is one entry in a dict kept in arrival order, which, every request of a watch having
the same length, is also the order of their deadlines. One timer waits for the
oldest request's deadline; when it fires, it cancels the requests past theirs and
waits for the next oldest's. A request that answers only deletes its entry: the
timer stays, and firing for a request already gone it moves on to the next oldest.
Cancelling is what `asyncio.timeout` does: the request's task is cancelled, and the
cancellation undone once dispatch has caught it.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

Task = asyncio.Task[Any]


class FirstByteWatch:
    """The requests in flight that must answer within `within` seconds of their arrival, oldest first."""

    def __init__(self, within: float) -> None:
        self.within = within
        self._arrived: dict[Task, float] = {}  # a request's task -> when it arrived (time.perf_counter)
        self._expired: set[Task] = set()  # cancelled for their deadline, not yet left
        self._timer: asyncio.TimerHandle | None = None
        # the loop, once known: current_task() without it asks the kernel for the process id on each call
        self._loop: asyncio.AbstractEventLoop | None = None

    def enter(self, arrived: float) -> Task:
        """Watch the current task's request, which arrived at `arrived` (time.perf_counter)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(self._loop)
        assert task is not None, "a request is served in a task"
        self._arrived[task] = arrived
        if self._timer is None:
            self._wait_for(arrived)
        return task

    def leave(self, task: Task) -> None:
        """The request has its answer (or an error): no longer watched."""
        if self._arrived.pop(task, None) is None and task in self._expired:
            # cancelled at its deadline, it answered all the same (a plugin kept the cancellation to itself)
            self._expired.discard(task)
            task.uncancel()

    def expired(self, task: Task) -> bool:
        """Whether the deadline is what cancelled `task`, and nothing else did; its cancellation is then undone."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        return task.uncancel() == 0

    def _wait_for(self, arrived: float) -> None:
        delay = arrived + self.within - time.perf_counter()
        assert self._loop is not None, "entered before"
        self._timer = self._loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        self._timer = None
        passed = time.perf_counter() - self.within  # a request that arrived by then is past its deadline
        late = []
        for task, arrived in self._arrived.items():
            if arrived > passed:
                self._wait_for(arrived)
                break
            late.append(task)
        for task in late:
            del self._arrived[task]
            self._expired.add(task)
            task.cancel()
