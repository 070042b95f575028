"""Unknown `PIPELINE_` variables and the closest known name."""

from __future__ import annotations

import pytest

from app.config.names import is_known, unknown_variables
from app.config.settings import closest_known


@pytest.mark.parametrize(
    "name",
    [
        "PIPELINE_REDIS_URL",
        "pipeline_redis_url",
        "PIPELINE_CONFIG",
        "PIPELINE_TEST_DATABASE_URL",
        "PIPELINE_LINES__ORDER__MAX_QUEUE_LENGTH",
        "PIPELINE_LINES__SHIPMENT",
        "PIPELINE_INTAKE_KEYS__shop-1",
        "PIPELINE_ENVIRONMENT_CHECKED",
    ],
)
def test_the_settings_own_names_are_known(name):
    assert is_known(name)


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("PIPELINE_INTAKE_KEY", "PIPELINE_INTAKE_KEYS"),
        ("PIPELINE_DEVMODE", "PIPELINE_DEV_MODE"),
        ("PIPELINE_DATABASE", "PIPELINE_DATABASE_URL"),
        ("PIPELINE_LINE__ORDER__CONCURRENCY", "PIPELINE_LINES__ORDER__CONCURRENCY"),
        ("PIPELINE_LINES__ORDER__MAX_QUEUE_LENGHT", "PIPELINE_LINES__ORDER__MAX_QUEUE_LENGTH"),
        ("PIPELINE_LINES__SHIPMENT__DOWNSTREAM_ULR", "PIPELINE_LINES__SHIPMENT__DOWNSTREAM_URL"),
        ("PIPELINE_LINES__ORDER__FOO", None),
        ("PIPELINE_FAVOURITE_COLOUR", None),
    ],
)
def test_the_closest_known_name_is_offered_only_when_it_is_close(name, closest):
    assert closest_known(name) == closest


def test_only_unknown_pipeline_variables_are_reported_by_name():
    environ = {
        "PIPELINE_REDIS_URL": "redis://h/0",
        "PIPELINE_INTAKE_KEY": "{}",
        "PIPELINE_FAVOURITE_COLOUR": "blue",
        "HOME": "/root",
    }
    assert [u.warning() for u in unknown_variables(environ)] == [
        "PIPELINE_FAVOURITE_COLOUR is not a setting and is ignored",
        "PIPELINE_INTAKE_KEY is not a setting and is ignored; did you mean PIPELINE_INTAKE_KEYS?",
    ]
