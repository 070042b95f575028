"""The checks of the secrets the settings hold: intake keys, admin tokens and Flower's
credential. Each raises `ValueError` with a message that names a key id or a token's name,
never a secret (the message is printed)."""

from __future__ import annotations

import re

from pydantic import SecretStr

from app.dedup_keys import MIN_SECRET_BYTES, key_id_problem

# An admin token's name is its actor in the audit log: letters, digits and `._@-`, so it
# cannot pass for `cli:<user>` (a command-line user) or carry spaces or markup; `dev` is
# the dev mode's actor and `admin` the single token's.
ACTOR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
RESERVED_ACTORS = ("dev",)
SINGLE_TOKEN_ACTOR = "admin"  # noqa: S105 - an actor name, not a secret


def check_intake_keys(keys: dict[str, SecretStr]) -> None:
    """Key ids unambiguous and not reserved; secrets of at least `MIN_SECRET_BYTES`."""
    for key_id, secret in keys.items():
        problem = key_id_problem(key_id)
        if problem is not None:
            raise ValueError(f"key id {key_id!r} {problem}")
        if len(secret.get_secret_value().encode()) < MIN_SECRET_BYTES:
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
