"""The incident page's timeline rows (api/incident/timeline.py): ordered and folded,
whatever order or shape the stored timeline has."""

from __future__ import annotations

import dataclasses
import random

from hbmwatch.api.incident.timeline import (
    FOLD_ALERTS,
    AlertGroup,
    alert_rows,
    order_events,
    timeline_rows,
)
from hbmwatch.records import Alert, AlertState, IncidentEvent, Severity

T = 1_800_000_000_000


def ev(at_s: int, kind: str, text: str = "", alert: str | None = None) -> IncidentEvent:
    return IncidentEvent(T + at_s * 1000, kind, text or kind, alert)


def throttle_alert(i: int) -> Alert:
    return Alert(
        id=f"thr{i}", fingerprint=f"fp{i}", state=AlertState.RESOLVED, severity=Severity.WARNING,
        labels={"alertname": "GPUThrottling", "host": f"n{i}", "gpu": "0"}, annotations={},
        finding_id=f"f{i}", started_ms=T, updated_ms=T,
    )  # fmt: skip


def churn(n: int, start_s: int = 10) -> list[IncidentEvent]:
    out = []
    for i in range(n):
        out.append(ev(start_s + 10 * i, "alert_added", f"GPUThrottling host=n{i}", f"thr{i}"))
        out.append(ev(start_s + 10 * i + 5, "alert_resolved", "GPUThrottling resolved", f"thr{i}"))
    return out


def test_rows_are_in_time_order_whatever_order_they_were_stored_in() -> None:
    events = [ev(0, "opened"), *churn(2), ev(100, "severity", "warning -> critical")]
    shuffled = events[:]
    random.Random(7).shuffle(shuffled)
    rows = timeline_rows(shuffled)
    assert [r.at_ms for r in rows] == sorted(e.at_ms for e in events)
    assert rows[0].kind == "opened"


def test_at_one_instant_the_engine_s_order_holds() -> None:
    """The page orders as the engine inserts (alerts.timeline): opened, added, resolved."""
    events = [ev(0, "alert_resolved", "X resolved"), ev(0, "alert_added", "Y"), ev(0, "opened")]
    assert [e.kind for e in order_events(events)] == ["opened", "alert_added", "alert_resolved"]


def test_alerts_that_came_and_went_fold_into_one_row_naming_where() -> None:
    alerts = [throttle_alert(i) for i in range(12)]
    rows = timeline_rows([ev(0, "opened"), *churn(12)], alerts)
    assert [r.kind for r in rows] == ["opened", "alerts_folded"]
    row = rows[1]
    assert row.text == ("12 GPUThrottling alerts came and went "
                        "(n0 gpu 0, n1 gpu 0, n2 gpu 0, n3 gpu 0 +8 more)")  # fmt: skip
    assert (row.at_ms, row.until_ms, row.count) == (T + 10_000, T + 125_000, 24)


def test_a_folded_row_says_how_many_are_still_firing() -> None:
    events = churn(FOLD_ALERTS)[:-1]  # the last one has not resolved
    (row,) = timeline_rows(events)  # no alerts given: names come from the event text
    n = FOLD_ALERTS
    assert row.text == f"{n} GPUThrottling alerts fired: {n - 1} came and went, 1 still firing"
    added = [e for e in churn(n) if e.kind == "alert_added"]
    (row,) = timeline_rows(added)
    assert row.text == f"{n} GPUThrottling alerts fired, all still firing"


def test_a_few_alerts_are_not_folded() -> None:
    rows = timeline_rows([ev(0, "opened"), *churn(FOLD_ALERTS - 1)])
    assert len(rows) == 1 + 2 * (FOLD_ALERTS - 1) and not any(r.folded for r in rows)


def test_resolve_reopen_churn_folds_but_the_final_resolution_stays() -> None:
    events = [ev(0, "opened")]
    for k in range(3):
        events += [ev(100 + 50 * k, "resolved"), ev(120 + 50 * k, "reopened")]
    events.append(ev(400, "resolved", "all alerts resolved"))
    rows = timeline_rows(events, resolved=True)
    assert [(r.kind, r.text) for r in rows] == [
        ("opened", "opened"), ("reopened", "resolved and reopened 3 times"),
        ("resolved", "all alerts resolved"),
    ]  # fmt: skip


def test_severity_flapping_folds_with_its_last_change() -> None:
    pairs = [("warning", "critical"), ("critical", "warning")] * 2
    flips = [ev(10 * i, "severity", f"severity {a} -> {b}") for i, (a, b) in enumerate(pairs)]
    (row,) = timeline_rows(flips)
    assert row.text == "severity changed 4 times; last: severity critical -> warning"


def test_an_already_folded_or_unknown_event_passes_through() -> None:
    events = [ev(0, "opened"), ev(5, "alerts_folded", "12 GPUThrottling alerts came and went"),
              ev(9, "acknowledged", "on it"), ev(9, "comment", "looking at the CDU")]  # fmt: skip
    rows = timeline_rows(events)
    assert [(r.kind, r.text) for r in rows] == [(e.kind, e.text) for e in events]
    assert timeline_rows([]) == ()


def test_the_alerts_table_keeps_live_alerts_and_groups_resolved_repeats() -> None:
    done = [dataclasses.replace(throttle_alert(i), resolved_ms=T + 60_000 * i) for i in range(5)]
    live = dataclasses.replace(throttle_alert(9), state=AlertState.FIRING)
    other = dataclasses.replace(done[0], id="x", labels={"alertname": "GPUPCIeErrors"})
    rows = alert_rows([done[0], live, *done[1:], other])
    assert rows[0] is live and rows[-1] is other  # too few of its name to group
    group = rows[1]
    assert isinstance(group, AlertGroup) and len(group.alerts) == 5
    assert group.where == "n0 gpu 0, n1 gpu 0, n2 gpu 0, n3 gpu 0 +1 more"
    assert (group.first_ms, group.last_ms) == (T, T + 240_000)
