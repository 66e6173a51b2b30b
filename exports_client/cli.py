"""exportctl: submit, wait for, download and manage exports from a shell.

Exit codes: 0 success (a task COMPLETED), 1 the task ended FAILED, TIMEOUT,
CANCELLED (or in a status this version does not know), 2 usage or a refused
request (4xx), 3 --max-wait reached while the task still runs, 4 not found,
5 the gateway unreachable or unavailable after retries.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TextIO

from exports_client.client import ExportsClient
from exports_client.errors import (
    ApiError,
    DownloadError,
    ExportsError,
    NotFound,
    RateLimited,
    Unavailable,
    WaitTimeout,
)
from exports_client.models import Task
from exports_client.version import __version__

OK, TASK_FAILED, USAGE, STILL_RUNNING, NOT_FOUND, UNAVAILABLE = 0, 1, 2, 3, 4, 5
INTERRUPTED = 130


def _filter_value(text: str) -> Any:
    """`5` is a number, `true` a boolean, anything not JSON a string: `--filter region=eu-west`."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_filters(pairs: Sequence[str], raw_json: str | None) -> dict[str, Any] | None:
    filters: dict[str, Any] = {}
    if raw_json:
        loaded = json.loads(raw_json)
        if not isinstance(loaded, dict):
            raise ValueError("--filters-json must be a JSON object")
        filters.update(loaded)
    repeated: dict[str, list[Any]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--filter takes KEY=VALUE, not {pair!r}")
        repeated.setdefault(key, []).append(_filter_value(value))
    filters.update({k: v[0] if len(v) == 1 else v for k, v in repeated.items()})  # a repeated key: any of them
    return filters or None


class Output:
    """Where results and progress go: the final answer on stdout, progress on stderr."""

    def __init__(self, as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.as_json = as_json
        self.out = out
        self.err = err
        self.terminal = err.isatty()
        self.waiting_on: str | None = None  # the task a Ctrl-C leaves running

    def note(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def task(self, task: Task) -> None:
        if self.as_json:
            print(json.dumps(task.to_dict(), indent=2), file=self.out)
        else:
            print(describe(task), file=self.out)

    def data(self, value: Any, lines: list[str]) -> None:
        print(json.dumps(value, indent=2) if self.as_json else "\n".join(lines), file=self.out)

    def progress(self, task_id: str) -> AbstractContextManager[Callable[[Task], None]]:
        return _RichProgress(task_id, self.err) if self.terminal else nullcontext(_PlainProgress(self.err))


def describe(task: Task) -> str:
    parts = [task.task_id, task.status, f"{task.progress}%"]
    if task.current_step:
        parts.append(f"step={task.current_step}")
    if task.attempt > 1:
        parts.append(f"attempt={task.attempt}")
    if task.result:
        parts.append(f"rows={task.result.rows} bytes={task.result.bytes}")
    if task.error:
        parts.append(f"error={task.error.code}: {task.error.message}")
    return " ".join(parts)


class _PlainProgress:
    """One plain line per change: no control characters, readable in a log file."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.started = time.monotonic()
        self.last: tuple[str, int, str | None] | None = None

    def __call__(self, task: Task) -> None:
        state = (task.status, task.progress, task.current_step)
        if state != self.last:
            self.last = state
            print(f"{describe(task)} elapsed={time.monotonic() - self.started:.0f}s", file=self.err, flush=True)


class _RichProgress(AbstractContextManager[Callable[[Task], None]]):
    """A progress bar with the task's progress, current step and the elapsed time."""

    def __init__(self, task_id: str, err: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                            TextColumn("{task.fields[step]}"), TimeElapsedColumn(), console=Console(file=err))
        self.row = self.bar.add_task(task_id, total=100, step="waiting")

    def __enter__(self) -> Callable[[Task], None]:
        self.bar.start()
        return self.update

    def update(self, task: Task) -> None:
        self.bar.update(self.row, completed=task.progress, step=task.current_step or task.status)

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def _wait(client: ExportsClient, out: Output, task_id_or_token: str, max_wait: float) -> Task:
    task_id = json.loads(task_id_or_token)["task_id"] if task_id_or_token.lstrip().startswith("{") else task_id_or_token
    out.waiting_on = task_id
    with out.progress(task_id) as on_progress:
        task = client.wait(task_id_or_token, max_wait=max_wait, on_progress=on_progress)
        on_progress(task)
    out.waiting_on = None
    return task


def _finish(out: Output, task: Task) -> int:
    out.task(task)
    return OK if task.status == "COMPLETED" else TASK_FAILED


def cmd_submit(client: ExportsClient, out: Output, args: argparse.Namespace) -> int:
    task = client.submit(args.type, parse_filters(args.filter, args.filters_json), format=args.format,
                         timeout_sec=args.timeout_sec, callback_url=args.callback_url,
                         idempotency_key=args.idempotency_key)
    if not (args.wait or args.download):
        out.task(task)
        return OK
    out.waiting_on = task.task_id
    out.note(f"submitted {task.task_id} ({task.status})")
    task = _wait(client, out, task.task_id, args.max_wait)
    if task.status == "COMPLETED" and args.download:
        out.note(f"downloaded to {client.download(task, args.download)}")
    return _finish(out, task)


def cmd_status(client: ExportsClient, out: Output, args: argparse.Namespace) -> int:
    out.task(client.get(args.id))
    return OK


def cmd_wait(client: ExportsClient, out: Output, args: argparse.Namespace) -> int:
    return _finish(out, _wait(client, out, args.id, args.max_wait))


def cmd_cancel(client: ExportsClient, out: Output, args: argparse.Namespace) -> int:
    out.task(client.cancel(args.id))
    return OK


def cmd_download(client: ExportsClient, out: Output, args: argparse.Namespace) -> int:
    task = client.get(args.id)
    if task.status != "COMPLETED":
        out.note(f"task {task.task_id} is {task.status}: only a COMPLETED task has a file"
                 + (f"; wait for it first: exportctl wait {task.task_id}" if task.running else ""))
        return USAGE if task.running else TASK_FAILED
    out.data({"path": str(client.download(task, args.path)), "bytes": task.result.bytes if task.result else 0},
             [f"downloaded {task.task_id} to {args.path}"])
    return OK


def cmd_list(client: ExportsClient, out: Output, args: argparse.Namespace) -> int:
    tasks = list(client.list(args.status))
    out.data([t.to_dict() for t in tasks], [describe(t) for t in tasks])
    return OK


def cmd_types(client: ExportsClient, out: Output, args: argparse.Namespace) -> int:
    types = client.export_types()
    lines = [f"{t.export_type}: filters {', '.join(sorted(t.filters_schema.get('properties', {}))) or '(none)'}; "
             f"formats {', '.join(t.formats)}" + (f" ({t.compression})" if t.compression else "") for t in types]
    out.data([t.to_dict() for t in types], lines)
    return OK


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help="the gateway's URL (default: $EXPORTS_URL)")
    common.add_argument("--api-key", default=argparse.SUPPRESS, help="API key (default: $EXPORTS_API_KEY)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")
    top = argparse.ArgumentParser(prog="exportctl", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common])
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = top.add_subparsers(dest="command", required=True)

    def command(name: str, run: Callable[..., int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help)
        sub.set_defaults(run=run)
        return sub

    submit = command("submit", cmd_submit, "submit an export (add --wait to follow it)")
    submit.add_argument("type", help="export type (see: exportctl types)")
    submit.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                        help="a filter; VALUE is read as JSON when it is, else as a string; repeat a key for any-of")
    submit.add_argument("--filters-json", metavar="JSON", help="all filters as one JSON object")
    # formats and statuses are the gateway's to check: a newer gateway may offer some this version does not know
    submit.add_argument("--format", help="one the type offers (see: exportctl types); default: its first")
    submit.add_argument("--timeout-sec", type=int, metavar="N")
    submit.add_argument("--callback-url", metavar="URL")
    submit.add_argument("--idempotency-key", metavar="K", help="reuse one to make a repeated submit safe")
    submit.add_argument("--wait", action="store_true", help="wait for the task to end")
    submit.add_argument("--max-wait", type=float, default=300.0, metavar="SEC")
    submit.add_argument("--download", metavar="PATH", help="wait, then download the file here")
    command("status", cmd_status, "show a task").add_argument("id")
    wait = command("wait", cmd_wait, "wait for a task to end (a task id or a resume token)")
    wait.add_argument("id")
    wait.add_argument("--max-wait", type=float, default=300.0, metavar="SEC")
    command("cancel", cmd_cancel, "cancel a PENDING or RUNNING task").add_argument("id")
    download = command("download", cmd_download, "download a COMPLETED task's file")
    download.add_argument("id")
    download.add_argument("path")
    listing = command("list", cmd_list, "list your tasks, newest first")
    listing.add_argument("--status", help="only tasks in this status, e.g. RUNNING or COMPLETED")
    command("types", cmd_types, "the export types you may submit, with their filters")
    return top


def exit_code(exc: ExportsError) -> int:
    if isinstance(exc, NotFound):
        return NOT_FOUND
    if isinstance(exc, (RateLimited, Unavailable, DownloadError)):
        return UNAVAILABLE
    if isinstance(exc, ApiError) and exc.status is not None and exc.status >= 500:
        return UNAVAILABLE
    return USAGE


def resume_hint(task_id: str) -> str:
    return f"Resume with: exportctl wait {task_id}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Output(getattr(args, "json", False))
    # the SDK's warnings (the gateway unreachable, retrying in N s) as lines on stderr while they happen
    notes = logging.StreamHandler(out.err)
    notes.setFormatter(logging.Formatter("exportctl: %(message)s"))
    sdk_log = logging.getLogger("exports_client")
    sdk_log.addHandler(notes)
    try:
        with ExportsClient(getattr(args, "url", None), getattr(args, "api_key", None)) as client:
            code: int = args.run(client, out, args)
            return code
    except WaitTimeout as exc:
        if exc.task is not None:
            out.task(exc.task)
        task_id = exc.task.task_id if exc.task else json.loads(exc.resume_token)["task_id"]
        out.note(f"{exc}. {resume_hint(task_id)}")
        return STILL_RUNNING
    except KeyboardInterrupt:
        if out.waiting_on:
            out.note(f"stopped waiting; task {out.waiting_on} keeps running. {resume_hint(out.waiting_on)}")
        return INTERRUPTED
    except ExportsError as exc:
        out.note(f"exportctl: {exc}")
        if out.waiting_on and exit_code(exc) == UNAVAILABLE:
            out.note(f"stopped waiting; task {out.waiting_on} keeps running on the server. "
                     f"{resume_hint(out.waiting_on)} (once the gateway answers again)")
        return exit_code(exc)
    except ValueError as exc:  # a missing URL or key, a malformed --filter
        out.note(f"exportctl: {exc}")
        return USAGE
    finally:
        sdk_log.removeHandler(notes)


def _ctrl_c_interrupts() -> None:
    """Ctrl-C (SIGINT) stops a wait even when exportctl was started with it ignored or blocked, as a script's
    background job or a supervisor may start it: the wait then says how to resume instead of holding on."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def run() -> None:
    _ctrl_c_interrupts()
    sys.exit(main())


if __name__ == "__main__":
    run()
