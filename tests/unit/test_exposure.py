from __future__ import annotations

import pytest

from app.intake.exposure import is_loopback_address, is_loopback_host


@pytest.mark.parametrize(
    "host",
    ["localhost", "LOCALHOST:80", "127.0.0.1", "127.0.0.1:8000", "127.1.2.3", "[::1]", "[::1]:9"],
)
def test_loopback_names_with_or_without_a_port_are_loopback(host):
    assert is_loopback_host(host)


@pytest.mark.parametrize(
    "host",
    [
        "",
        "evil.example",
        "evil.example:8000",
        "localhost.evil.example",
        "127.0.0.1.evil.example",
        "192.0.2.7",
        "127.0.0.1:x",
        "[::1]x",
        "::1",  # an IPv6 address in Host is bracketed
        "[::ffff:192.0.2.7]",
    ],
)
def test_other_names_are_not(host):
    assert not is_loopback_host(host)


def test_an_ipv4_client_on_a_dual_stack_socket_is_loopback_when_it_is():
    assert is_loopback_address("::ffff:127.0.0.1")
    assert not is_loopback_address("::ffff:192.0.2.7")
