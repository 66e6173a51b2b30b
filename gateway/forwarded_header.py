"""The `Forwarded` header (RFC 7239) read as its grammar says, quoted-strings and all.

RFC 7239 section 4:

    Forwarded         = 1#forwarded-element
    forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
    forwarded-pair    = token "=" value
    value             = token / quoted-string

with RFC 9110's `token` (section 5.6.2), `quoted-string` and `quoted-pair` (5.6.4), the list rule
`#` and its empty elements (5.6.1), and optional whitespace (5.6.3) around the "," and ";"
separators. A `,` `;` `=` or escaped `"` inside a quoted-string is part of the value.

No library the project depends on reads this header on its own: werkzeug's list and dict helpers
(not a dependency) split on "," only, and aiohttp's parser is a property of its own request object.

One leniency: an unquoted value may hold any character but the separators, quotes and
whitespace, as proxies write IPv6 addresses and ports without the quotes the RFC asks for.

A client writes whatever it likes here, so nothing raises: an element that breaks the grammar
(a name that is not a token, a value that is missing, a parameter twice, junk after a value)
is malformed, and so is the rest of a field line after a quoted-string that is
never closed, since where it was meant to end cannot be known.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

# RFC 9110 section 5.6.2: tchar
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# RFC 9110 section 5.6.4: DQUOTE *( qdtext / quoted-pair ) DQUOTE, obs-text being the bytes 0x80-0xFF (latin-1)
_QUOTED_STRING = r'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
# a value beyond the grammar's token, up to the next separator: proxies write `for=2001:db8::1` and
# `for=192.0.2.7:4711` unquoted (`:` is no tchar), and reading them as written beats counting every client
# behind such a proxy as the proxy
_LENIENT = r'[^",;\s]+'
_PAIR = re.compile(rf"({_TOKEN})=({_QUOTED_STRING}|{_LENIENT})")
_QUOTED_PAIR = re.compile(r"\\(.)", re.DOTALL)
# a malformed element's extent: up to the next "," outside a quoted-string, or an unclosed quote
_SKIP = re.compile(rf'(?:[^",]|{_QUOTED_STRING})*')

Element = dict[str, str]


def _ows(line: str, pos: int) -> int:
    """Past the optional whitespace (RFC 9110 section 5.6.3: spaces and tabs) at `pos`."""
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


def _value(raw: str) -> str:
    """A value as meant: a quoted-string's quotes and quoted-pair escapes taken off."""
    return _QUOTED_PAIR.sub(r"\1", raw[1:-1]) if raw.startswith('"') else raw


def _element(line: str, pos: int) -> tuple[Element | None, int]:
    """The forwarded-element starting at `pos` (its parameters, names lower-cased) or None if malformed, and
    where the next element starts (past the end of `line` when this one was the last)."""
    pairs: Element = {}
    while True:
        pos = _ows(line, pos)
        pair = _PAIR.match(line, pos)
        if pair is not None:
            name = pair[1].lower()  # parameter names are case-insensitive (RFC 7239 section 4)
            if name in pairs:  # "each parameter MUST NOT occur more than once per forwarded-element"
                break
            pairs[name] = _value(pair[2])
            pos = _ows(line, pair.end())
        if pos == len(line) or line[pos] == ",":
            return pairs, pos + 1
        if line[pos] != ";":
            break
        pos += 1
    skipped = _SKIP.match(line, pos)
    assert skipped is not None  # the pattern matches the empty string
    stop = skipped.end()
    return None, stop + 1 if stop < len(line) and line[stop] == "," else len(line) + 1


def elements(line: str) -> Iterator[Element | None]:
    """Each forwarded-element of one field line, in order, None for a malformed one; empty ones (", ,"), which
    a recipient ignores (RFC 9110 section 5.6.1), are not yielded."""
    pos = 0
    while pos <= len(line):
        element, pos = _element(line, pos)
        if element != {}:
            yield element
