"""--generation / --peers specs: several addresses, or a DNS name that resolves to many."""

import asyncio
import socket

import pytest

from services.preprocess.resolver import Resolver, parse, system_lookup


def run(coro):
    return asyncio.run(coro)


def test_a_list_of_literal_addresses_is_static():
    resolver = Resolver("10.0.0.2:50052, 10.0.0.1:50052,[::1]:7")
    assert resolver.is_static
    assert run(resolver.resolve()) == ["10.0.0.1:50052", "10.0.0.2:50052", "[::1]:7"]


def test_one_name_stands_for_every_address_it_resolves_to():
    answers = {"generation": ["10.1.0.5", "10.1.0.7", "10.1.0.5"]}

    async def lookup(host, port):
        return answers[host]

    resolver = Resolver("generation:50052", lookup=lookup)
    assert not resolver.is_static
    assert run(resolver.resolve()) == ["10.1.0.5:50052", "10.1.0.7:50052"]
    answers["generation"] = ["10.1.0.7", "10.1.0.9"]  # a pod replaced: the next resolution sees it
    assert run(resolver.resolve()) == ["10.1.0.7:50052", "10.1.0.9:50052"]


def test_a_failed_lookup_keeps_the_last_answer():
    calls = []

    async def lookup(host, port):
        calls.append(host)
        if len(calls) > 1:
            raise socket.gaierror(socket.EAI_AGAIN, "temporary failure")
        return ["10.1.0.5"]

    resolver = Resolver("generation:50052", lookup=lookup)
    assert run(resolver.resolve()) == run(resolver.resolve()) == ["10.1.0.5:50052"]


def test_a_name_with_ipv4_and_ipv6_answers_is_one_replica_not_two():
    async def both(host, port, type=0):  # what getaddrinfo answers for localhost on many hosts
        return [(socket.AF_INET6, type, 6, "", ("::1", port, 0, 0)), (socket.AF_INET, type, 6, "", ("127.0.0.1", port))]

    async def only_v6(host, port, type=0):
        return [(socket.AF_INET6, type, 6, "", ("fd00::5", port, 0, 0))]

    async def lookup_with(getaddrinfo):
        asyncio.get_running_loop().getaddrinfo = getaddrinfo
        return await system_lookup("localhost", 50052)

    assert run(lookup_with(both)) == ["127.0.0.1"]
    assert run(lookup_with(only_v6)) == ["fd00::5"]


@pytest.mark.parametrize("spec", ["", "host", "host:", ":50052", "host:port", "host:70000", "a:1,,b"])
def test_specs_that_are_not_host_port_are_refused(spec):
    if spec == "a:1,,b":
        with pytest.raises(ValueError, match="'b'"):
            parse(spec)
    else:
        with pytest.raises(ValueError):
            parse(spec)
