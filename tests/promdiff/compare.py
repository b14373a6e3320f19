"""Two PromQL HTTP answers compared the way the differential tests judge them.

Same HTTP status; on success the same ``resultType``, the same set of series (label sets
including ``__name__`` or its absence), the same timestamps and values equal within a
relative 1e-9 (NaN equals NaN, "+Inf"/"-Inf" compare as strings).  On error both must be
errors with the same HTTP status (400 bad_data, 422 execution).  hbmwatch answering 422
where Prometheus answers is its own outcome, "unsupported": reported apart from wrong
answers, and never a pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

REL_TOL = 1e-9
#: Values this close to zero compare equal: float sums in another order leave ~1e-16 noise.
ABS_TOL = 1e-12

Answer = tuple[int, Any]  # (HTTP status, parsed JSON body or the text when not JSON)
Ask = Callable[[str, str, Mapping[str, Any]], Answer]  # (method, path, params) -> answer


def http_ask(client: httpx.Client | Any, prefix: str = "") -> Ask:
    """Requests as Grafana sends them: GET with a query string, POST with a form body."""

    def ask(method: str, path: str, params: Mapping[str, Any]) -> Answer:
        url = prefix + path
        if method == "POST":
            response = client.post(url, data=dict(params))
        else:
            response = client.get(url, params=dict(params))
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    return ask


@dataclass(frozen=True)
class Outcome:
    """``kind``: same | both_error | unsupported | error_code | mismatch; ``why`` says why."""

    kind: str
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.kind in ("same", "both_error")


def _labels(item: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    return frozenset(item.get("metric", {}).items())


def _value_equal(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if math.isinf(x) or math.isinf(y):
        return x == y
    return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _points_differ(mine: list[list[Any]], theirs: list[list[Any]]) -> str:
    if [round(float(p[0]) * 1000) for p in mine] != [round(float(p[0]) * 1000) for p in theirs]:
        return (
            f"timestamps differ: hbmwatch {[p[0] for p in mine][:6]}... ({len(mine)}) vs "
            f"prometheus {[p[0] for p in theirs][:6]}... ({len(theirs)})"
        )
    for p, q in zip(mine, theirs, strict=True):
        if not _value_equal(p[1], q[1]):
            return f"value at {p[0]}: hbmwatch {p[1]} vs prometheus {q[1]}"
    return ""


def _fmt(labels: frozenset[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels)) + "}"


def _series_differ(mine: list[dict], theirs: list[dict], key: str, ordered: bool) -> str:
    a = {_labels(s): s for s in mine}
    b = {_labels(s): s for s in theirs}
    if len(a) != len(mine) or len(b) != len(theirs):
        dup_a, dup_b = len(mine) - len(a), len(theirs) - len(b)
        return f"duplicate label sets: hbmwatch {dup_a}, prometheus {dup_b}"
    if a.keys() != b.keys():
        extra = sorted(map(_fmt, a.keys() - b.keys()))[:3]
        missing = sorted(map(_fmt, b.keys() - a.keys()))[:3]
        return (
            f"series differ: {len(a)} vs {len(b)}; only hbmwatch {extra}; only prometheus {missing}"
        )
    if ordered and [_labels(s) for s in mine] != [_labels(s) for s in theirs]:
        return "series order differs (sort/sort_desc)"
    for labels, s in a.items():
        t = b[labels]
        mine_points = [s["value"]] if key == "value" else s["values"]
        their_points = [t["value"]] if key == "value" else t["values"]
        why = _points_differ(mine_points, their_points)
        if why:
            return f"{_fmt(labels)}: {why}"
    return ""


def compare(mine: Answer, theirs: Answer, *, ordered: bool = False) -> Outcome:
    """Judge hbmwatch's answer (``mine``) against Prometheus' (``theirs``)."""
    (code_a, body_a), (code_b, body_b) = mine, theirs
    ok_a = code_a == 200 and isinstance(body_a, dict) and body_a.get("status") == "success"
    ok_b = code_b == 200 and isinstance(body_b, dict) and body_b.get("status") == "success"
    if not ok_b:
        if ok_a:
            return Outcome("mismatch", f"prometheus error {code_b} {_error(body_b)}; hbmwatch ok")
        if code_a != code_b:
            return Outcome("error_code", f"hbmwatch {code_a} {_error(body_a)}; prometheus {code_b}")
        return Outcome("both_error")
    if not ok_a:
        kind = "unsupported" if code_a == 422 else "mismatch"
        return Outcome(kind, f"hbmwatch {code_a} {_error(body_a)}")
    return data_outcome(body_a["data"], body_b["data"], ordered=ordered)


def data_outcome(a: Any, b: Any, *, ordered: bool = False) -> Outcome:
    if not isinstance(a, dict) or "resultType" not in a:
        return _list_outcome(a, b)
    if a.get("resultType") != b.get("resultType"):
        return Outcome("mismatch", f"resultType {a.get('resultType')} vs {b.get('resultType')}")
    kind = b["resultType"]
    if kind in ("scalar", "string"):
        why = _points_differ([a["result"]], [b["result"]])
    else:
        why = _series_differ(
            a["result"], b["result"], "value" if kind == "vector" else "values", ordered
        )
    return Outcome("mismatch", why) if why else Outcome("same")


def _list_outcome(a: Any, b: Any) -> Outcome:
    """/labels, /label/x/values (lists of strings) and /series (label maps): as sets."""
    if isinstance(a, list) and isinstance(b, list):
        norm_a = {x if isinstance(x, str) else frozenset(x.items()) for x in a}
        norm_b = {x if isinstance(x, str) else frozenset(x.items()) for x in b}
        if norm_a == norm_b:
            return Outcome("same")

        def show(items: set[Any]) -> list[str]:
            return sorted(x if isinstance(x, str) else _fmt(x) for x in items)[:3]

        return Outcome(
            "mismatch",
            f"sets differ ({len(norm_a)} vs {len(norm_b)}): only hbmwatch "
            f"{show(norm_a - norm_b)}, only prometheus {show(norm_b - norm_a)}",
        )
    return Outcome("same") if a == b else Outcome("mismatch", f"{str(a)[:200]} vs {str(b)[:200]}")


def _error(body: Any) -> str:
    if isinstance(body, dict):
        return f"{body.get('errorType')}: {str(body.get('error'))[:200]}"
    return str(body)[:200]
