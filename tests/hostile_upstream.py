"""An upstream that misbehaves on purpose, written on raw sockets so that nothing tidies its answers.

Run as `python -m tests.hostile_upstream run --config FILE` (the file names the port), like the real
services. Each answer closes its connection. By the request's path:
- `/healthz`: 200.
- `/endless/...`: a JSON answer, chunked, that never ends: 64 KiB pieces as fast as the reader takes them.
- `/drip/...` and `/internal/...`: a JSON answer, one byte every 0.2 s, for ever (each read is quick: only a
  total stops it).
- `/coded/...`: an answer with a transfer coding nobody can decode (`x-custom`), ended by the close.
- `/hang/...`: no answer at all, until the caller goes away.
- `POST /exports`, a submit (the outbox's): by its `export_type`, `quota` is refused 429 (the active-task
  quota) twice, then created; `refused` is refused 422 for good; `GET /exports/{id}` answers a created
  task, else 404. `/stats` lists the submits' answers in order.
- `/stats`: how many endless answers are being written now and were ever started, how many calls hang now,
  and the submits seen by task id.
- anything else: 200 with the request target exactly as it arrived, and its Host header.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from tests import stub_server

STATE: dict[str, Any] = {"endless_open": 0, "endless_started": 0, "hanging": 0, "submits": {}, "answers": []}
CREATED: dict[str, dict[str, Any]] = {}
PIECE = b"{\"x\":\"" + b"a" * 65_000 + b"\"},"


def _head(status: str, *headers: str) -> bytes:
    return ("HTTP/1.1 " + status + "\r\n" + "".join(h + "\r\n" for h in headers) + "connection: close\r\n\r\n").encode()


def _json(data: object, status: str = "200 OK", code: int = 0, message: str = "success") -> bytes:
    body = json.dumps({"code": code, "message": message, "data": data}).encode()
    return _head(status, "content-type: application/json", f"content-length: {len(body)}") + body


def _submit(fields: list[str], body: bytes) -> bytes:
    task_id = next(f.split(":", 1)[1].strip() for f in fields if f.lower().startswith("x-task-id:"))
    seen = STATE["submits"][task_id] = STATE["submits"].get(task_id, 0) + 1
    kind = json.loads(body).get("export_type")
    if kind == "refused":
        STATE["answers"].append([task_id, 422])
        return _json(None, "422 Unprocessable Entity", 42200, "export_type 'refused' is not offered here")
    if kind == "quota" and seen <= 2:
        STATE["answers"].append([task_id, 429])
        return _json({"active": 1, "limit": 1}, "429 Too Many Requests", 42901, "tenant has 1 active tasks")
    STATE["answers"].append([task_id, 201])
    CREATED[task_id] = {"task_id": task_id, "export_type": kind, "status": "PENDING", "progress": 0,
                        "current_step": None, "attempt": 1, "created_at": "2026-01-01T00:00:00Z",
                        "updated_at": "2026-01-01T00:00:00Z", "result": None, "error": None, "degraded": False,
                        "callback": None}
    return _json(CREATED[task_id], "201 Created")


async def _endless(writer: asyncio.StreamWriter) -> None:
    STATE["endless_open"] += 1
    STATE["endless_started"] += 1
    try:
        writer.write(_head("200 OK", "content-type: application/json", "transfer-encoding: chunked"))
        start = b"{\"code\":0,\"message\":\"success\",\"data\":{\"items\":["
        writer.write(b"%x\r\n%b\r\n" % (len(start), start))
        chunk = b"%x\r\n%b\r\n" % (len(PIECE), PIECE)
        while True:
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        STATE["endless_open"] -= 1


async def _drip(writer: asyncio.StreamWriter) -> None:
    writer.write(_head("200 OK", "content-type: application/json"))
    writer.write(b"{\"code\":0,\"message\":\"success\",\"data\":{\"pad\":\"")
    while True:
        writer.write(b"a")
        await writer.drain()
        await asyncio.sleep(0.2)


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        line, *fields = head.decode("latin-1").split("\r\n")
        target = line.split(" ")[1]
        host = next((f.split(":", 1)[1].strip() for f in fields if f.lower().startswith("host:")), "")
        if target == "/healthz":
            writer.write(_json({"status": "ok"}))
        elif target == "/stats":
            writer.write(_json(dict(STATE)))
        elif line.startswith("POST /exports"):
            length = next((int(f.split(":", 1)[1]) for f in fields if f.lower().startswith("content-length:")), 0)
            writer.write(_submit(fields, await reader.readexactly(length)))
        elif target.startswith("/exports/"):
            task = CREATED.get(target.split("/")[2].split("?")[0])
            writer.write(_json(task) if task else _json(None, "404 Not Found", 40400, "no such task"))
        elif target.startswith("/endless"):
            await _endless(writer)
        elif target.startswith(("/drip", "/internal/")):  # /internal/: what the admin API's recovery calls
            await _drip(writer)
        elif target.startswith("/hang"):
            STATE["hanging"] += 1
            try:
                await reader.read()  # until the caller closes
            finally:
                STATE["hanging"] -= 1
        elif target.startswith("/coded"):
            writer.write(_head("200 OK", "content-type: application/json", "transfer-encoding: x-custom"))
            writer.write(b"{\"code\":0,\"message\":\"success\",\"data\":{}}")
        else:
            writer.write(_json({"target": target, "host": host}))
        await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(stub_server.config_from_args()["port"]))
