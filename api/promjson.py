"""Prometheus' HTTP API dialect: its time and duration parameters, and its JSON, byte for
byte (timestamps as seconds with up to three decimals, values as strings in Go's format).

Answers are written as text rather than through a JSON encoder, because Prometheus prints
``1435781451.500`` and ``"1e-07"`` where Python's encoder would print ``1435781451.5`` and
``1e-07`` unquoted; clients that compare answers, and Grafana's own parser, see the same.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import datetime

import numpy as np

from hbmwatch.promql.errors import BadQuery
from hbmwatch.promql.values import Labels, Row, Scalar, String, Windows

_DURATION = re.compile(r"^((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$")
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
#: Prometheus' bounds for a missing start or end (its minTime / maxTime), in ms
MIN_TIME_MS = -9_223_309_901_257_974
MAX_TIME_MS = 9_223_309_901_257_974


def parse_time(text: str, name: str) -> int:
    """A Unix time in seconds (fractions to the ms) or RFC 3339, as ms."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise BadQuery(
                f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp'
            ) from None
        if stamp.tzinfo is None:
            raise BadQuery(
                f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp'
            ) from None
        return math.floor(stamp.timestamp() * 1000)
    if not math.isfinite(seconds) or abs(seconds) > 9.2e15:
        raise BadQuery(f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp')
    whole = math.trunc(seconds)
    fraction = round((seconds - whole) * 1000)
    return whole * 1000 + fraction


def parse_duration(text: str, name: str) -> int:
    """Seconds (``15``, ``0.5``) or a Prometheus duration (``1m30s``), as ms."""
    try:
        seconds = float(text)
    except ValueError:
        found = _DURATION.match(text)
        if text in ("", "0") or found is None:
            raise BadQuery(
                f'invalid parameter "{name}": cannot parse "{text}" to a valid duration'
            ) from None
        groups = found.groups()[1::2]
        return sum(int(g) * unit for g, unit in zip(groups, _UNIT_MS, strict=True) if g)
    if not math.isfinite(seconds) or abs(seconds * 1e9) >= 2**63:
        raise BadQuery(
            f'invalid parameter "{name}": cannot parse "{text}" to a valid duration. '
            "It overflows int64"
        )
    return int(seconds * 1e9) // 1_000_000


def timestamp(ms: int) -> str:
    """Go's ``jsonutil.MarshalTimestamp``: seconds, then ``.`` and three digits if any."""
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    whole, fraction = divmod(ms, 1000)
    return f"{sign}{whole}.{fraction:03d}" if fraction else f"{sign}{whole}"


def value(v: float) -> str:
    """Go's ``jsonutil.MarshalValue``: 'f' format, 'e' below 1e-6 or from 1e21, quoted."""
    if v != v:
        return '"NaN"'
    if math.isinf(v):
        return '"+Inf"' if v > 0 else '"-Inf"'
    magnitude = abs(v)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        text = np.format_float_scientific(v, unique=True, trim="-", exp_digits=2)
        return f'"{text}"'
    text = repr(float(v))
    if "e" in text:
        text = np.format_float_positional(v, unique=True, trim="-")
    elif text.endswith(".0"):
        text = text[:-2]
    return f'"{text}"'


def metric(labels: Labels) -> str:
    return json.dumps(dict(labels), ensure_ascii=False, separators=(",", ":"))


def _points(times: Iterable[int], values: Iterable[float]) -> str:
    return ",".join(f"[{timestamp(t)},{value(v)}]" for t, v in zip(times, values, strict=True))


def render(result: object, times: np.ndarray, *, instant: bool) -> tuple[str, str]:
    """``(resultType, result JSON)`` for a value over the evaluation ``times``."""
    if isinstance(result, String):
        return "string", f"[{timestamp(int(times[0]))},{json.dumps(result.value)}]"
    if isinstance(result, Scalar):
        if instant:
            return "scalar", f"[{timestamp(int(times[0]))},{value(float(result.values[0]))}]"
        result = [Row((), result.values, np.ones(len(times), dtype=bool))]
    if isinstance(result, Windows):
        parts = []
        for i, s in enumerate(result.series):
            lo, hi = int(result.lo[i, 0]), int(result.hi[i, 0])
            if hi > lo:
                points = _points(s.times[lo:hi].tolist(), s.values[lo:hi].tolist())
                parts.append(f'{{"metric":{metric(s.labels)},"values":[{points}]}}')
        return "matrix", "[" + ",".join(parts) + "]"
    assert isinstance(result, list)
    if instant:
        t = timestamp(int(times[0]))
        parts = [
            f'{{"metric":{metric(r.labels)},"value":[{t},{value(float(r.values[0]))}]}}'
            for r in result
            if r.present[0]
        ]
        return "vector", "[" + ",".join(parts) + "]"
    parts = []
    for r in sorted(result, key=lambda r: r.labels):
        keep = r.present
        points = _points(times[keep].tolist(), r.values[keep].tolist())
        parts.append(f'{{"metric":{metric(r.labels)},"values":[{points}]}}')
    return "matrix", "[" + ",".join(parts) + "]"


def success(data: str, warnings: list[str]) -> str:
    extra = f',"warnings":{json.dumps(warnings)}' if warnings else ""
    return f'{{"status":"success","data":{data}{extra}}}'


def error(error_type: str, message: str) -> str:
    return json.dumps({"status": "error", "errorType": error_type, "error": message})
