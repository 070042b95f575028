"""`pipeline up` and a Redis it did not start: it says so, loudly, and refuses a database
that holds another application's keys unless told to share it (`--share-redis`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config.redis import make_redis
from app.local.embedded_redis import RedisServer, answers
from app.local.shared_redis import foreign_keys, is_ours
from tests.integration.test_cli import PIPELINE
from tests.integration.test_up import LINES, START_TIMEOUT_S, up_env
from tests.support.processes import (
    free_port,
    run_until_exit,
    start_up,
    stop_up,
    wait_for,
)

# Another application's keys, beside which the pipeline's queues would sit.
FOREIGN = {"shop:session:42": "alice", "shop:cart:42": "3 items", "rate:alice": "7"}


def test_the_keys_kombu_and_celery_make_for_the_lines_are_ours_and_no_others():
    ours = [
        "pipeline:metrics",
        "_kombu.binding.order",
        "_kombu.binding_deadlines",
        "_kombu.binding_permanent.celery",
        "unacked",
        "unacked_index",
        "unacked_mutex",
        "order",
        "order\x06\x163",
        "celery",
        "5c0e6f2a-0d4b-4d55-9f7c-1a2b3c4d5e6f.reply.celery.pidbox",
    ]
    theirs = ["orders", "shop:session:42", "celery-task-meta-1", "pipeline-other", "unacked2"]
    assert [key for key in ours if not is_ours(key, LINES)] == []
    assert [key for key in theirs if is_ours(key, LINES)] == []


@pytest.fixture
def foreign_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of its own, started here (not by `pipeline up`), whose database 0
    holds another application's keys; stopped by PID."""
    server = RedisServer(port=free_port(), workdir=tmp_path / "redis")
    server.start()
    try:
        client = server.client()
        try:
            client.mset(FOREIGN)
        finally:
            client.close()
        yield server
    finally:
        server.stop()


def has_keys(url: str) -> bool:
    client = make_redis(url)
    try:
        return bool(client.dbsize())
    finally:
        client.close()


def env_for(server: RedisServer, **variables: str) -> dict[str, str]:
    return up_env(redis_port=server.port, intake_port=free_port(), flower_port=free_port()) | (
        variables
    )


def test_up_refuses_a_redis_it_did_not_start_that_holds_another_applications_keys(
    foreign_redis, tmp_path
):
    code, stderr = run_until_exit(
        [PIPELINE, "up"], env=env_for(foreign_redis), cwd=tmp_path, timeout_s=60
    )
    assert code == 2, stderr
    assert f"127.0.0.1:{foreign_redis.port}/0" in stderr
    assert f"{len(FOREIGN)} key(s) of another application" in stderr
    # Only the first part of a key is named: a whole key may be a secret (`sess:<token>`).
    assert "'shop:…'" in stderr
    assert "'rate:…'" in stderr
    assert "session:42" not in stderr
    assert "alice" not in stderr
    # The two ways out: an empty database, or sharing it knowingly.
    assert "empty database" in stderr
    assert "--share-redis" in stderr
    assert "PIPELINE_REDIS_SHARED=true" in stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "pipeline.db").exists()  # nothing started
    assert not (tmp_path / ".pipeline").exists()
    client = foreign_redis.client()
    try:
        assert client.mget(list(FOREIGN)) == [v.encode() for v in FOREIGN.values()]
    finally:
        client.close()


@pytest.mark.parametrize("how", ["flag", "setting", "empty database"])
def test_up_uses_it_when_told_to_share_it_or_given_an_empty_database_and_says_so(
    how, foreign_redis, tmp_path
):
    argv = [PIPELINE, "up"]
    env = env_for(foreign_redis)
    if how == "flag":
        argv.append("--share-redis")
    elif how == "setting":
        env["PIPELINE_REDIS_SHARED"] = "true"
    else:
        env["PIPELINE_REDIS_URL"] = f"redis://127.0.0.1:{foreign_redis.port}/1"
    output_path = tmp_path / "terminal.txt"
    process = start_up(argv, cwd=tmp_path, env=env, output_path=output_path)

    def output() -> str:
        return output_path.read_text(errors="replace")

    try:

        def up() -> bool:
            assert process.poll() is None, output()
            return "==== pipeline is up" in output()

        wait_for(up, timeout_s=START_TIMEOUT_S, what="the ready banner")
        text = output()
        assert re.search(
            r"pipeline up: warning: using a Redis that pipeline up did NOT start", text
        )
        assert "redis      redis://127.0.0.1:" in text
        assert "NOT started by pipeline up" in text
        assert "redis embedded server" not in text
        # What a running stack keeps in the database is the pipeline's; the rest is not.
        url = f"redis://127.0.0.1:{foreign_redis.port}/0"
        found = foreign_keys(url, LINES)
        assert (found.count, set(found.samples)) == (len(FOREIGN), {"shop:…", "rate:…"}), found
        if how == "empty database":
            ours = f"redis://127.0.0.1:{foreign_redis.port}/1"
            wait_for(lambda: has_keys(ours), timeout_s=30, what="the stack's keys in db 1")
            assert foreign_keys(ours, LINES).count == 0
    finally:
        stop_up(process, output())
    assert process.returncode == 0, output()
    assert answers(f"redis://127.0.0.1:{foreign_redis.port}/0")  # not ours to stop
