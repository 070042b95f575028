"""The pure parts of `pipeline up`: which ports it checks and what it says when one is taken,
the prefix of each line, the ready banner, the workers' node names."""

from __future__ import annotations

import io
import socket
from pathlib import Path

from app.config.settings import Settings
from app.local.banner import Banner, http_url
from app.local.output import Output, decoded_line, prefixed
from app.local.ports import PortUse, first_conflict, ports_of
from app.local.readiness import worker_nodename


def settings(**values: object) -> Settings:
    return Settings(dev_mode=True, **values)  # type: ignore[arg-type]


def test_up_checks_the_intake_and_flower_and_the_embedded_redis_only_when_it_would_start_one():
    s = settings(intake_port=8100, flower_port=5600)
    assert [(u.port, u.setting) for u in ports_of(s, embedded_redis_port=None)] == [
        (8100, "PIPELINE_INTAKE_PORT"),
        (5600, "PIPELINE_FLOWER_PORT"),
    ]
    uses = ports_of(s, embedded_redis_port=6390)
    assert (uses[-1].host, uses[-1].port, uses[-1].setting) == (
        "127.0.0.1",
        6390,
        "PIPELINE_REDIS_URL",
    )
    assert uses[-1].purpose.startswith("the embedded Redis")


def test_a_taken_port_is_named_with_what_it_is_for_and_the_setting_that_moves_it():
    uses = ports_of(settings(intake_port=8100, flower_port=5600), embedded_redis_port=None)
    conflict = first_conflict(uses, is_free=lambda _host, port: port != 5600)
    assert conflict is not None
    assert conflict.startswith("port 5600 (Flower, PIPELINE_FLOWER_PORT) is taken")
    assert "127.0.0.1:5600" in conflict
    assert first_conflict(uses, is_free=lambda _host, _port: True) is None


def test_the_first_taken_port_is_named_in_the_order_the_components_start():
    uses = ports_of(settings(intake_port=8100, flower_port=5600), embedded_redis_port=6390)
    conflict = first_conflict(uses, is_free=lambda _host, _port: False)
    assert conflict is not None
    assert conflict.startswith("port 8100 (the intake, PIPELINE_INTAKE_PORT)")


def test_two_components_given_one_port_conflict_before_any_is_checked():
    uses = ports_of(settings(intake_port=7000, flower_port=7000), embedded_redis_port=None)
    checked: list[int] = []

    def is_free(_host: str, port: int) -> bool:
        checked.append(port)
        return True

    conflict = first_conflict(uses, is_free=is_free)
    assert conflict is not None
    assert "port 7000 is given to both the intake (PIPELINE_INTAKE_PORT)" in conflict
    assert "Flower (PIPELINE_FLOWER_PORT)" in conflict
    assert checked == [7000]  # the intake's, before Flower's turned out to be the same


def test_port_zero_means_any_free_port_and_is_never_taken():
    use = PortUse(host="127.0.0.1", port=0, purpose="the intake", setting="PIPELINE_INTAKE_PORT")
    assert first_conflict([use, use], is_free=lambda _host, _port: False) is None


def test_each_line_comes_after_its_components_name_padded_to_one_column():
    assert prefixed("beat", "beat: Starting...", width=13) == "beat          | beat: Starting..."
    assert prefixed("worker-refund", "", width=13) == "worker-refund | "
    assert decoded_line(b"ready.\r\n") == "ready."
    assert decoded_line(b"caf\xe9\n") == "caf\ufffd"


def test_output_prefixes_every_line_and_keeps_a_secret_out_of_the_log_file():
    terminal, log_file = io.StringIO(), io.StringIO()
    output = Output(terminal=terminal, log_file=log_file, names=["worker-order", "flower"])
    output.line("worker-order", "one\ntwo")
    output.show_once("up", ["password hunter2-hunter2"], ["password on the terminal only"])
    assert terminal.getvalue().splitlines() == [
        "worker-order | one",
        "worker-order | two",
        "up           | password hunter2-hunter2",
    ]
    assert "hunter2" not in log_file.getvalue()
    assert log_file.getvalue().splitlines()[-1] == "up           | password on the terminal only"


def test_output_copies_a_childs_stream_line_by_line_until_it_ends():
    terminal = io.StringIO()
    output = Output(terminal=terminal, log_file=None, names=["intake"])
    output.pump("intake", io.BytesIO(b"started\npartial line without an end"))
    output.drain(timeout_s=5)
    assert terminal.getvalue().splitlines() == [
        "intake | started",
        "intake | partial line without an end",
    ]


def banner(**values: object) -> Banner:
    fields: dict[str, object] = {
        "intake_url": "http://127.0.0.1:8000",
        "flower_url": "http://127.0.0.1:5555",
        "flower_user": "admin",
        "flower_password": "s3cret-pw",
        "dev_mode": True,
        "log_path": Path("/srv/app/.pipeline/up.log"),
        "redis": "embedded at redis://127.0.0.1:6379/0",
        "journal": "sqlite:///./pipeline.db",
    }
    return Banner(**(fields | values))  # type: ignore[arg-type]


def test_the_banner_names_every_url_the_credential_dev_mode_and_the_log_file():
    text = "\n".join(banner().lines(show_secret=True))
    assert "intake     http://127.0.0.1:8000\n" in text
    assert "console    http://127.0.0.1:8000/\n" in text
    assert "API docs   http://127.0.0.1:8000/docs\n" in text
    assert "Flower     http://127.0.0.1:5555 (user admin, password s3cret-pw; shown once)" in text
    assert "dev mode   on: unsigned requests" in text
    assert "/srv/app/.pipeline/up.log" in text
    assert text.startswith("==== pipeline is up ====")


def test_the_banner_for_the_log_file_leaves_the_password_out():
    assert "s3cret-pw" not in "\n".join(banner().lines(show_secret=False))


def test_the_banner_names_a_configured_credential_by_its_setting_and_dev_mode_off():
    text = "\n".join(banner(flower_password=None, dev_mode=False).lines(show_secret=True))
    assert "user and password from PIPELINE_FLOWER_BASIC_AUTH" in text
    assert "dev mode   off: requests must be signed with a key of PIPELINE_INTAKE_KEYS" in text


def test_the_banner_says_which_components_did_not_answer_in_time():
    lines = banner(not_answering=("worker-refund",)).lines(show_secret=False)
    assert lines[0] == "==== pipeline is up, but these did not answer yet: worker-refund ===="


def test_urls_reach_a_server_on_every_address_through_loopback():
    assert http_url("0.0.0.0", 8000, "/docs") == "http://127.0.0.1:8000/docs"  # noqa: S104
    assert http_url("::", 8000) == "http://[::1]:8000"
    assert http_url("::1", 5555) == "http://[::1]:5555"
    assert http_url("localhost", 5555) == "http://localhost:5555"


def test_a_lines_worker_is_the_node_named_after_the_line_on_this_host():
    assert worker_nodename("order") == f"order@{socket.gethostname()}"
