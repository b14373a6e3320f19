"""Dependencies the handlers declare: the store, the settings, alerting, and the caller's scope.

Tokens come from the settings (``api.read_token``, ``write_token``, ``admin_token``); each
scope includes the ones below it (admin > write > read).  Reads pass without a token when
``api.open_reads`` is on; writes and admin calls never do.
"""

from __future__ import annotations

import secrets
import threading
from enum import IntEnum
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hbmwatch.alerts.runner import Alerting
from hbmwatch.api.errors import ApiError
from hbmwatch.settings import Settings
from hbmwatch.status import ServiceStatus
from hbmwatch.store.store import Store


class Scope(IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3


# The cheap dependencies are ``async``: FastAPI runs a sync one on a worker thread, one hop
# (and a GIL hand-off) per dependency per request, which under load starves the event loop.
async def get_store(request: Request) -> Store:
    return request.app.state.store


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_status(request: Request) -> ServiceStatus:
    return request.app.state.status


_alerting_lock = threading.Lock()


def get_alerting(request: Request) -> Alerting:
    """The running service's alerting, or one over the store when the API runs alone."""
    state = request.app.state
    with _alerting_lock:
        if getattr(state, "alerting", None) is None:
            alerting = Alerting(state.store, state.settings.alerts)
            alerting.start()
            state.alerting = alerting
    return state.alerting


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StatusDep = Annotated[ServiceStatus, Depends(get_status)]
AlertingDep = Annotated[Alerting, Depends(get_alerting)]

_bearer = HTTPBearer(auto_error=False, description="A read, write or admin token.")


def granted_scope(settings: Settings, token: str | None) -> Scope | None:
    """The highest scope the token grants, None for no or an unknown token."""
    if not token:
        return None
    api = settings.api
    for scope, secret in (
        (Scope.ADMIN, api.admin_token),
        (Scope.WRITE, api.write_token),
        (Scope.READ, api.read_token),
    ):
        if secret is not None and secrets.compare_digest(
            token.encode(), secret.get_secret_value().encode()
        ):
            return scope
    return None


def require(needed: Scope):
    async def check(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Scope | None:
        settings: Settings = request.app.state.settings
        token = credentials.credentials if credentials else None
        scope = granted_scope(settings, token)
        if token and scope is None:
            raise ApiError(401, "unauthorized", "the bearer token is not valid")
        if scope is None and needed is Scope.READ and settings.api.open_reads:
            return None
        if scope is None:
            raise ApiError(
                401,
                "unauthorized",
                f"this call needs a {needed.name.lower()} token (Authorization: Bearer ...)",
            )
        if scope < needed:
            raise ApiError(
                403,
                "forbidden",
                f"a {scope.name.lower()} token cannot do this; it needs {needed.name.lower()}",
                scope=scope.name.lower(),
            )
        return scope

    return check


def actor(scope: Scope | None) -> str:
    """Who did it, for timelines: the scope of the token (tokens carry no names)."""
    return f"api:{scope.name.lower()}" if scope else "api:anonymous"


Read = Depends(require(Scope.READ))
Write = Depends(require(Scope.WRITE))
Admin = Depends(require(Scope.ADMIN))
ScopeRead = Annotated[Scope | None, Read]
ScopeWrite = Annotated[Scope | None, Write]
ScopeAdmin = Annotated[Scope | None, Admin]
