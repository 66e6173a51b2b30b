"""Server-sent events read line by line, after the WHATWG HTML standard's event-stream parsing (plain Python).

A stream is lines; a blank line dispatches the event gathered so far. `data` lines are
joined with newlines, `id` (without a NUL) sets the last event id, `retry` (digits)
the reconnection delay, `event` the type (default `message`); a line starting with `:`
is a comment (the server's keep-alive), any other field is ignored.

Whatever the server sends costs bounded memory: a line longer than MAX_LINE_BYTES, or an event
whose data passes MAX_EVENT_CHARS, breaks the stream (BrokenStream), as a cut connection does.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LINE_BYTES = 1024 * 1024
MAX_EVENT_CHARS = 4 * 1024 * 1024
# an id worth sending back as Last-Event-ID: what a gateway makes (printable ASCII, no spaces, bounded)
RESUMABLE_ID = re.compile(r"[!-~]{1,128}")


class BrokenStream(ValueError):
    """The stream is not one to follow: a line or an event past its bound, or an event that is not a task."""


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


def resumable(event_id: str | None) -> str | None:
    """`event_id` when a Last-Event-ID header can carry it and a gateway would read it, else None."""
    return event_id if event_id is not None and RESUMABLE_ID.fullmatch(event_id) else None


class LineSplitter:
    """Bytes as they arrive, as lines without their ends (CRLF, LF or CR ends one), none past MAX_LINE_BYTES."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, chunk: bytes) -> list[str]:
        data = self._held + chunk
        # a CR at the end may be the first half of a CRLF: it waits for the next chunk
        held_cr = data.endswith(b"\r")
        parts = (data[:-1] if held_cr else data).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._held = parts.pop() + (b"\r" if held_cr else b"")
        if len(self._held) > MAX_LINE_BYTES:
            raise BrokenStream(f"a line of the event stream passed {MAX_LINE_BYTES} bytes")
        return [part.decode("utf-8", "replace") for part in parts]


class EventParser:
    def __init__(self, last_id: str | None = None) -> None:
        self.last_id = last_id
        self.retry_ms: int | None = None
        self._type = ""
        self._data: list[str] = []
        self._size = 0

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
            self._size += len(value) + 1
            if self._size > MAX_EVENT_CHARS:
                raise BrokenStream(f"an event of the stream passed {MAX_EVENT_CHARS} characters")
        elif name == "event":
            self._type = value
        elif name == "id" and "\0" not in value:
            self.last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():  # isdigit alone takes '²'
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> Event | None:
        data, kind = self._data, self._type
        self._data, self._type, self._size = [], "", 0
        if not data:
            return None
        return Event(kind or "message", "\n".join(data), self.last_id, self.retry_ms)
