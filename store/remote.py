"""The store with its samples on an existing TSDB (``store.remote``).

Samples are judged exactly as the SQL store judges them (``store/writing.py``: canonical
names and labels, caps, NaN, clock skew) and then remote-written to the engine instead of
the head table; every read of samples (detectors, the REST API, ``/prometheus``,
``/federate``) goes back through the engine's query API (``store/remote_read.py``).  What
stays in SQL (``store.url``): the series registry (ids, the canonical index that label and
series queries search), devices, findings, alerts, incidents, silences and state.

A read selects series from the registry, then asks the engine for them with the narrowest
selector that covers them all (the metric names and, for each label every series carries,
its values) and keeps only the series asked for: one request however many series.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy import Engine

from hbmwatch import log
from hbmwatch.matchers import Matcher, MatchOp, compile_regex
from hbmwatch.records import SeriesKey
from hbmwatch.settings import StoreSettings
from hbmwatch.store.aggregate import Partials
from hbmwatch.store.feed import SampleBlock
from hbmwatch.store.guard import StoreUnavailable, guarded
from hbmwatch.store.registry import NAME_LABEL
from hbmwatch.store.remote_read import EngineReader, LabelSet
from hbmwatch.store.remote_write import RemoteWriteClient, encode_arrays
from hbmwatch.store.results import CompactionReport, LatestValue, QueryResult, WriteResult
from hbmwatch.store.store import Store
from hbmwatch.store.tiered import TierSamples

logger = log.get("hbmwatch.store.remote")

#: A label whose values among the series read number more than this is left out of the
#: selector (the answer is filtered here instead), keeping the request short.
MAX_VALUES_PER_MATCHER = 512
#: A refusal by the receiver is logged at most this often (it is counted every time).
REFUSAL_LOG_SECONDS = 60.0
#: How often the detectors' reads ask the engine for watched series the registry lacks,
#: once they have some (collectors sharing the registry register theirs as they write;
#: a listing of every watched series is not work for every cycle).
DISCOVER_EVERY_SECONDS = 600.0


def narrowing(keys: Iterable[SeriesKey]) -> list[Matcher]:
    """The narrowest selector, in matchers, that covers every one of ``keys``.

    >>> a = SeriesKey("gpu_power_watts", {"host": "n1", "gpu": "0"})
    >>> b = SeriesKey("gpu_power_watts", {"host": "n2", "gpu": "0"})
    >>> [str(m) for m in narrowing([a, b])]
    ['__name__="gpu_power_watts"', 'gpu="0"', 'host=~"n1|n2"']
    """
    names: set[str] = set()
    values: dict[str, set[str]] | None = None
    for key in keys:
        names.add(key.metric)
        labels = dict(key.labels)
        if values is None:
            values = {k: {v} for k, v in labels.items()}
        else:
            for name in list(values):
                if name in labels:
                    values[name].add(labels[name])
                else:
                    del values[name]
    out = [_one_of(NAME_LABEL, names)]
    for name, seen in sorted((values or {}).items()):
        if len(seen) <= MAX_VALUES_PER_MATCHER:
            out.append(_one_of(name, seen))
    return out


def _one_of(label: str, values: set[str]) -> Matcher:
    """``label="v"`` or ``label=~"v1|v2"`` (``__name__`` too, which ``Matcher.of`` refuses
    as a user's label name)."""
    if len(values) == 1:
        return Matcher(label, MatchOp.EQ, next(iter(values)))
    pattern = "|".join(re.escape(v) for v in sorted(values))
    return Matcher(label, MatchOp.RE, pattern, compile_regex(pattern))


def _key_of(labels: LabelSet) -> SeriesKey:
    return SeriesKey(
        labels.get(NAME_LABEL, ""), {k: v for k, v in labels.items() if k != NAME_LABEL}
    )


class RemoteMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "hbmwatch_remote_write_requests",
            "Remote-write requests by outcome: stored, refused (4xx), retry (5xx, 429, no answer).",
            ["outcome"],
            registry=registry,
        )
        self.samples = Counter(
            "hbmwatch_remote_write_samples",
            "Samples remote-written, by outcome (stored, refused).",
            ["outcome"],
            registry=registry,
        )


@guarded
class RemoteStore(Store):
    """``Store`` whose samples live on a remote engine (module doc)."""

    #: No minute or hour tiers here: every read is of raw samples.
    has_tiers = False

    def __init__(
        self,
        engine: Engine,
        settings: StoreSettings,
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        registry = registry or CollectorRegistry()
        super().__init__(engine, settings, clock=clock, registry=registry)
        remote = settings.remote
        assert remote.write_url and remote.query_url  # settings validate both
        token = remote.bearer_token.get_secret_value() if remote.bearer_token else None
        common = {"timeout_seconds": remote.timeout_seconds, "headers": remote.headers,
                  "bearer_token": token}  # fmt: skip
        self.remote_writer = RemoteWriteClient(remote.write_url, **common)
        self.reader = EngineReader(remote.query_url, **common)
        self.remote_metrics = RemoteMetrics(registry)
        self.feed = None  # type: ignore[assignment]  # detectors read the engine, not memory
        self._discovered_at = -float("inf")
        self._refusal_logged = -float("inf")

    def close(self) -> None:
        self.remote_writer.close()
        self.reader.close()
        super().close()

    def ping(self) -> None:
        super().ping()
        now = self.now_ms()
        self.reader.raw([_one_of(NAME_LABEL, {"hbmwatch_ping"})], now - 1000, now)

    # -- writes ------------------------------------------------------------------------------
    def _store_rows(
        self,
        rows: list[tuple[int, int, float]],
        result: WriteResult,
        table: np.ndarray | None = None,
    ) -> WriteResult:
        rows = self._checked(rows, result, table)
        step = self.settings.remote.max_samples_per_request
        for at in range(0, len(rows), step):
            self._send(rows[at : at + step], result)
        self._count(result)
        return result

    def _send(self, rows: list[tuple[int, int, float]], result: WriteResult) -> None:
        if not rows:
            return
        table = np.array(rows, dtype=np.float64)
        stamps, sids = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
        order = np.lexsort((stamps, sids))  # by series, then time: receivers want order
        sids, stamps, values = sids[order], stamps[order], table[order, 2]
        firsts = np.flatnonzero(np.r_[True, sids[1:] != sids[:-1]])
        counts = np.diff(np.r_[firsts, len(sids)])
        keys = [self.series_registry.keys[int(sid)] for sid in sids[firsts]]
        outcome = self.remote_writer.send(encode_arrays(keys, counts.tolist(), stamps, values))
        if outcome.stored:
            self.remote_metrics.requests.labels("stored").inc()
            self.remote_metrics.samples.labels("stored").inc(len(rows))
            result.accepted += len(rows)
            return
        if outcome.retry:
            self.remote_metrics.requests.labels("retry").inc()
            raise StoreUnavailable(f"the remote-write receiver cannot take samples now: "
                                   f"{outcome.reason}")  # fmt: skip
        self.remote_metrics.requests.labels("refused").inc()
        self.remote_metrics.samples.labels("refused").inc(len(rows))
        result.rejected["receiver_refused"] += len(rows)
        if len(result.errors) < result.MAX_ERRORS:
            result.errors.append(f"receiver_refused: {len(rows)} samples: {outcome.reason}")
        if time.monotonic() - self._refusal_logged > REFUSAL_LOG_SECONDS:
            self._refusal_logged = time.monotonic()
            logger.warning("remote-write receiver refused samples; they are dropped, not "
                           "retried", samples=len(rows), reason=outcome.reason)  # fmt: skip

    def compact(self, now_ms: int | None = None) -> CompactionReport:
        """Nothing to compact: the engine keeps its own blocks."""
        return CompactionReport()

    def apply_retention(self, now_ms: int | None = None) -> dict[str, int]:
        """Nothing to expire here: the engine's own retention applies."""
        return {}

    # -- reads -------------------------------------------------------------------------------
    def _fetch(self, ids: Sequence[int], lo: int, hi: int) -> dict[int, tuple[np.ndarray, ...]]:
        """Samples in ``[lo, hi]`` of the series ``ids``, read in one request."""
        keys = self.series_registry.keys
        wanted = {keys[sid].text: sid for sid in ids if sid in keys}
        if not wanted:
            return {}
        out = {}
        for labels, t, v in self.reader.raw(narrowing(keys[s] for s in wanted.values()), lo, hi):
            sid = wanted.get(_key_of(labels).text)
            if sid is not None:
                order = np.argsort(t, kind="stable")
                out[sid] = (t[order], v[order])
        return out

    def _raw_samples(
        self, ids: list[int], lo: int, hi: int
    ) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], bool]:
        out = {}
        for sid, (t, v) in self._fetch(ids, lo, hi - 1).items():
            keep = (t >= lo) & (t < hi) & np.r_[True, t[1:] != t[:-1]]
            if keep.any():
                out[sid] = (t[keep], v[keep])
        return out, False

    def _rollup_partials(
        self, ids: list[int], lo: int, hi: int, *, hourly: bool
    ) -> dict[int, Partials]:
        raw, _ = self._raw_samples(ids, lo, hi)
        return {sid: Partials.of_samples(t, v) for sid, (t, v) in raw.items()}

    def range_query(self, *args: Any, **kwargs: Any) -> QueryResult:
        """As the SQL store's, from raw samples: the answer says ``raw`` whatever the step."""
        return dataclasses.replace(super().range_query(*args, **kwargs), tier="raw")

    def select_samples(
        self, matchers: Sequence[Matcher], lo: int, hi: int, tier: str = "raw"
    ) -> tuple[list[tuple[SeriesKey, np.ndarray, np.ndarray, TierSamples | None]], bool]:
        return super().select_samples(matchers, lo, hi, "raw")

    def latest_of(
        self, found: list[tuple[int, SeriesKey]], lookback: float = 300.0
    ) -> list[LatestValue]:
        now = self.now_ms()
        since = now - int(lookback * 1000)
        by_metric: dict[str, list[SeriesKey]] = defaultdict(list)
        for _, key in found:
            by_metric[key.metric].append(key)
        newest: dict[str, tuple[int, float]] = {}
        for keys in by_metric.values():
            for labels, ts, value in self.reader.newest(narrowing(keys), now):
                if ts >= since:
                    newest[_key_of(labels).text] = (ts, value)
        return [
            LatestValue(key, newest[key.text][0] / 1000, newest[key.text][1])
            for _, key in found
            if key.text in newest
        ]

    def label_sets(
        self, matchers: Sequence[Matcher], lo: int | None = None, hi: int | None = None
    ) -> list[SeriesKey]:
        self.series_registry.refresh()
        found = self.series_registry.select_matching(matchers)
        if lo is None or hi is None or not found:
            return [key for _, key in found]
        live = {_key_of(s).text for s in self.reader.series(narrowing(k for _, k in found), lo, hi)}
        return [key for _, key in found if key.text in live]

    # -- the detectors' feed -----------------------------------------------------------------
    def watch(
        self, metric_names: Iterable[str], wants: Callable[[SeriesKey], bool] | None = None
    ) -> None:
        super().watch(metric_names, wants)
        self._discovered_at = -float("inf")

    def _discover(self, lo: int, hi: int) -> None:
        """Register the watched series the engine holds and the registry does not know yet.

        The registry fills as collectors write; a detector process over a store of its own
        (a fresh schema, data another deployment wrote) learns the series from the engine.
        Every series is judged as a write would judge it; what fails is left out."""
        self._discovered_at = time.monotonic()
        names = _one_of(NAME_LABEL, set(self._watched_metrics))
        keys = {_key_of(labels) for labels in self.reader.series([names], lo, hi)}
        known = self.series_registry.ids
        fresh = [k for k in keys if k.text not in known]
        if fresh:
            self.resolve(fresh)
            logger.info("series learned from the engine", series=len(fresh))

    def read_new(self, cursor: int | None, since_ms: int) -> tuple[int, SampleBlock]:
        """Every watched sample the engine holds from ``since_ms`` on, in time order.

        Stateless, by time: there is no feed in memory here (the samples may come from other
        processes), so a runner over this store reads from the end of its last frame on
        every cycle (``DetectionRunner`` does so for any store without a local feed).
        """
        now = self.now_ms()
        self.series_registry.refresh()
        ids = self._watched_ids()
        stale = time.monotonic() - self._discovered_at >= DISCOVER_EVERY_SECONDS
        if self._watched_metrics and (not ids or stale):
            self._discover(since_ms, now)
            ids = self._watched_ids()
        fetched = self._fetch(ids, since_ms, now) if ids else {}
        block = SampleBlock.concat(
            [SampleBlock(np.full(len(t), sid, np.int64), t, v) for sid, (t, v) in fetched.items()]
        )
        order = np.argsort(block.timestamps_ms, kind="stable")
        return now, SampleBlock(
            block.series_ids[order], block.timestamps_ms[order], block.values[order]
        )
