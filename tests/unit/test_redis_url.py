"""`PIPELINE_REDIS_URL`: one server or Sentinel's primary; what a malformed URL answers,
and the broker settings kombu's Sentinel transport gets from a sentinel URL."""

from __future__ import annotations

import pytest
from redis.sentinel import SentinelManagedConnection

from app.celery_app import create_celery
from app.config.redis import (
    SentinelConnection,
    SentinelUrl,
    kombu_broker,
    make_redis,
    masked_url,
    parse_sentinel_url,
    replaced_when_idle,
)
from app.config.settings import load_settings
from app.errors import ConfigError


def test_a_sentinel_url_names_the_sentinels_the_primary_the_db_and_the_passwords():
    url = "sentinel://:s%40cret@h1:26379,h2,[::1]:26380/2?master=main&sentinel_password=pw"
    assert parse_sentinel_url(url) == SentinelUrl(
        sentinels=(("h1", 26379), ("h2", 26379), ("::1", 26380)),
        master="main",
        db=2,
        password="s@cret",
        sentinel_password="pw",
    )
    assert parse_sentinel_url("sentinel://h1:1/0?master=m").password is None


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://:pw@cache.example:6380/1",
        "sentinel://h1:26379,h2:26379/0?master=main",
        "sentinel://:pw@h1/0?master=main&sentinel_password=spw",
    ],
)
def test_settings_take_a_redis_or_sentinel_url(monkeypatch, url):
    monkeypatch.setenv("PIPELINE_REDIS_URL", url)
    assert load_settings().redis_url == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://h1:6379/0", "must start with redis://, rediss:// or sentinel://"),
        ("sentinel://:topsecret@h1:26379/0", "names no primary: add ?master=NAME"),
        ("sentinel://:topsecret@h1:26379/0?master=", "names no primary"),
        ("sentinel://h1:26379,:26380/0?master=m", "a sentinel with no host"),
        ("sentinel://h1:port/0?master=m", "port is not a number from 1 to 65535"),
        ("sentinel://h1:70000/0?master=m", "port is not a number from 1 to 65535"),
        ("sentinel://h1:26379/zero?master=m", "the database after the sentinels must be a number"),
        ("sentinel://h1:26379/0?master=m&service=x", "unknown parameter 'service'"),
        ("sentinel://h1:26379/0?master=m#x", "has a '#' part"),
    ],
)
def test_a_malformed_redis_url_is_one_config_error_without_the_url(monkeypatch, url, says):
    monkeypatch.setenv("PIPELINE_REDIS_URL", url)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("PIPELINE_REDIS_URL: ")
    assert says in message
    assert "topsecret" not in message


def test_kombu_gets_one_url_per_sentinel_and_the_primary_as_transport_options():
    options = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0, "retry_on_timeout": True}
    broker, extra = kombu_broker(
        "sentinel://:p%3Bw@h1:26379,h2:26380/3?master=main&sentinel_password=spw", options
    )
    assert broker == "sentinel://:p%3Bw@h1:26379/3;sentinel://:p%3Bw@h2:26380/3"
    assert extra == {
        "master_name": "main",
        "sentinel_kwargs": {
            "socket_timeout": 5.0,
            "socket_connect_timeout": 2.0,
            "password": "spw",
        },
    }
    assert kombu_broker("redis://h:6379/0", options) == ("redis://h:6379/0", {})


def test_the_celery_app_of_a_sentinel_url_uses_kombus_sentinel_transport(monkeypatch):
    monkeypatch.setenv("PIPELINE_REDIS_URL", "sentinel://h1:26379,h2:26379/0?master=main")
    celery = create_celery(load_settings())
    assert celery.conf.broker_url == "sentinel://h1:26379/0;sentinel://h2:26379/0"
    options = celery.conf.broker_transport_options
    assert options["master_name"] == "main"
    assert options["visibility_timeout"] > 0  # the pipeline's own options stay
    with celery.connection_for_write() as connection:  # builds, connects to nothing
        assert connection.transport_cls == "sentinel"


def test_our_client_of_a_sentinel_url_asks_the_sentinels_and_replaces_idle_connections():
    client = make_redis("sentinel://:pw@h1:26379,h2:26379/4?master=main")
    pool = client.connection_pool
    assert pool.service_name == "main"  # type: ignore[attr-defined]
    sentinels = pool.sentinel_manager.sentinels  # type: ignore[attr-defined]
    assert [s.connection_pool.connection_kwargs["host"] for s in sentinels] == ["h1", "h2"]
    assert pool.connection_class is SentinelConnection
    assert pool.connection_kwargs["db"] == 4
    assert pool.connection_kwargs["password"] == "pw"
    # kombu's Sentinel transport builds its connections from SentinelManagedConnection: the
    # workers' patch swaps it for ours as it does the plain transport's.
    assert replaced_when_idle(SentinelManagedConnection) is SentinelConnection
    client.close()


def test_printed_sentinel_urls_hide_both_passwords():
    url = "sentinel://:pw1@h1:26379,h2:26379/0?master=m&sentinel_password=pw2"
    assert masked_url(url) == "sentinel://:***@h1:26379,h2:26379/0?master=m&sentinel_password=***"
