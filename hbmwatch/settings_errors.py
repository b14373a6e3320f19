"""Settings errors as one line that names where the bad value came from and what would do.

pydantic reports a typo such as ``[store] urll`` as ``store.urll: Extra inputs are not
permitted`` over several lines, without saying which file or variable held it or what the
right spelling is; people fix settings faster with ``hbmwatch.toml: [store] urll: unknown
key; did you mean url?``.
"""

from __future__ import annotations

import difflib
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

ENV_PREFIX = "HBMWATCH_"
_NESTED = "__"
_HIDDEN = ("token", "password", "secret", "url")  # never echo these values back


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The model inside ``X``, ``list[X]``, ``X | None``; None for plain values."""
    if typing.get_origin(annotation) is None and isinstance(annotation, type):
        return annotation if issubclass(annotation, BaseModel) else None
    for arg in typing.get_args(annotation):
        if (inner := _submodel(arg)) is not None:
            return inner
    return None


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or (field := model.model_fields.get(str(part))) is None:
            return None
        model = _submodel(field.annotation)
    return model


def _where(loc: tuple[Any, ...]) -> str:
    """``[store] url``, ``[collector] targets[0].kind``, ``log_level``: the TOML spelling."""
    head, rest = str(loc[0]), loc[1:]
    if not rest:
        return head
    tail = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest).lstrip(".")
    return f"[{head}] {tail}"


def _env_name(loc: tuple[Any, ...], env: Mapping[str, str]) -> str | None:
    """The HBMWATCH_* variable that set ``loc`` (its section's, for a JSON value), if any."""
    names = {k.upper(): k for k in env}
    keys = [str(p) for p in loc if not isinstance(p, int)]
    for depth in range(len(keys), 0, -1):
        name = ENV_PREFIX + _NESTED.join(keys[:depth]).upper()
        if name in names:
            return names[name]
    return None


def _got(item: Mapping[str, Any]) -> str:
    value, loc = item.get("input"), item["loc"]
    if any(word in str(p).lower() for p in loc for word in _HIDDEN):
        return ""
    if isinstance(value, str | int | float) and len(repr(value)) <= 60:
        return f" (got {value!r})"
    return ""


def _problem(root: type[BaseModel], item: Mapping[str, Any]) -> tuple[str, str]:
    """(where, what) for one pydantic error."""
    loc = tuple(item["loc"])
    if not loc:
        return "settings", str(item["msg"])
    if item["type"] == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        known = sorted(parent.model_fields) if parent is not None else []
        close = difflib.get_close_matches(str(loc[-1]).lower(), known, n=1, cutoff=0.6)
        if len(loc) == 1 and isinstance(item.get("input"), dict):  # a [table] of its own
            hint = f"did you mean [{close[0]}]?" if close else f"sections: {', '.join(known)}"
            return f"[{loc[0]}]", f"unknown section; {hint}"
        hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(known)}"
        return _where(loc), f"unknown key; {hint}"
    message = str(item["msg"]).removeprefix("Value error, ")
    return _where(loc), message + _got(item)


def _as_variable(source: str, loc: tuple[Any, ...], what: str) -> str:
    """``did you mean url?`` as ``did you mean HBMWATCH_STORE__URL?`` when a variable named it."""
    own = ENV_PREFIX + _NESTED.join(str(p) for p in loc).upper()
    if source.upper() != own or "did you mean " not in what:
        return what  # the key sits inside a JSON value: its own spelling is the right one
    key = what.rsplit("did you mean ", 1)[1].rstrip("?")
    return f"unknown key; did you mean {source.rsplit(_NESTED, 1)[0]}{_NESTED}{key.upper()}?"


def explain(
    error: ValidationError,
    root: type[BaseModel],
    path: Path | None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Every problem in ``error`` on one line, each prefixed by the file or variable it is in."""
    env = os.environ if env is None else env
    problems = []
    for item in error.errors():
        where, what = _problem(root, item)
        source = _env_name(tuple(item["loc"]), env) if item["loc"] else None
        if source and item["type"] == "extra_forbidden":
            what = _as_variable(source, tuple(item["loc"]), what)
        origin = source if source else (str(path) if path is not None else "settings")
        problems.append(f"{origin}: {where}: {what}")
    return "; ".join(problems)


def unknown_env_sections(root: type[BaseModel], env: Mapping[str, str] | None = None) -> str:
    """``HBMWATCH_STOR__URL``-style typos, which pydantic-settings skips without a word.

    Only names with a double underscore are judged: single-underscore HBMWATCH_* variables
    belong to other tools (the compose file's, the tests') and are not settings.
    """
    env = os.environ if env is None else env
    sections = sorted(root.model_fields)
    problems = []
    for name in sorted(env):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or _NESTED not in upper:
            continue
        section, _, rest = upper.removeprefix(ENV_PREFIX).partition(_NESTED)
        if section.lower() in root.model_fields:
            continue
        close = difflib.get_close_matches(section.lower(), sections, n=1, cutoff=0.6)
        hint = (
            f"did you mean {ENV_PREFIX}{close[0].upper()}{_NESTED}{rest}?"
            if close
            else f"sections: {', '.join(sections)}"
        )
        problems.append(f"{name}: unknown section {section.lower()}; {hint}")
    return "; ".join(problems)
