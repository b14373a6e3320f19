"""Reading samples back from a Prometheus-compatible engine through its HTTP query API.

Only what Prometheus, VictoriaMetrics, Mimir and Thanos all answer alike is used:

* raw samples: an instant query of a range selector (``{...}[Nms]`` at ``time``) returns
  every stored sample in the range, with its own timestamp;
* the newest sample: ``{...}`` and ``timestamp({...})`` at now (the 5-minute lookback);
* series: ``/api/v1/series`` with ``match[]`` and ``start``/``end``.

Queries go as form POSTs (long selectors fit), at most ``timeout_seconds`` each.  An engine
that cannot be reached, times out or answers 5xx is ``StoreUnavailable`` (the caller skips
a cycle); a 4xx (the engine refused the query: too many samples, a bad matcher) is
``QueryTooExpensive`` with the engine's own words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import numpy as np

from hbmwatch.matchers import Matcher
from hbmwatch.store.guard import StoreUnavailable
from hbmwatch.validation import QueryTooExpensive

LabelSet = dict[str, str]
MAX_REASON_CHARS = 300


def selector_text(matchers: Sequence[Matcher]) -> str:
    """``{a="x",b=~"y"}``: PromQL's own escaping of each matcher."""
    return "{" + ",".join(str(m) for m in matchers) + "}"


class EngineReader:
    """Queries one engine's Prometheus API (``query_url`` + ``/api/v1/...``)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_seconds: float = 10.0,
        headers: Mapping[str, str] | None = None,
        bearer_token: str | None = None,
    ) -> None:
        sent = {"User-Agent": "hbmwatch", **(headers or {})}
        if bearer_token:
            sent["Authorization"] = f"Bearer {bearer_token}"
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(headers=sent, timeout=timeout_seconds)

    def close(self) -> None:
        self._client.close()

    def raw(
        self, matchers: Sequence[Matcher], lo_ms: int, hi_ms: int
    ) -> list[tuple[LabelSet, np.ndarray, np.ndarray]]:
        """Every sample in ``[lo_ms, hi_ms]`` of the series the matchers select."""
        if hi_ms < lo_ms:
            return []
        span = hi_ms - lo_ms + 1  # engines' ranges are left-open (VictoriaMetrics, Prometheus 3)
        query = f"{selector_text(matchers)}[{span}ms]"
        data = self._call("query", {"query": query, "time": _seconds(hi_ms)})
        out = []
        for item in data.get("result", []):
            values = item.get("values") or []
            if not values:
                continue
            pairs = np.array([(float(t), float(v)) for t, v in values], dtype=np.float64)
            stamps = np.rint(pairs[:, 0] * 1000).astype(np.int64)
            keep = (stamps >= lo_ms) & (stamps <= hi_ms)
            if keep.any():
                out.append((dict(item["metric"]), stamps[keep], pairs[keep, 1]))
        return out

    def newest(self, matchers: Sequence[Matcher], at_ms: int) -> list[tuple[LabelSet, int, float]]:
        """The newest sample of each selected series within the engine's lookback.

        The matchers must select one metric: ``timestamp()`` drops the name, so the two
        answers are joined on the other labels."""
        sel = selector_text(matchers)
        at = _seconds(at_ms)
        values = self._call("query", {"query": sel, "time": at}).get("result", [])
        stamps = self._call("query", {"query": f"timestamp({sel})", "time": at}).get("result", [])
        when = {_key(item["metric"]): float(item["value"][1]) for item in stamps}
        out = []
        for item in values:
            labels = {k: v for k, v in item["metric"].items() if k != "__name__"}
            ts = when.get(_key(labels))
            if ts is not None:
                out.append((dict(item["metric"]), round(ts * 1000), float(item["value"][1])))
        return out

    def series(
        self, matchers: Sequence[Matcher], lo_ms: int | None, hi_ms: int | None
    ) -> list[LabelSet]:
        params: dict[str, Any] = {"match[]": selector_text(matchers)}
        if lo_ms is not None and hi_ms is not None:
            params |= {"start": _seconds(lo_ms), "end": _seconds(hi_ms)}
        return [dict(s) for s in self._call("series", params)]

    def _call(self, endpoint: str, form: dict[str, Any]) -> Any:
        url = f"{self.base_url}/api/v1/{endpoint}"
        try:
            response = self._client.post(url, data=form)
        except httpx.HTTPError as exc:
            raise StoreUnavailable(
                f"the query engine at {self.base_url} is unavailable: {type(exc).__name__}: {exc}"
            ) from None
        if response.status_code >= 500:
            raise StoreUnavailable(
                f"the query engine at {self.base_url} failed: {_reason(response)}"
            )
        if response.status_code >= 400:
            raise QueryTooExpensive(
                f"the query engine refused the read: {_reason(response)}",
                limit="engine",
            )
        try:
            return response.json()["data"]
        except (ValueError, KeyError):
            raise StoreUnavailable(
                f"the query engine at {self.base_url} answered something other than "
                "Prometheus' API JSON"
            ) from None


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def _key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _reason(response: httpx.Response) -> str:
    try:
        text = str(response.json().get("error", ""))
    except ValueError:
        text = response.text
    text = " ".join(text.split())[:MAX_REASON_CHARS]
    return f"HTTP {response.status_code}: {text or response.reason_phrase}"
