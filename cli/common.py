"""What every ``hbmwatch`` command shares: the error line, the settings, the store check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from hbmwatch import log
from hbmwatch.runtime import preflight
from hbmwatch.settings import Settings, load_settings
from hbmwatch.validation import HbmwatchError

console = Console(stderr=True)
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML settings file (default: ./hbmwatch.toml if any)."),
]


def fail(message: object, code: int = 2) -> typer.Exit:
    """One ``error:`` line on stderr (never wrapped, brackets kept): ``raise fail(...)``."""
    console.print(f"[red]error:[/red] {escape(str(message))}", soft_wrap=True)
    return typer.Exit(code)


def settings_from(config: Path | None) -> Settings:
    try:
        settings = load_settings(config)
    except HbmwatchError as exc:  # one line naming the file or variable and the key
        raise fail(exc) from None
    log.configure(settings.log_level, settings.log_format)
    log.register_secrets(settings)  # tokens, the store URL's password: scrubbed from every line
    return settings


def bound(settings: Settings, host: str | None, port: int | None) -> Settings:
    """``--host`` and ``--port`` over the settings' API address."""
    if host is not None:
        settings.api.host = host
    if port is not None:
        settings.api.port = port
    return settings


def check_store(settings: Settings) -> None:
    try:
        preflight.check_store(settings.store)
    except HbmwatchError as exc:
        raise fail(exc) from None


def first_error(exc: ValueError) -> str:
    """A pydantic error in one line: the field and what is wrong with it."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        msg = str(first["msg"]).removeprefix("Value error, ")
        return f"{'.'.join(str(p) for p in first['loc'])}: {msg}"
    return str(exc)
