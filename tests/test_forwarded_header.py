"""The client address behind trusted proxies read from `Forwarded` (RFC 7239) by its grammar, against hostile
values: separators inside quoted-strings, escapes, quotes left open, empty and malformed elements, huge headers.

Pure functions over a request's headers; the gateway process reading them is tested in test_limits.py.
"""
from __future__ import annotations

import time

import pytest

from gateway.client_address import MAX_CHAIN, client_address, forwarded_chain
from gateway.forwarded_header import elements
from gateway.forwarding import ForwardedHeader, TrustedProxies


def chain(*lines: str) -> list[str]:
    return forwarded_chain({"headers": [(b"forwarded", line.encode("latin-1")) for line in lines]})


@pytest.mark.parametrize(("lines", "expected"), [
    # a quoted-string holds its ",", ";" and "=" (RFC 9110 section 5.6.4)
    (['for="[2001:db8::1]:4711";proto=http, for="x,y";by=z'], ["2001:db8::1", "x,y"]),
    (['for=198.51.100.66;host="x;for=6.6.6.6"'], ["198.51.100.66"]),
    (['for=198.51.100.66;host="a,for=6.6.6.6"'], ["198.51.100.66"]),
    (['for="a=b;c"'], ["a=b;c"]),
    # a quoted-pair's backslash is taken off, its escaped quote ends nothing
    (['for="a\\"b, for=6.6.6.6";by=c'], ['a"b, for=6.6.6.6']),
    # names are case-insensitive, whitespace around the separators optional, empty elements and pairs ignored
    ([', ,FOR=192.0.2.1 ; proto=http ,, for=192.0.2.2 ;;,'], ["192.0.2.1", "192.0.2.2"]),
    # several field lines are one list, in order
    (["for=192.0.2.1", "for=192.0.2.2, for=192.0.2.3"], ["192.0.2.1", "192.0.2.2", "192.0.2.3"]),
    # unquoted addresses with ":" (no tchar, so the RFC wants them quoted) read as proxies write them
    (["for=2001:db8::1"], ["2001:db8::1"]),
    (["for=203.0.113.7:4711, for=[2001:db8::2]:80"], ["203.0.113.7", "2001:db8::2"]),
])
def test_quoted_strings_are_read_as_one_value(lines: list[str], expected: list[str]) -> None:
    assert chain(*lines) == expected


@pytest.mark.parametrize(("lines", "expected"), [
    # a malformed element and all left of it are ignored; those right of it are read
    (["for=6.6.6.6, bad, for=192.0.2.1"], ["192.0.2.1"]),
    (["for=6.6.6.6, for=a b, for=192.0.2.1"], ["192.0.2.1"]),
    (["for=6.6.6.6, for=192.0.2.7;for=192.0.2.8, for=192.0.2.1"], ["192.0.2.1"]),  # a parameter twice
    (["for=6.6.6.6, =x", "for=192.0.2.1"], ["192.0.2.1"]),
    # a quote never closed swallows the rest of its line: the proxy's element after it is lost, and the
    # client's own element left of it must not become the rightmost hop
    (['for=6.6.6.6, for="x, for=192.0.2.1'], []),
    (['for=6.6.6.6, for="x\\"'], []),
    (['for=6.6.6.6, for="x', "for=192.0.2.1"], ["192.0.2.1"]),
    (['"', '"'], []),
    # an element without a for= (a proxy that wrote only proto= or host=) ends the chain like a malformed one:
    # the client's own for= left of it must not become the rightmost hop
    (["for=6.6.6.6, proto=https;host=api.example"], []),
    (["for=6.6.6.6", "proto=https"], []),
    (["proto=https;host=a.example, for=192.0.2.9"], ["192.0.2.9"]),
])
def test_a_malformed_element_hides_everything_left_of_it(lines: list[str], expected: list[str]) -> None:
    assert chain(*lines) == expected


def test_a_forged_address_inside_a_quoted_value_is_not_the_client() -> None:
    """A proxy quoting the client's Host: the old split on ";" took the forged for= as the rightmost hop."""
    trusted = TrustedProxies(["127.0.0.0/8"])
    scope = {"type": "http", "client": ("127.0.0.1", 5000),
             "headers": [(b"forwarded", b'for=198.51.100.66;host="x;for=6.6.6.6"')]}
    assert client_address(scope, trusted) == "198.51.100.66"
    scope["headers"] = [(b"forwarded", b'for=6.6.6.6, for="x, for=198.51.100.66')]
    assert client_address(scope, trusted) == "127.0.0.1"  # nothing readable left: the trusted peer


@pytest.mark.parametrize("line", [
    "", ",", ";", "=", '"', '""', "\\", 'for="\\', "for=\x00", "for=\xff", 'for="\xff"', "for=" + "a" * 100_000,
    '"' * 100_001, ";" * 100_000, 'for="' + "\\a" * 50_000, "for=a;" * 20_000, 'for=",' * 20_000,
])
def test_hostile_values_never_raise_and_stay_linear(line: str) -> None:
    started = time.process_time()
    found = list(elements(line))
    chain(line)
    assert time.process_time() - started < 1.0, len(line)  # a header is at most a few KiB at the edge
    assert all(element is None or isinstance(element, dict) for element in found)


def test_at_most_max_chain_hops_are_read() -> None:
    many = ", ".join(f"for=10.0.{i // 250}.{i % 250}" for i in range(5000))
    hops = chain(many)
    assert len(hops) == MAX_CHAIN and hops[-1] == "10.0.19.249"


def test_only_the_last_characters_are_read_so_padding_costs_nothing() -> None:
    padded = "for=6.6.6.6;" + "a" * 60_000 + ", for=192.0.2.1"
    assert chain(padded) == ["192.0.2.1"]
    started = time.process_time()
    for _ in range(100):
        chain(";" * 65_000 + ", for=192.0.2.1")
    assert time.process_time() - started < 0.5  # each reads FORWARDED_TAIL characters, not 65,000


def _scope(headers: list[tuple[bytes, bytes]]) -> dict[str, object]:
    return {"type": "http", "client": ("127.0.0.1", 5000), "headers": headers}


XFF_AND_FORWARDED = [(b"x-forwarded-for", b"6.6.6.6"), (b"forwarded", b"for=203.0.113.7")]


def test_a_request_with_both_headers_is_believed_in_neither_on_auto() -> None:
    """A proxy writes one of them and passes the other on as the client wrote it: the client would choose."""
    trusted = TrustedProxies(["127.0.0.0/8"])
    assert client_address(_scope(XFF_AND_FORWARDED), trusted) == "127.0.0.1"
    assert client_address(_scope(XFF_AND_FORWARDED[:1]), trusted) == "6.6.6.6"
    assert client_address(_scope(XFF_AND_FORWARDED[1:]), trusted) == "203.0.113.7"


@pytest.mark.parametrize(("header", "expected"), [("forwarded", "203.0.113.7"), ("x-forwarded-for", "6.6.6.6")])
def test_the_configured_header_is_the_only_one_read(header: ForwardedHeader, expected: str) -> None:
    trusted = TrustedProxies(["127.0.0.0/8"], header)
    assert client_address(_scope(XFF_AND_FORWARDED), trusted) == expected
