from __future__ import annotations

import pytest

from app.intake.exposure import cross_site, is_loopback_address, is_loopback_host


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


@pytest.mark.parametrize(
    "headers",
    [
        {"host": "127.0.0.1:8000"},  # curl: no Origin
        {"host": "127.0.0.1:8000", "origin": "http://127.0.0.1:8000"},
        {"host": "pipeline.example", "origin": "https://pipeline.example"},
        {"host": "pipeline.example:443", "origin": "https://pipeline.example"},
        {
            "host": "127.0.0.1:8000",
            "origin": "https://ops.example",
            "x-forwarded-host": "ops.example",
        },
        {"host": "[::1]:8000", "origin": "http://[::1]:8000", "sec-fetch-site": "same-origin"},
        {"host": "127.0.0.1:8000", "sec-fetch-site": "none"},
    ],
)
def test_the_intakes_own_pages_and_clients_without_origin_may_act(headers):
    assert cross_site("POST", headers) is None


@pytest.mark.parametrize(
    "headers",
    [
        {"host": "127.0.0.1:8000", "origin": "http://127.0.0.1:9999"},
        {"host": "127.0.0.1:8000", "origin": "http://localhost:8000"},
        {"host": "127.0.0.1:8000", "origin": "null"},
        {"host": "pipeline.example:443", "origin": "http://pipeline.example"},  # port 80
        {"host": "127.0.0.1:8000", "sec-fetch-site": "same-site"},
        {"host": "127.0.0.1:8000", "sec-fetch-site": "cross-site"},
        {"host": "127.0.0.1:8000", "origin": "http://evil.example", "x-forwarded-host": "x"},
    ],
)
def test_a_page_of_another_site_may_not_act(headers):
    assert cross_site("POST", headers) is not None
    assert cross_site("GET", headers) is None  # reads act on nothing
