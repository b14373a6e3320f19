"""A query reads one committed state: a compaction committing between its statements (in
this process or another) moves no minute past it, so none is missed or counted twice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hbmwatch.query import Aggregation, parse_selector
from hbmwatch.store import head
from hbmwatch.store.backend import DAY_MS
from hbmwatch.store.results import CompactionReport
from hbmwatch.store.store import Store
from tests.conftest import Clock, make_store
from tests.test_hours import HALF_HOUR, HOUR0, SELECTOR, _fill

KINDS: dict[str, Callable[[Store, Clock], Any]] = {
    "raw": lambda s, c: s.range_query(parse_selector(SELECTOR), HOUR0 / 1000, c.now, 10),
    "1m": lambda s, c: s.range_query(
        parse_selector(SELECTOR), HOUR0 / 1000, c.now, 60, Aggregation.COUNT
    ),
    "promql tiers": lambda s, c: s.select_samples(
        parse_selector(SELECTOR).matchers, HOUR0, int(c.now * 1000), tier="1m"
    ),
}


def _flat(result: Any) -> list:
    if isinstance(result, tuple):  # select_samples: (series, expired)
        return sorted((key.text, t.tolist(), v.tolist()) for key, t, v, _ in result[0])
    return sorted(
        (s.series.text, [(p.timestamp, p.value) for p in s.points]) for s in result.series
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_compaction_between_a_querys_statements_changes_nothing(
    kind: str, store_url: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock.advance(HALF_HOUR)
    store, other = make_store(store_url, clock), make_store(store_url, clock)
    try:
        _fill(store, int(clock.now * 1000))
        store.compact(hours=False)  # closed hours in minute chunks, the newest minutes in the head
        with store.engine.begin() as conn:
            # A running store has its day's hour partition; making one (PostgreSQL) would
            # wait for the reader's transaction, which here waits for it in one thread.
            store.backend.prepare_hour_partitions(conn, {HOUR0 - HOUR0 % DAY_MS})
        clock.advance(600)  # ten more minutes of the head are now due for compaction
        query = KINDS[kind]
        expected = _flat(query(store, clock))
        reports: list[CompactionReport] = []
        real = head.head_samples

        def compact_first(conn: Any, *args: Any) -> Any:
            if not reports:  # another store (process) compacts and commits, once
                reports.append(other.compact())
            return real(conn, *args)

        monkeypatch.setattr(head, "head_samples", compact_first)
        answer = _flat(query(store, clock))
        assert reports and reports[0].minutes > 0 and reports[0].hours > 0
        assert answer == expected
        monkeypatch.undo()
        if kind != "promql tiers":  # whose view shows a compacted minute as one sample
            assert _flat(query(store, clock)) == expected  # and after it, the same
    finally:
        store.close()
        other.close()
