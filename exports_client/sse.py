"""Server-sent events read line by line, after the WHATWG HTML standard's event-stream parsing (plain Python).

A stream is lines; a blank line dispatches the event gathered so far. `data` lines are
joined with newlines, `id` (without a NUL) sets the last event id, `retry` (digits)
the reconnection delay, `event` the type (default `message`); a line starting with `:`
is a comment (the server's keep-alive), any other field is ignored.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    event: str
    data: str
    id: str | None  # the last event id in force when it was dispatched
    retry_ms: int | None  # the reconnection delay the stream asked for, if any so far


@dataclass(frozen=True)
class Heartbeat:
    """A comment line: the stream is alive (a reader may check its deadline)."""


HEARTBEAT = Heartbeat()


class EventParser:
    def __init__(self, last_id: str | None = None) -> None:
        self.last_id = last_id
        self.retry_ms: int | None = None
        self._type = ""
        self._data: list[str] = []

    def feed(self, line: str) -> Event | Heartbeat | None:
        """One line without its end; the event it completes, a heartbeat for a comment, else None."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return HEARTBEAT
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id" and "\0" not in value:
            self.last_id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> Event | None:
        data, kind = self._data, self._type
        self._data, self._type = [], ""
        if not data:
            return None
        return Event(kind or "message", "\n".join(data), self.last_id, self.retry_ms)
