from __future__ import annotations

import json

import pytest

from app.config.line_settings import Overflow
from app.config.settings import load_settings
from app.errors import ConfigError
from app.lines import HTTP_SINK_BATCH, TABLE_SINK_BATCH, LineRegistry


def test_defaults_declare_the_three_lines():
    settings = load_settings()
    assert list(settings.lines) == ["order", "refund", "status"]
    order = settings.lines["order"]
    assert (order.max_queue_length, order.overflow, order.concurrency, order.max_attempts) == (
        10_000,
        Overflow.DEFER,
        4,
        8,
    )
    assert not settings.dev_mode  # asked for with PIPELINE_DEV_MODE, never implied
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.database_url == "sqlite:///./pipeline.db"


def test_line_variables_override_one_setting_and_keep_the_rest(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__ORDER__MAX_QUEUE_LENGTH", "500")
    monkeypatch.setenv("PIPELINE_LINES__REFUND__OVERFLOW", "reject")
    monkeypatch.setenv("PIPELINE_LINES__SHIPMENT__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    settings = load_settings()
    assert settings.lines["order"].max_queue_length == 500
    assert settings.lines["order"].overflow is Overflow.DEFER
    assert settings.lines["refund"].overflow is Overflow.REJECT
    assert settings.lines["status"].payload_schema == "app.payloads:StatusPayload"
    assert settings.lines["shipment"].downstream_url == "http://127.0.0.1:9/in"
    assert LineRegistry.from_settings(settings).names() == ["order", "refund", "status", "shipment"]


def test_batch_size_defaults_to_a_batch_on_the_table_sink_and_the_http_sink(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__REFUND__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    monkeypatch.setenv("PIPELINE_LINES__WIDE__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    monkeypatch.setenv("PIPELINE_LINES__WIDE__DELIVERIES_IN_FLIGHT", "40")
    monkeypatch.setenv("PIPELINE_LINES__NARROW__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    monkeypatch.setenv("PIPELINE_LINES__NARROW__DELIVERIES_IN_FLIGHT", "5")
    monkeypatch.setenv("PIPELINE_LINES__STATUS__BATCH_SIZE", "1")
    monkeypatch.setenv("PIPELINE_LINES__HELD__HANDLER", "tests.support.handlers:slow")
    monkeypatch.setenv("PIPELINE_LINES__BULK__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    monkeypatch.setenv("PIPELINE_LINES__BULK__BATCH_SIZE", "4")
    lines = LineRegistry.from_settings(load_settings())
    assert {line.name: line.batch_size for line in lines} == {
        "order": TABLE_SINK_BATCH,
        # The HTTP sink delivers a message's records concurrently: HTTP_SINK_BATCH of them,
        # fewer when the line keeps fewer in flight.
        "refund": HTTP_SINK_BATCH,
        "wide": HTTP_SINK_BATCH,
        "narrow": 5,
        "status": 1,
        "held": 1,
        "bulk": 4,
    }


def test_intake_keys_leave_dev_mode(monkeypatch):
    monkeypatch.setenv("PIPELINE_INTAKE_KEYS", '{"shop": "s3cret-of-16-bytes"}')
    monkeypatch.setenv("PIPELINE_DEV_MODE", "true")
    settings = load_settings()
    assert not settings.in_dev_mode
    assert "s3cret" not in repr(settings)


def test_dev_mode_is_in_force_only_when_asked_for_and_no_keys_are_set(monkeypatch):
    assert not load_settings().in_dev_mode
    monkeypatch.setenv("PIPELINE_DEV_MODE", "true")
    assert load_settings().in_dev_mode


@pytest.mark.parametrize(
    ("keys", "key_id", "problem"),
    [
        # "shop" + nonce "1:abc" and "shop:1" + nonce "abc" would be one dedup key.
        ({"shop:1": "a-secret-long-enough"}, "shop:1", "':'"),
        # The dedup keys of scheduled fires are schedule:<name>:<time>.
        ({"schedule": "a-secret-long-enough"}, "schedule", "reserved"),
        ({"bench": "a-secret-long-enough"}, "bench", "reserved"),
        ({"dev": "a-secret-long-enough"}, "dev", "reserved"),
        ({"shop": ""}, "shop", "16 bytes"),
        ({"shop": "fifteen-bytes.."}, "shop", "16 bytes"),
        ({"ok": "a-secret-long-enough", "": "a-secret-long-enough"}, "''", "empty"),
    ],
)
def test_an_ambiguous_or_reserved_key_id_or_a_short_secret_is_refused(
    monkeypatch, keys, key_id, problem
):
    monkeypatch.setenv("PIPELINE_INTAKE_KEYS", json.dumps(keys))
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("PIPELINE_INTAKE_KEYS: ")
    assert key_id in message
    assert problem in message
    assert "\n" not in message
    for secret in keys.values():
        assert not secret or secret not in message


def test_a_secret_of_16_bytes_and_a_key_id_with_dots_and_dashes_are_accepted(monkeypatch):
    monkeypatch.setenv("PIPELINE_INTAKE_KEYS", '{"shop-1.eu_west": "sixteen-bytes..."}')
    assert list(load_settings().intake_keys) == ["shop-1.eu_west"]


@pytest.mark.parametrize(
    "credential",
    [
        # Flower splits its credential on commas: this one would let in `admin:abc` and,
        # with no user at all, `def`.
        "admin:abc,def",
        "admin:abc,ops:def",
        "admin:,",
        "admin",
        "admin:pass word",
    ],
)
def test_a_flower_credential_flower_cannot_take_whole_is_refused(monkeypatch, credential):
    monkeypatch.setenv("PIPELINE_FLOWER_BASIC_AUTH", credential)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("PIPELINE_FLOWER_BASIC_AUTH: ")
    password = credential.partition(":")[2]
    if password.strip(","):
        assert password not in message


def test_a_toml_file_named_by_pipeline_config_is_read(monkeypatch, tmp_path):
    config = tmp_path / "pipeline.toml"
    config.write_text("intake_port = 9001\n[lines.order]\nmax_queue_length = 7\n")
    monkeypatch.setenv("PIPELINE_CONFIG", str(config))
    settings = load_settings()
    assert settings.intake_port == 9001
    assert settings.lines["order"].max_queue_length == 7
    assert settings.lines["refund"].max_queue_length == 10_000


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPELINE_LINES__ORDER__OVERFLOW", "drop"),
        ("PIPELINE_LINES__ORDER__MAX_QUEUE_LENGTH", "0"),
        ("PIPELINE_LINES__STATUS__CONCURRENCY", "-1"),
        ("PIPELINE_LINES__STATUS__INTAKE_RATE", "0"),
        ("PIPELINE_LINES__STATUS__INTAKE_RATE", "fast"),
        ("PIPELINE_LINES__REFUND__DOWNSTREAM_URL", "ftp://example"),
        ("PIPELINE_INTAKE_KEYS", "[1, 2"),
        ("PIPELINE_SWEEP_INTERVAL_SECONDS", "0"),
        ("PIPELINE_CONFIG", "/no/such/pipeline.toml"),
    ],
)
def test_a_bad_value_is_one_config_error_naming_the_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert variable in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "path", ["no_such_module.handle", "tests.support.handlers:nothing", "1bad:"]
)
def test_an_unknown_handler_is_a_config_error_naming_the_variable(monkeypatch, path):
    monkeypatch.setenv("PIPELINE_LINES__ORDER__HANDLER", path)
    with pytest.raises(ConfigError, match="PIPELINE_LINES__ORDER__HANDLER: cannot import"):
        LineRegistry.from_settings(load_settings())


@pytest.mark.parametrize(
    "path", ["tests.support.broken_handler.handle", "tests.support.broken_handler:handle"]
)
def test_a_handler_whose_module_fails_to_import_is_reported_with_the_cause(monkeypatch, path):
    monkeypatch.setenv("PIPELINE_LINES__ORDER__HANDLER", path)
    with pytest.raises(ConfigError, match="No module named 'not_installed_dependency'"):
        LineRegistry.from_settings(load_settings())


@pytest.mark.parametrize("path", ["app.payloads:StatusPayload", "app.payloads.StatusPayload"])
def test_a_payload_schema_is_named_with_a_colon_or_a_dot(monkeypatch, path):
    monkeypatch.setenv("PIPELINE_LINES__ORDER__PAYLOAD_SCHEMA", path)
    registry = LineRegistry.from_settings(load_settings())
    assert registry.get("order").schema.__name__ == "StatusPayload"


def test_a_line_delivers_on_2xx_alone_and_waits_10_s_by_default():
    refund = load_settings().lines["refund"]
    assert refund.delivered_statuses == "2xx"
    assert refund.delivery_timeout_s == 10
    delivered = refund.delivered
    assert all(code in delivered for code in (200, 201, 204, 299))
    assert not any(code in delivered for code in (199, 300, 404, 409, 500))


@pytest.mark.parametrize(
    ("value", "normalized", "yes", "no"),
    [
        ("2xx,409", "2xx,409", [200, 202, 409], [300, 408, 410, 500]),
        (" 409 , 2XX ", "2xx,409", [201, 409], [404]),
        ("204", "204", [204], [200, 409]),
        ("409,204,409", "204,409", [204, 409], [200]),
    ],
)
def test_delivered_statuses_is_2xx_and_exact_codes(monkeypatch, value, normalized, yes, no):
    monkeypatch.setenv("PIPELINE_LINES__REFUND__DELIVERED_STATUSES", value)
    monkeypatch.setenv("PIPELINE_LINES__REFUND__DELIVERY_TIMEOUT_S", "0.5")
    refund = load_settings().lines["refund"]
    assert refund.delivered_statuses == normalized
    assert refund.delivery_timeout_s == 0.5
    assert all(code in refund.delivered for code in yes)
    assert not any(code in refund.delivered for code in no)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPELINE_LINES__REFUND__DELIVERED_STATUSES", ""),
        ("PIPELINE_LINES__REFUND__DELIVERED_STATUSES", "3xx"),
        ("PIPELINE_LINES__REFUND__DELIVERED_STATUSES", "2xx,"),
        ("PIPELINE_LINES__REFUND__DELIVERED_STATUSES", "2xx;409"),
        ("PIPELINE_LINES__REFUND__DELIVERED_STATUSES", "ok"),
        ("PIPELINE_LINES__REFUND__DELIVERED_STATUSES", "2xx,500"),
        ("PIPELINE_LINES__REFUND__DELIVERED_STATUSES", "99"),
        ("PIPELINE_LINES__ORDER__DELIVERY_TIMEOUT_S", "0"),
        ("PIPELINE_LINES__ORDER__DELIVERY_TIMEOUT_S", "-1"),
        ("PIPELINE_LINES__ORDER__DELIVERY_TIMEOUT_S", "soon"),
    ],
)
def test_a_bad_delivery_setting_is_one_config_error_naming_it(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert variable in str(caught.value)
    assert "\n" not in str(caught.value)


def test_named_admin_tokens_name_their_actors_beside_the_single_one(monkeypatch):
    monkeypatch.setenv("PIPELINE_ADMIN_TOKEN", "the-single-admin-token")
    monkeypatch.setenv(
        "PIPELINE_ADMIN_TOKENS",
        json.dumps({"alice": "alice-token-of-24-bytes", "bob": "bob-token-of-24-bytes-x"}),
    )
    actors = load_settings().admin_actors
    assert {name: token.get_secret_value() for name, token in actors.items()} == {
        "alice": "alice-token-of-24-bytes",
        "bob": "bob-token-of-24-bytes-x",
        "admin": "the-single-admin-token",
    }


@pytest.mark.parametrize(
    "tokens", [{"alice": "short"}, {"": "a-token-long-enough-here"}, {"a\nb": "x" * 20}]
)
def test_a_named_admin_token_too_short_or_badly_named_is_refused(monkeypatch, tokens):
    monkeypatch.setenv("PIPELINE_ADMIN_TOKENS", json.dumps(tokens))
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith("PIPELINE_ADMIN_TOKENS: ")
    assert all(len(token) < 16 or token not in message for token in tokens.values())


@pytest.mark.parametrize(
    ("tokens", "named"),
    [
        ({"cli:alice": "a-token-long-enough-here"}, "cli:alice"),
        ({"dev": "a-token-long-enough-here"}, "dev"),
        ({"al ice": "a-token-long-enough-here"}, "al ice"),
        ({"<b>eve</b>": "a-token-long-enough-here"}, "<b>eve</b>"),
    ],
)
def test_an_admin_token_name_that_could_pass_for_another_actor_is_refused(
    monkeypatch, tokens, named
):
    # `cli:<user>` names a command-line user and `dev` the dev mode's actor in the audit
    # log; a name with spaces or markup would be shown as something else.
    monkeypatch.setenv("PIPELINE_ADMIN_TOKENS", json.dumps(tokens))
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert named in str(refused.value)


def test_one_token_for_two_actors_is_refused(monkeypatch):
    # Which of the two did it could not be told.
    same = "one-token-for-both-of-them"
    monkeypatch.setenv("PIPELINE_ADMIN_TOKENS", json.dumps({"alice": same, "bob": same}))
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert "alice" in str(refused.value)
    assert "bob" in str(refused.value)
    assert same not in str(refused.value)


def test_a_named_admin_beside_the_single_token_is_refused(monkeypatch):
    # The single token's actor is `admin`: a named `admin` would make two of them.
    monkeypatch.setenv("PIPELINE_ADMIN_TOKEN", "the-single-admin-token")
    monkeypatch.setenv("PIPELINE_ADMIN_TOKENS", json.dumps({"admin": "another-admin-token-x"}))
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert "admin" in str(refused.value)


def test_a_short_single_admin_token_is_refused(monkeypatch):
    monkeypatch.setenv("PIPELINE_ADMIN_TOKEN", "short")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert str(refused.value).startswith("PIPELINE_ADMIN_TOKEN: ")


def test_intake_lines_are_comma_separated_and_must_name_lines(monkeypatch):
    monkeypatch.setenv("PIPELINE_INTAKE_LINES", " order , refund")
    assert load_settings().intake_lines == ["order", "refund"]
    monkeypatch.setenv("PIPELINE_INTAKE_LINES", "order,shipment")
    with pytest.raises(ConfigError, match="PIPELINE_INTAKE_LINES names no such line: shipment"):
        load_settings()
    monkeypatch.setenv("PIPELINE_INTAKE_LINES", ",")
    with pytest.raises(ConfigError, match="PIPELINE_INTAKE_LINES is empty"):
        load_settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PIPELINE_NICE", "20"),
        ("PIPELINE_NICE", "-1"),
        ("PIPELINE_LINES__ORDER__DELIVERY_RATE", "0"),
        ("PIPELINE_LINES__ORDER__DELIVERY_CONCURRENCY", "0"),
        ("PIPELINE_LINES__ORDER__DELIVERIES_IN_FLIGHT", "0"),
        ("PIPELINE_LINES__ORDER__CIRCUIT_MIN_ATTEMPTS", "0"),
    ],
)
def test_delivery_limits_and_priority_out_of_range_are_refused(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        load_settings()


@pytest.mark.parametrize("name", ["replay", "records", "alerts"])
def test_a_line_named_after_one_of_the_intakes_own_paths_is_refused(monkeypatch, name):
    monkeypatch.setenv(f"PIPELINE_LINES__{name.upper()}__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    with pytest.raises(ConfigError, match=f"line name '{name}' is one of the intake's own paths"):
        load_settings()


def test_a_delivery_that_could_outlive_its_lease_is_refused_naming_the_settings(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__SHIPMENT__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    monkeypatch.setenv("PIPELINE_LINES__SHIPMENT__DELIVERY_TIMEOUT_S", "100")
    # Lease 114 s: a wait for room of 28.5 s, the request's 100 s and a second's margin.
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    assert "PIPELINE_LINES__SHIPMENT__DELIVERY_TIMEOUT_S" in message
    assert "PIPELINE_VISIBILITY_TIMEOUT_SECONDS" in message
    monkeypatch.setenv("PIPELINE_VISIBILITY_TIMEOUT_SECONDS", "200")  # lease 190 s
    assert load_settings().lines["shipment"].delivery_timeout_s == 100
    # A table-sink line's timeout bounds no request: it is not held to its lease.
    monkeypatch.setenv("PIPELINE_LINES__ORDER__DELIVERY_TIMEOUT_S", "600")
    assert load_settings().lines["order"].delivery_timeout_s == 600
