"""One error model for every 4xx and 5xx, and the handlers that produce it.

Domain errors (``HbmwatchError``) carry the offending data, so a bad selector, range or
payload comes back as a 400 naming what was wrong rather than a 500.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from hbmwatch import log
from hbmwatch.store.guard import unavailable_reason
from hbmwatch.store.store import SchemaOutdated, StoreUnavailable
from hbmwatch.validation import HbmwatchError

logger = log.get("hbmwatch.api")
#: What a 503 asks a client to wait before trying again.
RETRY_AFTER_SECONDS = "5"


class ErrorBody(BaseModel):
    code: str = Field(examples=["invalid_query"], description="Stable, machine-readable.")
    message: str = Field(examples=["step must be positive, got -1"])
    detail: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    error: ErrorBody


class ApiError(Exception):
    """Raised by handlers for a 4xx that is not a domain error (not found, forbidden)."""

    def __init__(self, status: int, code: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.detail = status, code, message, detail


def not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, "not_found", f"no {what} with id {ident!r}", id=ident)


#: The error responses every route may give, for the OpenAPI schema.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "The request cannot be answered as asked; the message says why.",
        401: "A token is needed.",
        403: "The token lacks the scope.",
        404: "No such resource.",
        413: "The body is over the size limit.",
        422: "A parameter or field failed validation.",
        503: "The store is unreachable, or the API is busy; Retry-After says when to retry.",
    }.items()
}


def _json(
    status: int,
    code: str,
    message: str,
    detail: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(code=code, message=message, detail=_jsonable(detail)))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _jsonable(detail: dict[str, Any] | None) -> dict[str, Any]:
    return {
        k: v if isinstance(v, int | float | str | bool | None) else str(v)
        for k, v in (detail or {}).items()
    }


def _code(exc: HbmwatchError) -> str:
    name = type(exc).__name__
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _json(exc.status, exc.code, exc.message, exc.detail, headers)

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(SchemaOutdated)
    async def _unavailable(_: Request, exc: HbmwatchError) -> JSONResponse:
        return _json(503, "store_unavailable", str(exc), exc.detail,
                     {"Retry-After": RETRY_AFTER_SECONDS})  # fmt: skip

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    @app.exception_handler(DisconnectionError)
    @app.exception_handler(SQLAlchemyTimeoutError)
    async def _database_down(_: Request, exc: Exception) -> JSONResponse:
        """A safety net: the store maps these itself (store/guard.py); an outage is never
        a 500, whichever path reached the database."""
        reason = unavailable_reason(exc) or type(exc).__name__
        return _json(503, "store_unavailable", f"the store is unavailable: {reason}",
                     headers={"Retry-After": RETRY_AFTER_SECONDS})  # fmt: skip

    @app.exception_handler(HbmwatchError)
    async def _domain(_: Request, exc: HbmwatchError) -> JSONResponse:
        return _json(400, _code(exc), str(exc), exc.detail)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = f"{where}: {first.get('msg', 'invalid')}" if where else "invalid request"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return _json(422, "validation_error", message + more, {"errors": len(errors)})

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _json(exc.status_code, code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", path=request.url.path)
        return _json(500, "internal_error", "internal error; the server log has the details")
