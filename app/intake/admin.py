"""Who is an admin: the bearer token a request carries, checked against the settings' admin
tokens, and which of the app's routes take one.

The check runs before anything reads a request's body (`app.intake.gate`), so a client
without a token never gets to send one; the routes' dependency (`require_admin`) then only
names the actor the gate found."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from app.config.settings import Settings
from app.errors import AdminForbidden, AdminNotConfigured, AdminRequired
from app.intake.openapi_doc import ADMIN_BEARER

# The actor of admin actions in dev mode with no admin token.
DEV_ACTOR = "dev"
# Where the gate leaves the actor for the route (the request's `state`).
ACTOR_STATE = "admin_actor"


def admin_actor(settings: Settings, authorization: str) -> str:
    """The actor named by `authorization` (the `Authorization` header, "" when absent):
    `admin` for `PIPELINE_ADMIN_TOKEN`, a name of `PIPELINE_ADMIN_TOKENS`; `dev` in dev
    mode without tokens. Raises `AdminNotConfigured` (401) when no token is configured,
    whatever was sent: no token could be right, so the answer says how to open them rather
    than asking for one; `AdminRequired` (401) without a bearer token, `AdminForbidden`
    (403) for a wrong one."""
    actors = settings.admin_actors
    if not actors:
        if settings.in_dev_mode:
            return DEV_ACTOR
        raise AdminNotConfigured
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise AdminRequired
    # Every token is compared (in constant time each), so the time taken tells nothing.
    named = [
        name
        for name, token in actors.items()
        if hmac.compare_digest(given.encode(), token.get_secret_value().encode())
    ]
    if not named:
        raise AdminForbidden("the admin token is not valid")
    return named[0]


async def require_admin(
    request: Request,
    # Only declares the scheme in the OpenAPI document: the header is checked by the gate.
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(ADMIN_BEARER)],
) -> str:
    """The dependency of every admin route: the actor the request's token names, as the
    gate (`app.intake.gate`) found it before the body was read; raises as `admin_actor`.
    (async: a plain `def` dependency would cost every request a trip to the thread pool.)"""
    found: str | None = getattr(request.state, ACTOR_STATE, None)
    if found is not None:
        return found
    settings: Settings = request.app.state.runtime.settings
    return admin_actor(settings, request.headers.get("authorization", ""))


AdminActor = Annotated[str, Depends(require_admin)]


def _depends_on(dependant: Dependant, call: Callable[..., Any]) -> bool:
    return any(d.call is call or _depends_on(d, call) for d in dependant.dependencies)


class AdminRoutes:
    """The routes among `routes` that depend on `check` (the admin dependency)."""

    def __init__(self, routes: Iterable[BaseRoute], *, check: Callable[..., Any]) -> None:
        self.routes = [
            r for r in routes if isinstance(r, APIRoute) and _depends_on(r.dependant, check)
        ]

    def matches(self, scope: Scope) -> bool:
        """Whether the request of `scope` matches an admin route fully (a request that
        another route could take as well is asked for the token all the same: an admin
        route never goes without one)."""
        return any(route.matches(scope)[0] is Match.FULL for route in self.routes)
