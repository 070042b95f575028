"""The checkers of compose.yaml: it is read as compose reads it (YAML with anchors, then
`${VAR...}` interpolation) and checked against the `pipeline` command, Celery's command
line and `app.config.settings`. Each checker reports problems as strings."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import pytest
import typer
import typer.core
import typer.main
import yaml
from celery import Celery
from celery.bin.celery import celery as celery_cli
from celery.worker.control import Panel

from app.cli.main import cli
from app.config.line_settings import LineSettings
from app.config.settings import DEFAULT_LINES, ENV_PREFIX, Settings, load_settings
from app.lines import LineRegistry

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "compose.yaml"

# What an operator's `.env` supplies for the variables compose.yaml requires (`${VAR:?…}`):
# the examples of the file's header.
OPERATOR_ENV = {
    "PIPELINE_INTAKE_KEYS": '{"shop-1": "a-long-random-secret"}',
    "PIPELINE_ADMIN_TOKEN": "another-long-random-secret",
    "PIPELINE_FLOWER_BASIC_AUTH": "admin:a-third-secret",
}

EXPECTED_SERVICES = {
    "redis",
    "postgres",
    "migrate",
    "intake",
    "worker-order",
    "worker-refund",
    "worker-status",
    "flower",
}
ONE_SHOT_SERVICES = {"migrate"}
DEPENDS_ON_CONDITIONS = {
    "service_started",
    "service_healthy",
    "service_completed_successfully",
}

# Compose's interpolation: `$$`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
# `${VAR:?message}`, `${VAR?message}`, `${VAR:+other}`, `${VAR+other}` and `$VAR`.
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>\w+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|(?P<bare>\w+))"
)


class Problem(Exception):
    """Something compose.yaml gets wrong; the message says what and where."""


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    """`text` with compose's variables replaced, as compose would with `environ` set.

    Raises `Problem` where compose would refuse (`:?`) or fall back to an empty string."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["name"] or match["bare"]
        op, arg = match["op"], match["arg"] or ""
        value = environ.get(name)
        is_set = value is not None and (value != "" or not (op or "").startswith(":"))
        if op is None:
            if value is None:
                raise Problem(f"${{{name}}} has no default and is not set")
            return value
        if op.endswith("-"):
            return value if is_set else arg
        if op.endswith("+"):
            return arg if is_set else ""
        if not is_set:
            raise Problem(f"compose refuses to start: {name}: {arg}")
        return value

    return _VARIABLE.sub(replace, text)


def interpolate_tree(node: Any, environ: Mapping[str, str]) -> Any:
    """Every string value of a loaded compose file interpolated (keys are left alone)."""
    if isinstance(node, str):
        return interpolate(node, environ)
    if isinstance(node, list):
        return [interpolate_tree(item, environ) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, environ) for key, value in node.items()}
    return node


def environment_of(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's environment, from the mapping or the `KEY=value` list form.

    A bare `KEY` (passed through from the host) has no value here and is left out."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = [item.partition("=") for item in env]
        return {key: value for key, sep, value in pairs if sep}
    return {
        key: (str(value).lower() if isinstance(value, bool) else str(value))
        for key, value in env.items()
        if value is not None
    }


def argv_of(command: str | list[str]) -> list[str]:
    """A `command` as compose runs it: a string is split as a shell would."""
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def healthcheck_argv(test: str | list[str]) -> tuple[str, list[str]]:
    """(form, argv) of a healthcheck `test`: `CMD` runs argv as is, `CMD-SHELL` in `sh -c`."""
    if isinstance(test, str):
        return "CMD-SHELL", shlex.split(test)
    form, *rest = test
    if form == "CMD-SHELL":
        return form, shlex.split(" ".join(rest))
    return form, list(rest)


def line_names(env: Mapping[str, str]) -> set[str]:
    """The lines a process with `env` has: the defaults and any `PIPELINE_LINES__X__…`."""
    names = set(DEFAULT_LINES)
    for key in env:
        parts = key.removeprefix(ENV_PREFIX).lower().split("__")
        if key.startswith(ENV_PREFIX) and parts[0] == "lines" and len(parts) > 1:
            names.add(parts[1])
    return names


def setting_problems(env: Mapping[str, str]) -> list[str]:
    """Every `PIPELINE_` variable of `env` that names no setting."""
    problems = []
    for key in env:
        if not key.startswith(ENV_PREFIX):
            continue
        parts = key.removeprefix(ENV_PREFIX).lower().split("__")
        if parts[0] not in Settings.model_fields:
            problems.append(f"{key}: no setting {parts[0]!r}")
        elif parts[0] == "lines" and len(parts) != 3:
            problems.append(f"{key}: must be PIPELINE_LINES__<LINE>__<SETTING>")
        elif parts[0] == "lines" and parts[2] not in LineSettings.model_fields:
            problems.append(f"{key}: no line setting {parts[2]!r}")
        elif parts[0] != "lines" and len(parts) != 1:
            problems.append(f"{key}: {parts[0]!r} is not a nested setting")
    return problems


PIPELINE_CLI = typer.main.get_command(cli)


def parse_pipeline(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """(subcommand path, parsed parameters) of `pipeline ARGS`. Raises `Problem`."""
    command, path, rest = PIPELINE_CLI, [], list(args)
    while isinstance(command, typer.core.TyperGroup):
        if not rest or rest[0].startswith("-"):
            raise Problem(f"pipeline {' '.join(path)}: a subcommand must follow")
        name = rest.pop(0)
        sub = command.commands.get(name)
        if sub is None:
            raise Problem(f"pipeline {' '.join([*path, name])}: no such command")
        command, path = sub, [*path, name]
    info_name = " ".join(["pipeline", *path])
    try:
        ctx = command.make_context(info_name, rest, resilient_parsing=False)
    except typer.TyperException as exc:  # typer's own click raises these
        raise Problem(f"{info_name} {shlex.join(args[len(path) :])}: {exc}") from None
    except typer.Exit:
        raise Problem(f"{info_name}: would print its help and exit") from None
    return path, ctx.params


def parse_celery(args: list[str]) -> tuple[str, dict[str, Any]]:
    """(subcommand, parsed parameters) of `celery -A app.celery_app SUB …`. Raises `Problem`."""
    if len(args) < 3 or args[0] not in ("-A", "--app"):
        raise Problem(f"celery {shlex.join(args)}: must start with -A <app> <command>")
    module_name, _, attribute = args[1].partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attribute or "app")
    except (ImportError, AttributeError) as exc:
        raise Problem(f"celery -A {args[1]}: cannot load the app ({exc})") from None
    if not isinstance(target, Celery):
        raise Problem(f"celery -A {args[1]}: not a Celery app")
    sub, rest = args[2], args[3:]
    command = celery_cli.commands.get(sub)
    if command is None:
        raise Problem(f"celery {sub}: no such command")
    try:
        ctx = command.make_context(sub, list(rest), resilient_parsing=False)
    except click.ClickException as exc:
        raise Problem(f"celery {sub} {shlex.join(rest)}: {exc.format_message()}") from None
    except click.exceptions.Exit:
        raise Problem(f"celery {sub}: would print its help and exit") from None
    if sub in ("inspect", "control"):
        method = ctx.params["command"]
        meta = Panel.meta.get(method)
        if meta is None or meta.type != sub:
            raise Problem(f"celery {sub} {method}: not a remote {sub} command")
        if ctx.args and not meta.variadic and len(ctx.args) > len(meta.args or ()):
            raise Problem(f"celery {sub} {method}: unexpected arguments {ctx.args}")
    return sub, ctx.params


def command_problems(argv: list[str], *, lines: set[str]) -> list[str]:
    """What is wrong with running `argv` (a `pipeline` or `celery` command line)."""
    try:
        if argv[:1] == ["pipeline"]:
            path, params = parse_pipeline(argv[1:])
            if path == ["worker"] and params["line"] not in lines:
                return [f"pipeline worker {params['line']}: no such line (lines: {sorted(lines)})"]
        elif argv[:1] == ["celery"]:
            parse_celery(argv[1:])
        else:
            return [f"{shlex.join(argv)}: neither a pipeline nor a celery command"]
    except Problem as exc:
        return [str(exc)]
    return []


def is_application(service: Mapping[str, Any]) -> bool:
    """A service that runs this project's image (as opposed to Redis or PostgreSQL)."""
    return "build" in service


def named_volumes(service: Mapping[str, Any]) -> set[str]:
    """The named volumes a service mounts (bind mounts are paths and are left out)."""
    names = set()
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            source = volume.get("source", "") if volume.get("type", "volume") == "volume" else ""
        else:
            source = volume.split(":")[0] if ":" in volume else ""
        if source and not source.startswith((".", "/", "~")):
            names.add(source)
    return names


def healthcheck_problems(service: Mapping[str, Any], *, lines: set[str]) -> list[str]:
    """What is wrong with a service's healthcheck (its absence included)."""
    test = (service.get("healthcheck") or {}).get("test")
    if test is None:
        return ["no healthcheck"]
    form, argv = healthcheck_argv(test)
    problems = []
    if form not in ("CMD", "CMD-SHELL"):
        problems.append(f"healthcheck test starts with {form!r}")
    if form == "CMD" and any("$" in arg for arg in argv):
        problems.append("healthcheck: CMD passes $VARIABLES unexpanded")
    if argv[:1] in (["pipeline"], ["celery"]):
        problems += [f"healthcheck: {problem}" for problem in command_problems(argv, lines=lines)]
    if argv[:2] == ["python", "-c"] and len(argv) > 2:
        problems += [f"healthcheck: python -c: {problem}" for problem in python_problems(argv[2])]
    return problems


def python_problems(code: str) -> list[str]:
    """What stops `python -c code` before it runs: a syntax error, or an import of ours
    (`from app… import name`) whose module or name is not there."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [f"{exc.msg} (line {exc.lineno})"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            try:
                module = importlib.import_module(node.module)
            except ImportError:
                problems.append(f"no module {node.module}")
                continue
            problems += [
                f"{node.module} has no {alias.name}"
                for alias in node.names
                if not hasattr(module, alias.name)
            ]
    return problems


def service_problems(name: str, service: Mapping[str, Any], doc: Mapping[str, Any]) -> list[str]:
    """What is wrong with one service of the (interpolated) compose file `doc`."""
    env = environment_of(service)
    problems = setting_problems(env)
    for volume in named_volumes(service) - set(doc.get("volumes") or {}):
        problems.append(f"volume {volume!r} is not declared under volumes:")
    for dependency, spec in (service.get("depends_on") or {}).items():
        if dependency not in doc["services"]:
            problems.append(f"depends on {dependency!r}, which is not a service")
        elif spec.get("condition", "service_started") not in DEPENDS_ON_CONDITIONS:
            problems.append(f"depends_on {dependency}: bad condition {spec}")
    if is_application(service):
        if "command" not in service:
            problems.append("no command (the image's default only prints help)")
        else:
            argv = argv_of(service["command"])
            problems += [f"command: {p}" for p in command_problems(argv, lines=line_names(env))]
    if name not in ONE_SHOT_SERVICES:
        problems += healthcheck_problems(service, lines=line_names(env))
    return problems or worker_ping_problems(service)


def worker_ping_problems(service: Mapping[str, Any]) -> list[str]:
    """A worker's healthcheck must ping its own node, `LINE@%h` (see `pipeline worker`), in a
    shell that expands $HOSTNAME to the container's hostname."""
    argv = argv_of(service.get("command") or [])
    if argv[:2] != ["pipeline", "worker"]:
        return []
    line = parse_pipeline(argv[1:])[1]["line"]
    form, check = healthcheck_argv(service["healthcheck"]["test"])
    if check[:1] != ["celery"] or parse_celery(check[1:])[0] != "inspect":
        return ["healthcheck: a worker is checked with celery inspect ping"]
    destination = parse_celery(check[1:])[1]["destination"]
    if form != "CMD-SHELL" or destination != [f"{line}@$HOSTNAME"]:
        return [f"healthcheck: pings {destination}, not this worker ({line}@$HOSTNAME in a shell)"]
    return []


def compose_problems(raw: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """Everything the checkers find wrong in a loaded compose file, given the operator's
    variables `environ`; empty when it is right."""
    try:
        doc = interpolate_tree(raw, environ)
    except Problem as exc:
        return [str(exc)]
    return [
        f"{name}: {problem}"
        for name, service in (doc.get("services") or {}).items()
        for problem in service_problems(name, service, doc)
    ]


def load_compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as file:
        return yaml.safe_load(file)


def services() -> dict[str, Any]:
    return interpolate_tree(load_compose(), OPERATOR_ENV)["services"]


def pipeline_path(service: Mapping[str, Any]) -> list[str]:
    """`["pipeline", "worker"]` for `pipeline worker order`; empty for any other command."""
    argv = argv_of(service.get("command") or [])
    return ["pipeline", *parse_pipeline(argv[1:])[0]] if argv[:1] == ["pipeline"] else []


def settings_for(service: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a process of `service` loads. Raises `ConfigError`, as it would."""
    with monkeypatch.context() as env:
        for key, value in environment_of(service).items():
            env.setenv(key, value)
        settings = load_settings()
        LineRegistry.from_settings(settings)
        return settings


def seconds(duration: str) -> float:
    """A compose duration (`45s`, `1m30s`, `2m`) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(number) * units[unit] for number, unit in parts)
