"""The event streams' wire format: sse-starlette's EventSourceResponse against Starlette's StreamingResponse.

    python -m benchmarks.bench_sse_wire [--other DIR]

The same minimal app (uvicorn with httptools and uvloop, as the gateway runs) serves N streams
that each wait on an asyncio.Event, as the gateway's streams wait on their subscriber, and
send a heartbeat comment every second (15 s in the product: 1 s here so that the CPU
they cost can be measured). Variant `sse`: EventSourceResponse with its ping (a task of its
own per stream), its disconnect listener and its shutdown watcher. Variant `streaming`: a
StreamingResponse whose generator sends the heartbeat itself (a timeout scope on the event), with
Starlette's own disconnect listener. Variant `gateway`: the gateway's own stream body
(gateway/plugins/events/stream.py: the request's task and one disconnect watcher, no anyio);
with `--other DIR`, also the stream body of another checkout in DIR (its `gateway` package
imported instead of this one's), such as the commit that put it on StreamingResponse.
Measured, alternately, in one run: the server's RSS growth per 1,000 open streams, and its CPU
share over 10 s of heartbeats only.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from tests.procs import free_port, wait_until

STREAMS = 2000
HEARTBEAT_SEC = 1.0
IDLE_SEC = 10.0

APP = textwrap.dedent('''
    import asyncio, os
    from sse_starlette import EventSourceResponse, ServerSentEvent
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    VARIANT, BEAT = os.environ["VARIANT"], float(os.environ["BEAT"])
    # imported before the baseline is read, as the other variants' modules are
    from gateway.plugins.events.stream import EventStream
    from gateway.plugins.events.subscriber import Subscriber

    async def frames():
        woken = asyncio.Event()
        yield b"retry: 3000\\n\\n"
        while True:
            try:
                async with asyncio.timeout(BEAT):
                    await woken.wait()
            except TimeoutError:
                if VARIANT == "streaming":
                    yield b": keep-alive\\n\\n"

    async def stream(request):
        if VARIANT == "sse":
            return EventSourceResponse(frames(), ping=BEAT, sep="\\n",
                                       ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep="\\n"))
        return StreamingResponse(frames(), media_type="text/event-stream")

    async def health(request):
        return PlainTextResponse("ok")

    class GatewayStream:
        """The gateway's own stream body (gateway/plugins/events/stream.py) on a subscriber nothing feeds."""

        async def __call__(self, scope, receive, send):
            sub = Subscriber("t", "x", "r", None, None, "", 262144)
            sub.open([], None)

            async def finish(outcome, events):
                pass

            stream = EventStream(sub, 3000, BEAT, 3600, 30, finish)
            await stream(scope, receive, send, [("content-type", "text/event-stream")])

    app = Starlette(routes=[Route("/s", stream), Route("/g", GatewayStream()), Route("/healthz", health)])
''')


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(variant: str, workdir: Path, root: Path) -> tuple[float, float]:
    """The RSS growth per 1,000 streams and the CPU share of heartbeats, with the gateway's package from `root`."""
    port = free_port()
    (workdir / "wire_app.py").write_text(APP)
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "uvicorn", "wire_app:app", "--port", str(port), "--loop", "uvloop", "--http",
        "httptools", "--log-level", "warning", "--limit-concurrency", "10000", cwd=workdir,
        env={**os.environ, "VARIANT": variant, "BEAT": str(HEARTBEAT_SEC),
             "PYTHONPATH": f"{workdir}:{root}"})
    try:
        import httpx

        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200, 20,
                   what="the wire app")
        before = rss(server.pid)
        writers = []
        for _ in range(STREAMS):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET /{'s' if variant in ('sse', 'streaming') else 'g'} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            writers.append((reader, writer))
        await asyncio.sleep(3)
        grown = (rss(server.pid) - before) / (STREAMS / 1000)

        async def drain(reader: asyncio.StreamReader) -> None:
            while await reader.read(65536):
                pass

        readers = [asyncio.create_task(drain(r)) for r, _ in writers]
        started = cpu(server.pid)
        await asyncio.sleep(IDLE_SEC)
        share = (cpu(server.pid) - started) / IDLE_SEC
        for task in readers:
            task.cancel()
        for _, writer in writers:
            writer.close()
        return grown, share
    finally:
        server.terminate()
        await server.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--other", type=Path, help="also measure the stream body of another checkout")
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1]
    variants = [("sse", here), ("streaming", here), ("gateway", here)]
    if args.other:
        variants.append(("other", args.other.resolve()))
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),) * 2)
    print(f"load average: {os.getloadavg()}; {STREAMS} streams, heartbeat every {HEARTBEAT_SEC:g} s")
    with tempfile.TemporaryDirectory(prefix="bench-sse-wire-") as tmp:
        for round_ in (1, 2):
            for variant, root in variants:
                grown, share = await measure(variant, Path(tmp), root)
                print(f"round {round_} {variant:9}: RSS +{grown / 2**20:.1f} MiB per 1,000 streams, "
                      f"CPU {100 * share:.1f} % of a core with heartbeats only", flush=True)
                time.sleep(1)


if __name__ == "__main__":
    asyncio.run(main())
