"""Every `python -m gateway ...`, `python -m backend_stub ...` and `exportctl ...` command the README and the docs
give parses with the real command line: a renamed subcommand or option fails here until the pages follow."""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from backend_stub.__main__ import make_app as backend_app
from backend_stub.config import BackendConfig
from exports_client.cli import parser as exportctl_parser
from exports_common.cli import main as process_main
from gateway.__main__ import cli as gateway_cli

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "sdk" / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
         *sorted((ROOT / "examples").glob("*/README.md"))]
PROGRAMS = {"python -m gateway": "gateway", "python -m backend_stub": "backend_stub", "exportctl": "exportctl"}
COMMAND = re.compile(r"(?:python -m (?:gateway|backend_stub)|exportctl)\b[^`|;&>#\n]*")
# the pages' placeholders, each given a value of its kind
PLACEHOLDERS = {"ID": "exp-20261201-u6riea1kts76a8oghuiy", "FILE": "gateway.yaml", "NEW.yaml": "new.yaml",
                "OLD.yaml": "old.yaml", "KEY": "a-key-0123456789", "N": "2", "H": "127.0.0.1", "P": "8080",
                "...": "order_export"}


class Parsed(Exception):
    """The command line parsed: raised instead of running the command."""


def fragments(text: str) -> Iterator[str]:
    """Each command in a page's code: fenced blocks (continued lines joined) and inline spans, cut at `;`, `&&`,
    pipes, redirects and comments."""
    code = re.findall(r"```[^\n]*\n(.*?)```", text, re.S) + re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    for block in code:
        yield from (match.group(0).strip() for match in COMMAND.finditer(block.replace("\\\n", " ")))


def argv_of(fragment: str) -> tuple[str, list[str]] | None:
    """The program and its arguments, placeholders filled and `[optional]` brackets dropped; None for a mention
    of the program alone or of one option (`exportctl --format`, checked against the options there are)."""
    program = next(name for prefix, name in PROGRAMS.items() if fragment.startswith(prefix))
    if fragment.endswith(" ...") and fragment.count(" ") == (1 if program == "exportctl" else 3):
        return None  # `python -m gateway ...`: the program named, no command
    words = [PLACEHOLDERS.get(word, word) for word in shlex.split(re.sub(r"\[(--[^]]*)\]", r"\1", fragment))]
    args = words[3:] if program != "exportctl" else words[1:]
    if not args or (args[0].startswith("--") and args[0] not in ("--help", "--version") and len(args) == 1):
        return None
    return program, args


def _stop(parsed: argparse.Namespace) -> NoReturn:
    raise Parsed(parsed)


def parse(program: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse `args` as `program` does, running nothing (argparse's own exit on --help or --version passes)."""
    original: Callable[..., argparse.Namespace] = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, argv: list[str] | None = None,
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        _stop(original(self, argv, namespace))

    if program == "exportctl":
        exportctl_parser().parse_args(args)
        return
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    with pytest.raises(Parsed):
        if program == "gateway":
            gateway_cli(args)
        else:
            process_main("backend_stub", BackendConfig, "config/backend.yaml", backend_app, args)


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    """Every option the parser or one of its commands takes, as their help pages list them."""
    pages = [parser.format_help()]
    commands = re.search(r"\{([\w,-]+)\}", pages[0])
    for command in commands.group(1).split(",") if commands else []:
        page = io.StringIO()
        with contextlib.redirect_stdout(page), pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        pages.append(page.getvalue())
    return {option for page in pages for option in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", page)}


def all_commands() -> list[tuple[str, str]]:
    return sorted({(str(page.relative_to(ROOT)), fragment) for page in PAGES
                   for fragment in fragments(page.read_text())})


def test_the_pages_give_commands_to_check() -> None:
    named = {argv[1][0] for _, fragment in all_commands() if (argv := argv_of(fragment)) is not None}
    assert {"conformance", "migrate-config", "check-config", "run", "submit", "wait"} <= named


@pytest.mark.parametrize(("page", "fragment"), all_commands())
def test_a_command_in_the_pages_parses(page: str, fragment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = argv_of(fragment)
    if argv is None:
        option = fragment.rsplit(maxsplit=1)[-1]
        if option.startswith("-"):
            assert option in options_of(exportctl_parser()), f"{page}: `{fragment}`: exportctl has no {option}"
        return
    program, args = argv
    try:
        parse(program, args, monkeypatch)
    except SystemExit as stop:
        assert stop.code == 0, f"{page}: `{fragment}` does not parse (exit {stop.code})"


@pytest.mark.parametrize("fragment", ["exportctl submitt order_export", "exportctl wait ID --max-wiat 5",
                                      "python -m gateway migrate FILE", "python -m backend_stub run --workers N"])
def test_a_command_the_programs_do_not_take_fails(fragment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = argv_of(fragment)
    assert argv is not None
    with pytest.raises(SystemExit) as stop:
        parse(*argv, monkeypatch)
    assert stop.value.code == 2
