"""One place where a database that cannot answer becomes ``StoreUnavailable``.

Callers outside the store (the collector's writer, the detection loop, the API) handle one
exception for "try again later", whichever driver or SQLAlchemy layer noticed: a refused or
dropped connection, a pool that cannot hand out one, a statement cancelled by its timeout,
SQLite's "database is locked".  ``guarded`` wraps every public method of a store class, so a
new method cannot forget it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy import exc as sa_exc

from hbmwatch.validation import HbmwatchError

T = TypeVar("T")


class StoreUnavailable(HbmwatchError):
    """The database cannot be reached (down, restarting, locked): try again later."""


def _driver_errors() -> tuple[type[BaseException], ...]:
    """Connection-level errors of the drivers, raised where the store uses them directly."""
    errors: list[type[BaseException]] = [sqlite3.OperationalError, sqlite3.InterfaceError]
    with contextlib.suppress(ImportError):
        import psycopg

        errors += [psycopg.OperationalError, psycopg.InterfaceError]
    return tuple(errors)


_DRIVER_ERRORS = _driver_errors()
_SQLALCHEMY_ERRORS = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,  # no pooled connection came free in time
)


def unavailable_reason(exc: BaseException) -> str | None:
    """Why ``exc`` means the database cannot answer now, or None if it means something else."""
    if isinstance(exc, _SQLALCHEMY_ERRORS):
        return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return str(exc.orig).strip().splitlines()[0]
    if isinstance(exc, _DRIVER_ERRORS):
        return str(exc).strip().splitlines()[0]
    return None


@contextlib.contextmanager
def unavailable() -> Iterator[None]:
    """Database connection failures become StoreUnavailable (the caller may spool)."""
    try:
        yield
    except StoreUnavailable:
        raise
    except Exception as exc:
        reason = unavailable_reason(exc)
        if reason is None:
            raise
        raise StoreUnavailable(f"the store is unavailable: {reason}") from exc


def guard(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` with database failures raised as StoreUnavailable."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with unavailable():
            return fn(*args, **kwargs)

    return wrapper


def guarded(cls: type[T]) -> type[T]:
    """Guard every public method of ``cls`` (static ones and properties included)."""
    for name, attr in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if inspect.isgeneratorfunction(attr):
            raise TypeError(f"{cls.__name__}.{name}: a generator cannot be guarded")
        if inspect.isfunction(attr):
            setattr(cls, name, guard(attr))
        elif isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(guard(attr.__func__)))
        elif isinstance(attr, property) and attr.fget is not None:
            setattr(cls, name, property(guard(attr.fget), attr.fset, attr.fdel, attr.__doc__))
    return cls
