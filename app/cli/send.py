"""`pipeline send LINE JSON`: post one record to the intake, signed as a third party would
sign it: through `app.client`, or as Standard Webhooks do for a key of that kind."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from typing import Annotated

import typer
from pydantic import SecretStr

from app import client, standard_webhooks
from app.cli.output import settings_for_command
from app.client import DEFAULT_TIMEOUT_S, Answer, new_nonce
from app.config.credentials import IntakeKey, IntakeKeyKind
from app.config.settings import Settings

# Addresses an intake listens on that a client cannot send to: send to this machine.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104 - read, not bound


def intake_url(settings: Settings) -> str:
    """The local intake's URL, from `PIPELINE_INTAKE_HOST` and `PIPELINE_INTAKE_PORT`."""
    host = _WILDCARDS.get(settings.intake_host, settings.intake_host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.intake_port}"


def choose_key(
    settings: Settings, *, key_id: str | None, secret: str | None
) -> tuple[str | None, IntakeKey | None]:
    """The key to sign with: the options (a `--secret` is of the pipeline's own scheme),
    else the one key of `PIPELINE_INTAKE_KEYS`, of its kind; (None, None) when there is
    none (an intake in dev mode takes unsigned requests). Raises `typer.BadParameter` when
    the choice is not clear."""
    keys = settings.intake_keys
    if key_id is None:
        if secret is not None:
            raise typer.BadParameter("--secret needs --key-id", param_hint="--secret")
        if len(keys) > 1:
            raise typer.BadParameter(
                f"PIPELINE_INTAKE_KEYS has {len(keys)} keys ({', '.join(keys)}): choose one",
                param_hint="--key-id",
            )
        return next(iter(keys.items()), (None, None))
    if secret is None:
        if key_id not in keys:
            raise typer.BadParameter(
                f"{key_id!r} is not a key of PIPELINE_INTAKE_KEYS: give its --secret",
                param_hint="--key-id",
            )
        return key_id, keys[key_id]
    return key_id, IntakeKey(secret=SecretStr(secret))


def signed_request(
    url: str, line: str, body: bytes, *, key_id: str | None, key: IntakeKey | None, nonce: str
) -> urllib.request.Request:
    """The request that posts `body`, signed with `key` as its kind says (unsigned without
    one); a Standard Webhooks request's `webhook-id` is `nonce`. Raises `ValueError` for
    a URL that is not http or https."""
    if key is None or key.kind is IntakeKeyKind.PIPELINE:
        secret = None if key is None else key.secret.get_secret_value()
        return client.signed_request(url, line, body, key_id=key_id, secret=secret, nonce=nonce)
    request = client.signed_request(url, line, body, key_id=None, secret=None, nonce=nonce)
    request.remove_header("X-nonce")  # webhook-id is the nonce of this scheme
    signed = standard_webhooks.signed_headers(
        key.hmac_key(), msg_id=nonce, timestamp_s=int(time.time()), body=body
    )
    for name, value in signed.items():
        request.add_header(name, value)
    return request


def read_record(given: str) -> bytes:
    """The body to send: `given`, or stdin for `-`; checked to be a JSON object.
    Raises `typer.BadParameter`."""
    text = sys.stdin.read() if given == "-" else given
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="JSON") from None
    if not isinstance(value, dict):
        raise typer.BadParameter(
            'must be a JSON object, e.g. \'{"business_no": "ORD-1001"}\'', param_hint="JSON"
        )
    return text.encode()


def send(
    line: Annotated[str, typer.Argument(metavar="LINE", help="The line, e.g. order.")],
    record: Annotated[
        str,
        typer.Argument(
            metavar="JSON",
            help='The record, a JSON object with a business_no: \'{"business_no": "ORD-1"}\'; '
            "- reads it from stdin.",
        ),
    ],
    url: Annotated[
        str | None,
        typer.Option(help="The intake; default: PIPELINE_INTAKE_HOST and PIPELINE_INTAKE_PORT."),
    ] = None,
    key_id: Annotated[
        str | None,
        typer.Option(help="Sign with this key; default: the one key of PIPELINE_INTAKE_KEYS."),
    ] = None,
    secret: Annotated[
        str | None,
        typer.Option(
            help="The key's secret, when PIPELINE_INTAKE_KEYS does not hold it, signing with "
            "X-Signature (other users can read a command line: prefer the setting)."
        ),
    ] = None,
    nonce: Annotated[
        str | None,
        typer.Option(
            help="The request's nonce (default: a new one); the same nonce and body sent "
            "again get back the record already stored."
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer.")] = (
        DEFAULT_TIMEOUT_S
    ),
) -> None:
    """Post one record to the intake, signed, and print its answer (exit 1 unless 2xx)."""
    settings = settings_for_command()
    body = read_record(record)
    key_id, key = choose_key(settings, key_id=key_id, secret=secret)
    target = url or intake_url(settings)
    nonce = nonce or new_nonce()
    try:
        request = signed_request(target, line, body, key_id=key_id, key=key, nonce=nonce)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--url") from None
    try:
        answer = client.send(request, timeout_s=timeout)
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        print(
            f"pipeline: no answer from the intake at {target} ({reason}); "
            f"to send the record again safely: --nonce {nonce}",
            file=sys.stderr,
        )
        raise typer.Exit(1) from None
    _report(answer, signed=key_id is not None)


def _report(answer: Answer, *, signed: bool) -> None:
    shown = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
    print(shown)
    if answer.ok:
        return
    hint = ""
    if answer.status == 401 and not signed:
        hint = " (sent unsigned: set PIPELINE_INTAKE_KEYS, or give --key-id and --secret)"
    print(f"pipeline: the intake answered {answer.status} {answer.error}{hint}", file=sys.stderr)
    raise typer.Exit(1)
