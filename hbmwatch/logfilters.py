"""What every log line passes before it is written: secrets scrubbed, repeats rate-limited.

Issue 12 point 3: a 15 s database outage wrote the store password to the log 14 times (the
connect parameters among a traceback's rendered locals) in 24,975 lines.  Tracebacks are now
rendered without locals (hbmwatch.log); this module makes sure that whatever still reaches
a line (an exception message, a DSN, a URL, a keyword) has its secrets replaced by ``***``,
and that one error repeated on every scrape or flush becomes one line per window with a
count of the lines it stands for.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import structlog
from pydantic import BaseModel

MASK = "***"
#: Registered secrets shorter than this are not replaced verbatim (``"a"`` would mask every
#: ``a``); the URL and key/value patterns below still catch them where they are written.
MIN_SECRET_LENGTH = 4
#: ``scheme://user:password@``: the password.  Both patterns start at a literal (``://``,
#: the keyword) and every run is bounded: a pattern that began with ``\b[\w.]*`` took
#: minutes over a 40 KB line of ``a.a.a.`` (each word start rescanned the rest).
_URL_PASSWORD = re.compile(
    r"(?P<head>://[^\s:/@'\"]{0,256}:)(?P<secret>[^\s/@'\"]{1,256})(?P<tail>@)"
)
_SENSITIVE = r"(?:password|passwd|pwd|secret|token|api[_-]?key|authorization)"
#: ``password=x``, ``'password': 'x'``, ``"write_token": "x"``, ``Authorization: Bearer x``.
_KEY_VALUE = re.compile(
    rf"(?i)(?P<head>{_SENSITIVE}['\"]?\s{{0,8}}[=:]\s{{0,8}}['\"]?(?:bearer\s+)?)"
    r"(?P<secret>[^\s'\",;&)}\]]{1,512})"
)
_SENSITIVE_KEY = re.compile(rf"(?i)^[\w.\-]*{_SENSITIVE}$")

_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Scrub this value from every log line from now on (a token, a database password)."""
    if not value or len(value) < MIN_SECRET_LENGTH:
        return
    forms = {value, quote(value, safe=""), unquote(value), json.dumps(value)[1:-1]}
    with _secrets_lock:
        _secrets.update(f for f in forms if len(f) >= MIN_SECRET_LENGTH)


def register_secrets(settings: Any) -> None:
    """Every secret in a settings tree: SecretStr values and the passwords in URLs."""
    for value in _leaves(settings):
        if hasattr(value, "get_secret_value"):
            register_secret(value.get_secret_value())
        elif isinstance(value, str) and "://" in value and "@" in value:
            try:
                register_secret(unquote(urlsplit(value).password or ""))
            except ValueError:  # not a URL after all
                continue


def _leaves(node: Any) -> Iterable[Any]:
    if isinstance(node, BaseModel):  # its fields, SecretStr values still wrapped
        for name in type(node).model_fields:
            yield from _leaves(getattr(node, name, None))
    elif isinstance(node, dict):
        for value in node.values():
            yield from _leaves(value)
    elif isinstance(node, list | tuple | set):
        for value in node:
            yield from _leaves(value)
    else:
        yield node


def scrub_text(text: str) -> str:
    """``text`` with registered secrets, URL passwords and ``password=...`` values masked.

    >>> scrub_text("postgresql+psycopg://app:hunter22@db:5432/x failed, password=hunter22")
    'postgresql+psycopg://app:***@db:5432/x failed, password=***'
    """
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    text = _URL_PASSWORD.sub(rf"\g<head>{MASK}\g<tail>", text)
    return _KEY_VALUE.sub(lambda m: m["head"] + MASK if m["secret"] != MASK else m[0], text)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {k: MASK if _secret_key(k) else _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v) for v in value)
    return value


def _secret_key(key: object) -> bool:
    return isinstance(key, str) and bool(_SENSITIVE_KEY.match(key))


def scrub_event(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: mask secrets in every value (after the traceback is rendered)."""
    return {
        k: v if k.startswith("_") else MASK if _secret_key(k) else _scrub(v)
        for k, v in event_dict.items()
    }


def scrub_rendered(_logger: Any, _method: str, line: str | bytes) -> str | bytes:
    """structlog processor after the renderer: a last pass over the finished line."""
    return scrub_text(line) if isinstance(line, str) else line


class RateLimiter:
    """The same (logger, event, level, target) at most once per window; the next line that
    passes says how many it stood for (``repeated=<n>``).

    Only warnings and worse are limited: they are what repeats on every scrape or flush
    while something is down.  The ``target`` field is part of the key, so that one target
    going down does not hide another's.  Keys are kept for the latest ``max_keys`` events.
    """

    def __init__(
        self,
        seconds: float = 10.0,
        *,
        min_level: int = logging.WARNING,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self.min_level = min_level
        self.max_keys = max_keys
        self.clock = clock
        self._windows: OrderedDict[Hashable, list[float]] = OrderedDict()  # key -> [start, n]
        self._lock = threading.Lock()

    def allow(self, key: Hashable) -> int | None:
        """None: suppress this line; else how many lines it stands for besides itself."""
        now = self.clock()
        with self._lock:
            window = self._windows.get(key)
            if window is not None and now - window[0] < self.seconds:
                window[1] += 1
                return None
            self._windows[key] = [now, 0]
            self._windows.move_to_end(key)
            while len(self._windows) > self.max_keys:
                self._windows.popitem(last=False)
            return int(window[1]) if window is not None else 0

    def __call__(self, logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        """structlog processor for hbmwatch's own events."""
        level = logging.getLevelName(method.upper().replace("EXCEPTION", "ERROR"))
        if not isinstance(level, int) or level < self.min_level or self.seconds <= 0:
            return event_dict
        name = getattr(logger, "name", "")
        key = (name, str(event_dict.get("event")), level, str(event_dict.get("target", "")))
        repeated = self.allow(key)
        if repeated is None:
            raise structlog.DropEvent
        if repeated:
            event_dict["repeated"] = repeated
        return event_dict

    def filter(self, record: logging.LogRecord) -> bool:
        """logging.Filter for other libraries' records (uvicorn, SQLAlchemy, psycopg)."""
        if isinstance(record.msg, dict) or record.levelno < self.min_level or self.seconds <= 0:
            return True  # structlog's own events were limited by __call__ already
        repeated = self.allow((record.name, str(record.msg), record.levelno))
        if repeated is None:
            return False
        if repeated:
            record.repeated = repeated
        return True
