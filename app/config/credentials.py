"""The secrets the settings hold and their checks: intake keys, admin tokens and Flower's
credential. Each check raises `ValueError` with a message that names a key id or a token's
name, never a secret (the message is printed)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr

from app import standard_webhooks
from app.ids import MIN_SECRET_BYTES, key_id_problem

# An admin token's name is its actor in the audit log: letters, digits and `._@-`, so it
# cannot pass for `cli:<user>` (a command-line user) or carry spaces or markup; `dev` is
# the dev mode's actor and `admin` the single token's.
ACTOR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
RESERVED_ACTORS = ("dev",)
SINGLE_TOKEN_ACTOR = "admin"  # noqa: S105 - an actor name, not a secret


class IntakeKeyKind(StrEnum):
    """How a source signs its requests."""

    # X-Key-Id, X-Timestamp, X-Nonce and X-Signature (`app.client`): the plain form.
    PIPELINE = "pipeline"
    # webhook-id, webhook-timestamp and webhook-signature, with a `whsec_` secret.
    STANDARD_WEBHOOKS = "standard-webhooks"


class IntakeKey(BaseModel):
    """One source's key: how it signs, and its secret. `PIPELINE_INTAKE_KEYS` gives it as a
    plain secret (`{"shop-1": "secret"}`, the pipeline's own scheme) or as an object
    (`{"shop-2": {"kind": "standard-webhooks", "secret": "whsec_..."}}`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: IntakeKeyKind = IntakeKeyKind.PIPELINE
    secret: SecretStr

    def hmac_key(self) -> bytes:
        """The HMAC key: the secret's bytes, or a Standard Webhooks secret's decoded key.
        Raises `ValueError` for a bad `whsec_` secret (the settings refuse one at start)."""
        secret = self.secret.get_secret_value()
        if self.kind is IntakeKeyKind.STANDARD_WEBHOOKS:
            return standard_webhooks.decode_secret(secret)
        return secret.encode()


_KEY_FIELDS = frozenset(IntakeKey.model_fields)


def parse_intake_keys(value: Any) -> Any:
    """`PIPELINE_INTAKE_KEYS` as read (key id -> a secret or `{"kind", "secret"}`), as
    `IntakeKey`s, checked: key ids unambiguous and not reserved; a kind the intake knows;
    our scheme's secrets of at least `MIN_SECRET_BYTES`, a Standard Webhooks secret a
    `whsec_` key of at least `standard_webhooks.MIN_KEY_BYTES`, and no two Standard Webhooks
    sources with one key (their requests name no key id: the key that matches names the
    source). A value that is not a mapping is returned as it is (the settings' type check
    refuses it)."""
    if not isinstance(value, dict):
        return value
    keys: dict[str, IntakeKey] = {}
    by_hmac_key: dict[bytes, str] = {}
    for key_id, given in value.items():
        problem = key_id_problem(key_id) if isinstance(key_id, str) else "is not a string"
        if problem is not None:
            raise ValueError(f"key id {key_id!r} {problem}")
        key = keys[key_id] = _intake_key(key_id, given)
        check_intake_key(key_id, key)
        if key.kind is IntakeKeyKind.STANDARD_WEBHOOKS:
            other = by_hmac_key.setdefault(key.hmac_key(), key_id)
            if other != key_id:
                raise ValueError(
                    f"key ids {other!r} and {key_id!r} have the same Standard Webhooks secret: "
                    "which of them sent a request could not be told"
                )
    return keys


def _intake_key(key_id: str, given: Any) -> IntakeKey:
    if isinstance(given, IntakeKey):
        return given
    if isinstance(given, str | SecretStr):
        return IntakeKey(secret=SecretStr(given) if isinstance(given, str) else given)
    # TRY004: pydantic turns a ValueError into the settings' error line, not a TypeError.
    if not isinstance(given, dict):
        raise ValueError(  # noqa: TRY004
            f"key id {key_id!r} must have a secret (a string) or an object "
            '{"kind": ..., "secret": ...}'
        )
    unknown = sorted(str(name) for name in set(given) - _KEY_FIELDS)
    if unknown:
        fields = " and ".join(sorted(_KEY_FIELDS))
        raise ValueError(
            f"key id {key_id!r} has an unknown field {', '.join(map(repr, unknown))}; "
            f"a key has only {fields}"
        )
    kind = given.get("kind", IntakeKeyKind.PIPELINE)
    if kind not in tuple(IntakeKeyKind):
        raise ValueError(
            f"key id {key_id!r} has kind {kind!r}; the kinds are "
            f"{', '.join(k.value for k in IntakeKeyKind)}"
        )
    secret = given.get("secret")
    if not isinstance(secret, str | SecretStr):
        raise ValueError(f"key id {key_id!r} needs a secret (a string)")  # noqa: TRY004
    wrapped = SecretStr(secret) if isinstance(secret, str) else secret
    return IntakeKey(kind=IntakeKeyKind(kind), secret=wrapped)


def check_intake_key(key_id: str, key: IntakeKey) -> None:
    """`key`'s secret fits its kind (see `parse_intake_keys`)."""
    if key.kind is IntakeKeyKind.STANDARD_WEBHOOKS:
        try:
            key.hmac_key()
        except ValueError as exc:
            raise ValueError(f"the secret of key id {key_id!r} {exc}") from None
    elif len(key.secret.get_secret_value().encode()) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the secret of key id {key_id!r} is shorter than {MIN_SECRET_BYTES} bytes"
        )


def check_single_token(token: SecretStr | None) -> None:
    """The single admin token, when set, is at least `MIN_SECRET_BYTES` long."""
    if token is not None and len(token.get_secret_value().encode()) < MIN_SECRET_BYTES:
        raise ValueError(f"the token is shorter than {MIN_SECRET_BYTES} bytes")


def check_named_tokens(tokens: dict[str, SecretStr], *, single: SecretStr | None) -> None:
    """Each name a possible actor, none `admin` beside the single token (`single`), each
    token long enough, and no token naming two actors."""
    by_token: dict[str, str] = {}
    if single is not None:
        by_token[single.get_secret_value()] = SINGLE_TOKEN_ACTOR
    for name, token in tokens.items():
        if not ACTOR_NAME.match(name) or name in RESERVED_ACTORS:
            raise ValueError(
                f"admin token name {name!r} must be 1 to 64 letters, digits or '._@-', "
                f"starting with a letter or digit, and not {', '.join(RESERVED_ACTORS)}"
            )
        if name == SINGLE_TOKEN_ACTOR and single is not None:
            raise ValueError(
                f"{name!r} is the actor of PIPELINE_ADMIN_TOKEN: name this token otherwise"
            )
        secret = token.get_secret_value()
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"the token of {name!r} is shorter than {MIN_SECRET_BYTES} bytes")
        if secret in by_token:
            raise ValueError(
                f"{by_token[secret]!r} and {name!r} have the same token: "
                "which of them acted could not be told"
            )
        by_token[secret] = name


def check_flower_credential(credential: SecretStr | None) -> None:
    """`user:password` without spaces, and without ',': Flower splits its credential on
    commas into several, each let in alone (`admin:abc,def` lets in `admin:abc` and `def`)."""
    if credential is None:
        return
    user, sep, password = credential.get_secret_value().partition(":")
    if not (user and sep and password) or any(c.isspace() for c in user + password):
        raise ValueError("must be user:password (no spaces)")
    if "," in user + password:
        raise ValueError("must not contain ',' (Flower would split it in several)")
