"""SSRF policy: every spelling of a non-public address is refused, and the delivery dials only what was checked."""
from __future__ import annotations

import ipaddress
import socket

import aiohttp
import pytest

from exports_common.netpolicy import AddressPolicy, PinnedResolver, RefusedAddress, host_name_problem, refusal
from tests.receiver import Receiver

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it

POLICY = AddressPolicy()


@pytest.mark.parametrize("address", [
    "::ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:0:127.0.0.1", "::ffff:0:10.0.0.1", "::ffff:0:a9fe:a9fe",
    "::127.0.0.1", "::10.0.0.1", "::169.254.169.254",
    "64:ff9b::127.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::7f00:1", "64:ff9b:1:ffff::a00:1",
    "2002:7f00:1::", "2002:a9fe:a9fe::1", "2002:c0a8:101::",
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1 (stored inverted)
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1
])
def test_ipv4_inside_ipv6_is_judged_as_the_ipv4_it_reaches(address: str) -> None:
    assert not POLICY.address_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["::ffff:8.8.8.8", "::ffff:0:8.8.8.8", "64:ff9b::8.8.8.8", "2002:808:808::",
                                     "::8.8.8.8", "2001:0:4136:e378:8000:63bf:f7f7:f7f7", "2606:4700:4700::1111"])
def test_public_addresses_in_any_spelling_are_allowed(address: str) -> None:
    assert POLICY.address_allowed(ipaddress.ip_address(address))


def test_allow_networks_apply_to_the_unwrapped_address() -> None:
    policy = AddressPolicy.from_lists([], ["127.0.0.0/8"])
    assert policy.address_allowed(ipaddress.ip_address("::ffff:127.0.0.1"))
    assert policy.address_allowed(ipaddress.ip_address("64:ff9b::127.0.0.1"))
    assert not policy.address_allowed(ipaddress.ip_address("::ffff:10.0.0.1"))


@pytest.mark.parametrize("url", ["http://[::127.0.0.1]/", "http://[64:ff9b::7f00:1]/", "http://[2002:7f00:1::]/",
                                 "http://2130706433/", "http://0x7f.1/", "http://[::ffff:169.254.169.254]/",
                                 "http://[::ffff:0:127.0.0.1]/", "http://[::ffff:0:a9fe:a9fe]:8080/"])
async def test_refusal_of_literal_spellings(url: str) -> None:
    assert await refusal(url, POLICY) is not None


@pytest.mark.parametrize("host", ["a..b", "-a.example", "a-.example", "x" * 64 + ".example", "a_b.example",
                                  ("a" * 60 + ".") * 5 + "com", "exa mple.com", "a\x00b.com", "."])
def test_host_names_that_are_not_dns_names(host: str) -> None:
    assert host_name_problem(host) is not None


@pytest.mark.parametrize("host", ["example.com", "hooks.example.co.uk", "bücher.example", "127.0.0.1", "[::1]",
                                  "localhost", "example.com."])
def test_valid_host_names(host: str) -> None:
    assert host_name_problem(host) is None


async def test_pinned_resolver_answers_only_checked_addresses() -> None:
    resolver = PinnedResolver(POLICY)
    with pytest.raises(RefusedAddress):
        await resolver.resolve("localhost", 80, socket.AF_UNSPEC)
    with pytest.raises(RefusedAddress):
        await resolver.resolve("a..b", 80, socket.AF_UNSPEC)
    allowed = await PinnedResolver(AddressPolicy.from_lists([], ["127.0.0.0/8"])).resolve("localhost", 80,
                                                                                          socket.AF_INET)
    assert [r["host"] for r in allowed] == ["127.0.0.1"] and allowed[0]["hostname"] == "localhost"


async def test_pinned_connector_dials_the_checked_address_and_keeps_the_name() -> None:
    """The connection goes where the resolver's checked answer points, with the name in the Host header;
    under a policy that refuses the address, no connection is made at all."""
    with Receiver() as receiver:
        port = receiver.server.server_address[1]
        for policy, allowed in ((AddressPolicy.from_lists([], ["127.0.0.0/8"]), True), (POLICY, False)):
            connector = aiohttp.TCPConnector(resolver=PinnedResolver(policy), use_dns_cache=False)
            async with aiohttp.ClientSession(connector=connector) as session:
                try:
                    async with session.post(f"http://localhost:{port}/hook", data=b"{}") as resp:
                        assert allowed and resp.status == 204
                except aiohttp.ClientConnectorError as exc:
                    assert not allowed and isinstance(exc.os_error, RefusedAddress)
    assert receiver.count() == 1
    assert receiver.received[0].headers["host"] == f"localhost:{port}"
