"""The series registry: metric plus canonical label set <-> integer id, with its caps.

The table is the truth; this class keeps a cache of it, so the write path resolves a
series with one dict lookup and new rows written by another process are picked up by id.
A new series is checked against the canonical model (known metric, declared labels,
allowed values) and against the cardinality caps before it is created.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from hbmwatch import metrics
from hbmwatch.matchers import Matcher
from hbmwatch.metrics import WORKLOAD_LABELS, MetricDef
from hbmwatch.query import MatchOp, Selector, check_time_budget
from hbmwatch.records import SeriesKey
from hbmwatch.store.models import Series
from hbmwatch.validation import (
    CardinalityExceeded,
    HbmwatchError,
    InvalidLabels,
    InvalidName,
    UnknownMetric,
    check_label_name,
    check_label_value,
)

#: the label PromQL matches the metric name by
NAME_LABEL = "__name__"


@dataclass(frozen=True)
class Caps:
    max_series_total: int
    max_series_per_metric: int
    max_values_per_workload_label: int


def validate_series(key: SeriesKey) -> MetricDef:
    """Check a series against the canonical model; return its metric definition."""
    definition = metrics.get(key.metric)
    if definition is None:
        raise UnknownMetric(
            f"unknown metric {key.metric!r}: not in the canonical model (docs/metrics.md)",
            metric=key.metric,
        )
    allowed = definition.allowed_labels
    labels = key.label_dict
    for name, value in key.labels:
        check_label_name(name)
        check_label_value(name, value)
        if name not in allowed:
            raise InvalidLabels(
                f"{key.metric} does not take label {name!r} "
                f"(allowed: {', '.join(sorted(allowed))})",
                metric=key.metric,
                label=name,
            )
        permitted = definition.label_values.get(name)
        if permitted is not None and value not in permitted:
            raise InvalidLabels(
                f"{key.metric}: {name}={value!r} is not one of {', '.join(permitted)}",
                metric=key.metric,
                label=name,
                value=value,
            )
    missing = [name for name in definition.required_labels if not labels.get(name)]
    if missing:
        raise InvalidLabels(
            f"{key.metric} needs label(s) {', '.join(missing)}", metric=key.metric, missing=missing
        )
    return definition


class SeriesRegistry:
    def __init__(self, engine: Engine, caps: Caps, clock_ms: callable) -> None:  # type: ignore[valid-type]
        self._engine = engine
        self._caps = caps
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        #: Keyed by the series' canonical text: str hashes are cached in C, which keeps the
        #: write path's lookup free of Python-level calls.
        self.ids: dict[str, int] = {}
        self.keys: dict[int, SeriesKey] = {}
        self.counter_ids: set[int] = set()
        self._by_metric: dict[str, list[int]] = defaultdict(list)
        self._workload_values: dict[str, set[str]] = defaultdict(set)
        self._pending: Counter[str] = Counter()
        self._max_id = 0

    def id_of(self, key: SeriesKey) -> int | None:
        return self.ids.get(key.text)

    def __len__(self) -> int:
        return len(self.ids)

    def refresh(self, conn: Connection | None = None) -> None:
        """Load series created since the last refresh (by this or another process)."""
        if conn is None:
            with self._engine.connect() as own:
                self.refresh(own)
            return
        rows = conn.execute(
            select(Series.id, Series.metric, Series.labels)
            .where(Series.id > self._max_id)
            .order_by(Series.id)
        ).all()
        with self._lock:
            for series_id, metric, labels in rows:
                self._remember(series_id, SeriesKey(metric, labels))

    def _remember(self, series_id: int, key: SeriesKey) -> None:
        if series_id in self.keys:
            return
        self.ids[key.text] = series_id
        self.keys[series_id] = key
        self._by_metric[key.metric].append(series_id)
        definition = metrics.get(key.metric)
        if definition is not None and definition.is_counter:
            self.counter_ids.add(series_id)
        for name, value in key.labels:
            if name in WORKLOAD_LABELS:
                self._workload_values[name].add(value)
        self._max_id = max(self._max_id, series_id)

    def _check_caps(self, key: SeriesKey) -> None:
        caps = self._caps
        if len(self.ids) + sum(self._pending.values()) >= caps.max_series_total:
            raise CardinalityExceeded(
                f"series cap reached ({caps.max_series_total} series); refusing {key.text}",
                series=key.text,
            )
        if len(self._by_metric[key.metric]) + self._pending[key.metric] >= (
            caps.max_series_per_metric
        ):
            raise CardinalityExceeded(
                f"{key.metric} has {caps.max_series_per_metric} series, its cap; "
                f"refusing {key.text}",
                series=key.text,
            )
        for name, value in key.labels:
            seen = self._workload_values.get(name)
            if (
                name in WORKLOAD_LABELS
                and seen is not None
                and value not in seen
                and len(seen) >= caps.max_values_per_workload_label
            ):
                raise CardinalityExceeded(
                    f"workload label {name} has {len(seen)} values, its cap; refusing "
                    f"{name}={value!r} (label explosion?)",
                    series=key.text,
                    label=name,
                )

    def create(self, keys: Iterable[SeriesKey]) -> dict[SeriesKey, int | HbmwatchError]:
        """Resolve or create each key; a key that fails a check maps to its error."""
        outcome: dict[SeriesKey, int | HbmwatchError] = {}
        fresh: list[SeriesKey] = []
        for key in keys:
            if key in outcome:
                continue
            known = self.ids.get(key.text)
            if known is not None:
                outcome[key] = known
                continue
            try:
                validate_series(key)
            except (UnknownMetric, InvalidLabels, InvalidName) as exc:
                outcome[key] = exc
                continue
            fresh.append(key)
        if not fresh:
            return outcome
        with self._engine.begin() as conn:
            self.refresh(conn)
            admitted = []
            for key in fresh:
                known = self.ids.get(key.text)
                if known is not None:
                    outcome[key] = known
                    continue
                try:
                    self._check_caps(key)
                except CardinalityExceeded as exc:
                    outcome[key] = exc
                    continue
                admitted.append(key)
                self._reserve(key)
            outcome.update(self._insert(conn, admitted))
        return outcome

    def _reserve(self, key: SeriesKey) -> None:
        """Count a series against the caps before its row exists (for the rest of the batch)."""
        self._pending[key.metric] += 1
        for name, value in key.labels:
            if name in WORKLOAD_LABELS:
                self._workload_values[name].add(value)

    def _insert(self, conn: Connection, keys: list[SeriesKey]) -> dict[SeriesKey, int]:
        """Insert new series in bulk (ignoring ones another process just created); map ids."""
        self._pending.clear()
        if not keys:
            return {}
        now = self._clock_ms()
        rows = [
            {"metric": k.metric, "key": k.text, "labels": dict(k.labels), "created_ms": now}
            for k in keys
        ]
        stmt = (sqlite_insert if conn.dialect.name == "sqlite" else pg_insert)(Series)
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["key"]), rows)
        by_text = {k.text: k for k in keys}
        found: dict[SeriesKey, int] = {}
        texts = list(by_text)
        for i in range(0, len(texts), 500):
            for series_id, text_ in conn.execute(
                select(Series.id, Series.key).where(Series.key.in_(texts[i : i + 500]))
            ):
                found[by_text[text_]] = int(series_id)
        with self._lock:
            for key, series_id in found.items():
                self._remember(series_id, key)
        return found

    def select(self, selector: Selector) -> list[tuple[int, SeriesKey]]:
        """Series matching a selector, in id order."""
        candidates = self._by_metric.get(selector.metric, [])
        exact = {m.label: m.value for m in selector.matchers if m.op is MatchOp.EQ}
        found = []
        for series_id in candidates:
            key = self.keys[series_id]
            labels = key.label_dict
            if any(labels.get(k, "") != v for k, v in exact.items()):
                continue
            if selector.matches(key):
                found.append((series_id, key))
        return found

    def select_matching(self, matchers: Sequence[Matcher]) -> list[tuple[int, SeriesKey]]:
        """Series matching PromQL matchers, the metric name as label ``__name__``, in id order.

        A name matched by equality narrows the scan to that metric's series.
        """
        names = [m for m in matchers if m.label == NAME_LABEL]
        rest = [m for m in matchers if m.label != NAME_LABEL]
        exact = [m.value for m in names if m.op is MatchOp.EQ]
        if exact:
            candidates = list(self._by_metric.get(exact[0], []))
        else:
            candidates = [sid for ids in list(self._by_metric.values()) for sid in list(ids)]
            candidates.sort()
        found = []
        for series_id in candidates:
            check_time_budget()
            key = self.keys[series_id]
            if not all(m.matches(key.metric) for m in names):
                continue
            labels = key.label_dict
            if all(m.matches(labels.get(m.label, "")) for m in rest):
                found.append((series_id, key))
        return found
