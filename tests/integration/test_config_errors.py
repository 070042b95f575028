"""Errors for people: a database URL that cannot work stops every command at its start with
one line naming the variable; a misspelt `PIPELINE_` variable is pointed out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO, run_until_exit

PIPELINE = str(Path(sys.executable).with_name("pipeline"))
# Every command that reads the settings (`bench` takes its own journal as an option).
COMMANDS = [
    ["up"],
    ["intake"],
    ["worker", "order"],
    ["beat"],
    ["flower"],
    ["status"],
    ["replay", "--dry-run"],
    ["db", "upgrade"],
    ["schedules", "list"],
    ["records", "list"],
    ["records", "show", "01J00000000000000000000000"],
    ["pause", "order"],
    ["resume", "order"],
    ["audit"],
    ["send", "order", '{"business_no": "C-1"}'],
]


def environment(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    # Nothing listens there: no command may get as far as waiting for Redis.
    return env | {"PIPELINE_REDIS_URL": "redis://127.0.0.1:9/0", **variables}


def run(args: list[str], **variables: str) -> subprocess.CompletedProcess:
    """A command that stops by itself (it starts no other process)."""
    return subprocess.run(
        [PIPELINE, *args],
        cwd=REPO,
        env=environment(**variables),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_one_config_line(code: int | None, stderr: str, *said: str) -> str:
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("pipeline: configuration error: PIPELINE_DATABASE_URL: ")
    for words in said:
        assert words in lines[0]
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_every_command_refuses_a_database_it_cannot_use_with_one_line(command, tmp_path):
    # In a process group of its own, stopped and killed if it runs on: a command that got
    # past its settings (`up`, `intake`, a worker) would not stop by itself.
    code, stderr = run_until_exit(
        [PIPELINE, *command],
        env=environment(PIPELINE_DATABASE_URL="mysql://app:hunter2@db.example/pipeline"),
        cwd=tmp_path,
        timeout_s=60,
    )
    line = assert_one_config_line(code, stderr, "'mysql' is not supported", "postgresql+psycopg")
    assert "hunter2" not in line


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgres//app@db/pipeline", "cannot be read as a database URL"),
        ("postgresql+psycopg://app:hunter2@db:port/pipeline", "cannot be read as a database URL"),
        ("postgresql+nosuchdriver://app@db/pipeline", "postgresql has no driver 'nosuchdriver'"),
        ("postgresql+asyncpg://app@db/pipeline", "asynchronous"),
        ("sqlite://", "in-memory"),
    ],
)
def test_a_database_url_that_cannot_work_is_named_with_what_to_write(url, said):
    result = run(["status"], PIPELINE_DATABASE_URL=url)
    line = assert_one_config_line(result.returncode, result.stderr, said)
    assert "hunter2" not in line


def test_an_unknown_pipeline_variable_is_warned_of_with_the_closest_name(tmp_path):
    result = run(
        ["db", "upgrade"],
        PIPELINE_DATABASE_URL=f"sqlite:///{tmp_path / 'journal.db'}",
        PIPELINE_INTAKE_KEY='{"shop-1": "its-secret-of-32-random-bytes-xx"}',
        PIPELINE_FAVOURITE_COLOUR="blue",
        PIPELINE_LINES__ORDER__CONCURRENCY="2",
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("pipeline:")]
    assert warnings == [
        "pipeline: warning: PIPELINE_FAVOURITE_COLOUR is not a setting and is ignored",
        "pipeline: warning: PIPELINE_INTAKE_KEY is not a setting and is ignored; "
        "did you mean PIPELINE_INTAKE_KEYS?",
    ]


def test_a_misspelt_line_setting_is_a_configuration_error_naming_the_closest(tmp_path):
    result = run(
        ["db", "upgrade"],
        PIPELINE_DATABASE_URL=f"sqlite:///{tmp_path / 'journal.db'}",
        PIPELINE_LINES__ORDER__MAX_QUEUE_LENGHT="5",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "pipeline: configuration error: PIPELINE_LINES__ORDER__MAX_QUEUE_LENGHT: is not a "
        "setting; did you mean PIPELINE_LINES__ORDER__MAX_QUEUE_LENGTH?"
    ]


def test_the_processes_a_command_starts_do_not_warn_again(tmp_path):
    """`pipeline up` warns once: the processes it starts inherit the mark it leaves."""
    result = run(
        ["db", "upgrade"],
        PIPELINE_DATABASE_URL=f"sqlite:///{tmp_path / 'journal.db'}",
        PIPELINE_INTAKE_KEY="{}",
        PIPELINE_ENVIRONMENT_CHECKED="1",
    )
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr
