"""Load a YAML config file into a pydantic model.

`${NAME}` and `${NAME:-default}` in string values read the environment. Every
problem is reported with its path in the file and its line, so `check-config`
can name all of them at once.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import types
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

M = TypeVar("M", bound=BaseModel)
Loc = tuple[str | int, ...]
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# A config is a few KB: these bound what a hostile or mistaken file can cost to load (the
# nodes counted after alias expansion, as a YAML alias bomb multiplies them)
MAX_FILE_BYTES = 1 << 20
MAX_NODES = 10_000


class ConfigError(Exception):
    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = problems

    def report(self) -> str:
        return "\n".join([f"{self.source}: {len(self.problems)} problem(s)"] + [f"  - {p}" for p in self.problems])


def interpolate(value: Any, path: str, missing: list[str]) -> Any:
    if isinstance(value, dict):
        return {k: interpolate(v, f"{path}.{k}" if path else str(k), missing) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, f"{path}[{i}]", missing) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        missing.append(f"{path}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")
        return ""

    return _ENV_REF.sub(replace, value)


def _line_of(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The line of `loc` in the file, or of the nearest enclosing block written there (a missing key's parent)."""
    if not loc:  # the whole file: its first line would point at whatever key comes first
        return None
    node, found = root, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        if node is None:
            break
        found = node
    return found.start_mark.line + 1 if found is not None else None


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _read(path: str | Path, source: str) -> str:
    """The file's text, refused past MAX_FILE_BYTES before more than that is read."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, [f"cannot read the file: {exc.strerror}"]) from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(source, [f"the file is larger than {MAX_FILE_BYTES} bytes (1 MiB): a config is far "
                                   f"smaller; is this the right file?"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [f"not UTF-8 text: {exc}"]) from exc


class _Cycle(Exception):
    """An alias inside the node it names."""


def expanded_size(root: yaml.Node, limit: int) -> int | None:
    """How many nodes the document has once every alias is expanded (a node an alias names counts again at
    each use), or None past `limit`, or when an alias refers to a node that contains it (no finite size).

    Composing keeps an alias as a reference to its anchored node, so this walk costs the
    file's own node count however far aliases would multiply it (a "billion laughs" file
    of a few KB expands to billions); only a document under the limit is then built.
    """
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise _Cycle
        open_.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                break
        open_.discard(key)
        sizes[key] = total = min(total, limit + 1)
        return total

    try:
        found = size(root)
    except _Cycle:
        return None
    return found if found <= limit else None


def parse(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    """The YAML document and its node tree (for line numbers), refused past MAX_NODES nodes after aliases."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return {}, None
        if expanded_size(root, MAX_NODES) is None:
            raise ConfigError(source, [f"the YAML has more than {MAX_NODES} values once its aliases (*name) are "
                                       f"expanded, or an alias that contains itself: write the values out"])
        return loader.construct_document(root), root
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"not valid YAML: {exc}"]) from exc
    except RecursionError:
        raise ConfigError(source, ["the YAML is nested too deeply"]) from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> Any:
    """The file's YAML document, within the bounds on its size and on its aliases' expansion (blocking)."""
    return parse(_read(path, str(path)), str(path))[0]


def load_model(path: str | Path, model: type[M]) -> M:
    """The file as a `model`. Blocking (reads and validates): the running processes call it off their event loop."""
    source = str(path)
    raw, root = parse(_read(path, source), source)
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(source, ["the top level must be a mapping"])
    missing: list[str] = []
    data = interpolate(raw, "", missing)
    if missing:
        raise ConfigError(source, missing)
    return validate_data(data, model, source, root)


def validate_data(data: Any, model: type[M], source: str, root: yaml.Node | None = None) -> M:
    """`data` as a `model`, or a ConfigError naming every problem by its path (and line, given the YAML)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = error_loc(err)
            path = _without_tags(model, loc)  # as written in the file
            line = _line_of(root, path)
            where = f"{_format_loc(path)}" + (f" (line {line})" if line else "")
            problems.append(f"{where}: {error_message(model, loc, err)}")
        raise ConfigError(source, problems) from exc


def problem(loc: Loc, message: str, value: Any = None) -> InitErrorDetails:
    """A problem a validator found at `loc` (below the model it validates), for ValidationError.from_exception_data:
    check-config then names that path and its line, not the object the validator was given."""
    return InitErrorDetails(type=PydanticCustomError("config", "{message}", {"message": message}), loc=loc,
                            input=value)


def located(title: str, problems: list[tuple[Loc, str]]) -> ValidationError:
    """Each (path, message) as one error of a ValidationError, for a validator to raise."""
    return ValidationError.from_exception_data(title, [problem(loc, message) for loc, message in problems])


def error_loc(err: ErrorDetails) -> Loc:
    """The error's path in the file (without the names pydantic gives validator functions)."""
    return tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))


def error_message(model: type[BaseModel], loc: tuple[Any, ...], err: ErrorDetails) -> str:
    ctx = err.get("ctx", {})
    if err["type"] == "extra_forbidden":
        return unknown_key_message(model, loc) or err["msg"]
    if err["type"] == "value_error":  # our validators' own sentences, without pydantic's "Value error, " before them
        return str(ctx.get("error", err["msg"]))
    if err["type"] == "union_tag_invalid":
        return f"unknown {ctx['discriminator']} {ctx['tag']!r}; known: {ctx['expected_tags']}"
    if err["type"] == "union_tag_not_found":
        tags = _tags(model, loc, str(ctx["discriminator"]).strip("'"))
        return f"{ctx['discriminator']} is missing; one of: {', '.join(map(repr, tags))}"
    return err["msg"]


def _tagged(tp: Any, part: str | int) -> type[BaseModel] | None:
    """The member of a union discriminated by a literal field that `part` names (pydantic puts the tag in a
    location, between the union's key and the member's fields), or None. A one-member union is its member."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    members = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
    for member in members:
        if isinstance(member, type) and issubclass(member, BaseModel) and part not in member.model_fields and any(
                get_origin(f.annotation) is Literal and part in get_args(f.annotation)
                for f in member.model_fields.values()):
            return member
    return None


def _tags(model: type[BaseModel], loc: tuple[Any, ...], discriminator: str) -> list[str]:
    """The tags of the union at `loc` discriminated by the field `discriminator`: what that field may say."""
    tp: Any = model
    for part in loc:
        tp = _inside(tp, part)
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    members = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
    return [str(tag) for member in members if isinstance(member, type) and issubclass(member, BaseModel)
            for name, f in member.model_fields.items() if name == discriminator and get_origin(f.annotation) is Literal
            for tag in get_args(f.annotation)]


def _without_tags(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pydantic error location as a path in the file: the tags of discriminated unions left out."""
    tp: Any = model
    path = []
    for part in loc:
        member = _tagged(tp, part)
        if member is not None:
            tp = member
            continue
        path.append(part)
        tp = _inside(tp, part)
    return tuple(path)


def _inside(tp: Any, part: str | int) -> Any:
    """The type found at key or index `part` of a value of type `tp`, or None when it cannot be told."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _inside(get_args(tp)[0], part)
    if (member := _tagged(tp, part)) is not None:
        return member
    if origin in (Union, types.UnionType):
        return next((t for t in (_inside(arg, part) for arg in get_args(tp)) if t is not None), None)
    if origin is list and isinstance(part, int):
        return get_args(tp)[0]
    if origin is dict and isinstance(part, str):
        return get_args(tp)[1]
    if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
        return next((f.annotation for n, f in tp.model_fields.items() if part in (n, f.alias)), None)
    return None


def _model_in(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    if get_origin(tp) in (Union, types.UnionType, Annotated):
        return next((m for m in map(_model_in, get_args(tp)) if m is not None), None)
    return None


def unknown_key_message(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """For an unknown key at `loc` inside `model`: the sentence naming it and the nearest known key, if any."""
    tp: Any = model
    for part in loc[:-1]:
        tp = _inside(tp, part)
    found = _model_in(tp)
    if found is None or not loc:
        return None
    key = str(loc[-1])
    known = [f.alias or n for n, f in found.model_fields.items()]
    close = difflib.get_close_matches(key, known, n=1)
    return f"unknown key {key!r}, did you mean {close[0]!r}?" if close else \
        f"unknown key {key!r} (known: {', '.join(known)})"


def write_schema(model: type[BaseModel], path: str | Path) -> None:
    Path(path).write_text(json.dumps(model.model_json_schema(), indent=2) + "\n")
