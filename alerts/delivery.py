"""Alert delivery: the only code that talks to receivers (Alertmanager API v2, webhooks).

Every fact delivery needs survives a restart because it lives in the book (the store): each
alert's ``Delivery`` per receiver says what that receiver last accepted and when a failed
send may be retried; mirrored silences and the oldest resolution still owed are JSON state.
The clock is injected, so tests move time instead of sleeping.

Alertmanager receivers get what Prometheus would send: every firing alert, re-sent each
``resend_seconds`` with ``endsAt`` four re-sends ahead (so Alertmanager resolves them itself
if hbmwatch dies), and each resolution.  Webhook receivers get Alertmanager's own webhook
payload (version 4), one request per incident, as an Alertmanager routing by incident
would send it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import httpx
from prometheus_client import CollectorRegistry, Counter

from hbmwatch import log
from hbmwatch.records import Alert, AlertState, Delivery, Silence
from hbmwatch.settings import AlertSettings, ReceiverSettings
from hbmwatch.store.guard import StoreUnavailable

WEBHOOK_REPEAT_SECONDS = 4 * 3600
"""A still-firing incident is notified to a webhook again this often: Alertmanager's
``repeat_interval`` default.  (``AlertSettings.resend_seconds`` is Prometheus' re-send to an
Alertmanager, which de-duplicates; a webhook would page a person each time.)"""

RESOLVED_LOOKBACK_SECONDS = 3600.0
"""Each pass re-reads alerts resolved this long ago (or ``resolved_resend_seconds``, if
longer), so a resolution the engine records with an older timestamp is not missed."""

RATE_WINDOW_MS = 60_000
ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time: Alertmanager's endsAt of firing alerts
GROUP_LABELS = ("cluster", "rack", "host")
SINCE_STATE = "delivery:since_ms"
OUTCOMES = ("sent", "failed", "rate_limited")
_ERROR_CHARS = 200
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

logger = log.get(__name__)


class DeliveryBook(Protocol):
    """What delivery needs from the store; the store implements it, tests fake it."""

    def deliverable(self, since_ms: int) -> list[Alert]:
        """Firing alerts, and alerts resolved at or after ``since_ms``."""
        ...

    def deliveries(self, receiver: str) -> dict[str, Delivery]:
        """This receiver's delivery rows, by alert id."""
        ...

    def save_deliveries(self, rows: Iterable[Delivery]) -> None: ...

    def silences(self) -> list[Silence]:
        """Active silences and expired ones still in the store."""
        ...

    def get_state(self, name: str) -> Any:
        """JSON state saved under ``name``; None when absent."""
        ...

    def put_state(self, name: str, value: Any) -> None: ...


@dataclass
class DeliveryReport:
    """One pass: ``(receiver, alert id)`` pairs accepted, failed (retried after a backoff) and
    deferred by the rate limit.  Alerts waiting out a backoff are in none of them."""

    sent: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    deferred: list[tuple[str, str]] = field(default_factory=list)
    requests: int = 0  # HTTP requests made, silence requests included
    silences_mirrored: list[tuple[str, str]] = field(default_factory=list)  # (receiver, id)
    silences_expired: list[tuple[str, str]] = field(default_factory=list)


# --- payloads -----------------------------------------------------------------------------


def rfc3339(ms: int) -> str:
    """UTC with milliseconds, as Alertmanager reads and writes times.

    >>> rfc3339(1_800_000_000_123)
    '2027-01-15T08:00:00.123Z'
    """
    t = _EPOCH + timedelta(milliseconds=ms)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def generator_url(alert: Alert, external_url: str) -> str:
    """Where a person clicking the alert lands: its incident, else the alert itself."""
    base = external_url.rstrip("/")
    if alert.incident_id:
        return f"{base}/incidents/{alert.incident_id}"
    return f"{base}/api/v1/alerts/{alert.id}"


def _strings(values: Mapping[str, Any]) -> dict[str, str]:
    """Labels as Alertmanager takes them: strings, no empty values, valid names only.

    Alertmanager rejects a whole request for one bad name, so one would block every alert.
    """
    out = {str(k): str(v) for k, v in values.items() if v is not None and str(v) != ""}
    return {k: v for k, v in out.items() if _LABEL_NAME.fullmatch(k)}


def _starts_ms(alert: Alert) -> int:
    return alert.firing_ms if alert.firing_ms is not None else alert.started_ms


def _ends_ms(alert: Alert, now_ms: int) -> int:
    return alert.resolved_ms if alert.resolved_ms is not None else now_ms


def alertmanager_alerts(
    alerts: Iterable[Alert], now_ms: int, *, valid_for_ms: int, external_url: str
) -> list[dict[str, Any]]:
    """Postable alerts for Alertmanager's POST /api/v2/alerts.

    A firing alert's ``endsAt`` is ``valid_for_ms`` ahead, as Prometheus sets it, so
    Alertmanager resolves it by itself when the re-sends stop; a resolved one's is when it
    resolved.
    """
    out = []
    for a in alerts:
        resolved = a.state is AlertState.RESOLVED
        ends = _ends_ms(a, now_ms) if resolved else now_ms + valid_for_ms
        out.append(
            {
                "labels": _strings(a.labels),
                "annotations": _strings(a.annotations),
                "startsAt": rfc3339(_starts_ms(a)),
                "endsAt": rfc3339(ends),
                "generatorURL": generator_url(a, external_url),
            }
        )
    return out


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The pairs every map has, equal."""
    if not maps:
        return {}
    first, rest = maps[0], maps[1:]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in rest)}


def webhook_alert(alert: Alert, now_ms: int, external_url: str) -> dict[str, Any]:
    """One entry of a webhook payload's ``alerts``, as Alertmanager writes it."""
    resolved = alert.state is AlertState.RESOLVED
    return {
        "status": "resolved" if resolved else "firing",
        "labels": _strings(alert.labels),
        "annotations": _strings(alert.annotations),
        "startsAt": rfc3339(_starts_ms(alert)),
        "endsAt": rfc3339(_ends_ms(alert, now_ms)) if resolved else ZERO_TIME,
        "generatorURL": generator_url(alert, external_url),
        "fingerprint": alert.fingerprint,
    }


def webhook_payload(
    receiver_name: str,
    group_key: str,
    alerts: Sequence[Alert],
    now_ms: int,
    *,
    external_url: str,
    truncated_alerts: int = 0,
) -> dict[str, Any]:
    """Alertmanager's webhook payload, version 4, so existing webhook consumers read it."""
    entries = [webhook_alert(a, now_ms, external_url) for a in alerts]
    labels = [e["labels"] for e in entries]
    common = _common(labels)
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": truncated_alerts,
        "status": "firing" if any(e["status"] == "firing" for e in entries) else "resolved",
        "receiver": receiver_name,
        "groupLabels": {k: common[k] for k in GROUP_LABELS if k in common},
        "commonLabels": common,
        "commonAnnotations": _common([e["annotations"] for e in entries]),
        "externalURL": external_url.rstrip("/"),
        "alerts": entries,
    }


def silence_body(silence: Silence) -> dict[str, Any]:
    """A postable silence; Alertmanager wants a non-empty author and comment."""
    comment = f"{silence.comment} [hbmwatch silence {silence.id}]".strip()
    return {
        "matchers": [
            {
                "name": m.name,
                "value": m.value,
                "isRegex": m.op in ("=~", "!~"),
                "isEqual": m.op in ("=", "=~"),
            }
            for m in silence.matchers
        ],
        "startsAt": rfc3339(silence.starts_ms),
        "endsAt": rfc3339(silence.ends_ms),
        "createdBy": silence.created_by or "hbmwatch",
        "comment": comment,
    }


# --- delivery rows ------------------------------------------------------------------------


def backoff_ms(attempts: int, settings: AlertSettings) -> int:
    """Retry delay after ``attempts`` failures: doubling from retry_seconds, capped."""
    doubled = settings.retry_seconds * 2 ** min(max(attempts - 1, 0), 62)
    return int(1000 * min(settings.retry_max_seconds, doubled))


def accepted(row: Delivery, state: str, now_ms: int) -> Delivery:
    return replace(
        row, sent_state=state, sent_ms=now_ms, attempts=0, next_attempt_ms=0, last_error=""
    )


def failed(row: Delivery, error: str, now_ms: int, settings: AlertSettings) -> Delivery:
    """Nothing is dropped: the row keeps what was last accepted, so it stays due."""
    attempts = row.attempts + 1
    return replace(
        row,
        attempts=attempts,
        next_attempt_ms=now_ms + backoff_ms(attempts, settings),
        last_error=error,
    )


def alertmanager_wants(
    alert: Alert, row: Delivery, now_ms: int, settings: AlertSettings, *, mirror: bool
) -> bool:
    """Whether an Alertmanager is owed this alert now (backoff aside).

    Silenced alerts are still sent where silences are mirrored: the mirror mutes them there,
    and stopping the re-sends would make Alertmanager resolve them.  Re-sending a resolution
    for ``resolved_resend_seconds``, as Prometheus does, covers an Alertmanager that lost it.
    """
    age_ms = now_ms - (row.sent_ms or 0)
    resend_ms = settings.resend_seconds * 1000
    if alert.state is AlertState.FIRING:
        muted = alert.inhibited_by or (alert.silenced_by and not mirror)
        if muted and row.sent_state != "firing":
            return False  # muted before Alertmanager knew it: it never pages
        # Muted after it was sent: keep it alive there rather than let it expire into a
        # false "resolved"; a page already went out for it.
        return row.sent_state != "firing" or age_ms >= resend_ms
    if alert.state is not AlertState.RESOLVED:
        return False
    if row.sent_state == "firing":
        return True
    recent = now_ms - _ends_ms(alert, now_ms) <= settings.resolved_resend_seconds * 1000
    return row.sent_state == "resolved" and age_ms >= resend_ms and recent


def webhook_group_due(members: Sequence[tuple[Alert, Delivery]], now_ms: int) -> bool:
    """A state change since the receiver last took the group, or the repeat interval."""
    firing = [row for alert, row in members if alert.state is AlertState.FIRING]
    if len(firing) < len(members) or any(row.sent_state != "firing" for row in firing):
        return True  # a resolution owed, or a new firing alert
    last_ms = max(row.sent_ms or 0 for row in firing)
    return now_ms - last_ms >= WEBHOOK_REPEAT_SECONDS * 1000


def _priority(pair: tuple[Alert, Delivery]) -> tuple[int, int]:
    """Changes first (new firing, resolutions), then re-sends, oldest first."""
    alert, row = pair
    return (int(row.sent_state == alert.state.value), row.sent_ms or 0)


# --- the dispatcher -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Outcome:
    limited: bool = False
    status: int | None = None
    error: str = ""
    data: Any = None

    @property
    def ok(self) -> bool:
        return not self.limited and not self.error


@dataclass(frozen=True)
class _Request:
    """One notification: its body and the alerts (with their rows) it carries."""

    url: str
    body: Any
    alerts: Sequence[tuple[Alert, Delivery]]


@dataclass
class _Lane:
    """One receiver's in-memory state: its request times (rate limit), silence retries."""

    settings: ReceiverSettings
    sent_at: deque[int] = field(default_factory=deque)
    silence_retry: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def base(self) -> str:
        return self.settings.url.rstrip("/")

    def take_slot(self, now_ms: int) -> bool:
        """Room for one more request in the sliding minute; takes it if so."""
        while self.sent_at and self.sent_at[0] <= now_ms - RATE_WINDOW_MS:
            self.sent_at.popleft()
        if len(self.sent_at) >= self.settings.max_requests_per_minute:
            return False
        self.sent_at.append(now_ms)
        return True

    def headers(self) -> dict[str, str]:
        token = self.settings.bearer_token
        return {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}

    def scrub(self, text: str) -> str:
        """Short, and without the token should a server echo it."""
        token = self.settings.bearer_token
        if token and token.get_secret_value():
            text = text.replace(token.get_secret_value(), "***")
        return text[:_ERROR_CHARS]


class Dispatcher:
    """Delivers alerts from the book to every configured receiver, one ``tick`` at a time."""

    def __init__(
        self,
        book: DeliveryBook,
        settings: AlertSettings,
        clock: Callable[[], float] = time.time,
        *,
        client: httpx.AsyncClient | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._book = book
        self._settings = settings
        self._clock = clock
        self._lanes = [
            _Lane(r, deque(book.get_state(f"delivery:{r.name}:requests") or ()))
            for r in settings.receivers
        ]
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(follow_redirects=False)
        self._counter: Counter | None = None
        if registry is not None:
            self._counter = Counter(
                "hbmwatch_alert_notifications_total",
                "Alert notification requests to receivers, by outcome.",
                ["receiver", "outcome"],
                registry=registry,
            )
            for lane in self._lanes:
                for outcome in OUTCOMES:
                    self._counter.labels(lane.name, outcome)

    async def tick(self) -> DeliveryReport:
        """One pass over every receiver: mirror silences, then send what is due."""
        now_ms = int(self._clock() * 1000)
        report = DeliveryReport()
        saved = self._book.get_state(SINCE_STATE)
        since_ms = _since_ms(saved, now_ms - self._lookback_ms())
        wanted = (AlertState.FIRING, AlertState.RESOLVED)
        alerts = [a for a in self._book.deliverable(since_ms) if a.state in wanted]
        owed: list[int] = []
        for lane in self._lanes:
            if lane.settings.kind == "alertmanager":
                if lane.settings.mirror_silences:
                    await self._mirror_silences(lane, now_ms, report)
                owed += await self._tick_alertmanager(lane, alerts, now_ms, report)
            else:
                owed += await self._tick_webhook(lane, alerts, now_ms, report)
        new_since = min([now_ms - self._lookback_ms(), *owed])
        if _should_save_since(saved, new_since):
            self._book.put_state(SINCE_STATE, new_since)
        return report

    async def run(self, stop: asyncio.Event, every_seconds: float = 1.0) -> None:
        """Tick until ``stop`` is set; a failed pass is logged and the next one retries."""
        while not stop.is_set():
            try:
                await self.tick()
            except StoreUnavailable as exc:  # an outage, not a bug: no traceback each second
                logger.warning("alert delivery pass skipped: store unavailable", error=str(exc))
            except Exception:
                logger.exception("alert delivery pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_seconds)

    async def aclose(self) -> None:
        """Close the HTTP client, if this dispatcher made it."""
        if self._own_client:
            await self._client.aclose()

    def _lookback_ms(self) -> int:
        seconds = max(self._settings.resolved_resend_seconds, RESOLVED_LOOKBACK_SECONDS)
        return int(seconds * 1000)

    # --- alerts ---------------------------------------------------------------------------

    async def _tick_alertmanager(
        self, lane: _Lane, alerts: list[Alert], now_ms: int, report: DeliveryReport
    ) -> list[int]:
        """Send due alerts in batches; return when owed resolutions resolved (not accepted)."""
        rows = self._book.deliveries(lane.name)
        mirror = lane.settings.mirror_silences
        pairs = [(a, rows.get(a.id) or Delivery(lane.name, a.id)) for a in alerts]
        wanted = [p for p in pairs if alertmanager_wants(*p, now_ms, self._settings, mirror=mirror)]
        ready = sorted((p for p in wanted if p[1].next_attempt_ms <= now_ms), key=_priority)
        valid_for_ms = int(4 * self._settings.resend_seconds * 1000)
        size = lane.settings.max_alerts_per_request
        url = f"{lane.base}/api/v2/alerts"
        requests = []
        for i in range(0, len(ready), size):
            batch = ready[i : i + size]
            body = alertmanager_alerts(
                [a for a, _ in batch],
                now_ms,
                valid_for_ms=valid_for_ms,
                external_url=self._settings.external_url,
            )
            requests.append(_Request(url, body, batch))
        done = await self._send_all(lane, requests, now_ms, report)
        return _owed(wanted, done, now_ms)

    async def _tick_webhook(
        self, lane: _Lane, alerts: list[Alert], now_ms: int, report: DeliveryReport
    ) -> list[int]:
        """One request per incident with news; muted alerts are left out, as Alertmanager does."""
        due = [
            (key, members)
            for key, members in self._webhook_groups(lane, alerts).items()
            if webhook_group_due(members, now_ms)
        ]
        waiting = {k for k, m in due if any(d.next_attempt_ms > now_ms for _, d in m)}
        ready = sorted(
            (g for g in due if g[0] not in waiting),
            key=lambda g: min(_priority(p) for p in g[1]),
        )
        requests = []
        for key, members in ready:
            shown = members[: lane.settings.max_alerts_per_request]
            body = webhook_payload(
                lane.name,
                key,
                [a for a, _ in shown],
                now_ms,
                external_url=self._settings.external_url,
                truncated_alerts=len(members) - len(shown),
            )
            requests.append(_Request(lane.settings.url, body, members))
        done = await self._send_all(lane, requests, now_ms, report)
        return _owed((p for _, members in due for p in members), done, now_ms)

    def _webhook_groups(
        self, lane: _Lane, alerts: list[Alert]
    ) -> dict[str, list[tuple[Alert, Delivery]]]:
        """Unmuted firing alerts and owed resolutions, by incident (else alone), firing first.

        A payload truncated to max_alerts_per_request still marks every alert of its group
        as taken, as Alertmanager's ``truncatedAlerts`` does.
        """
        rows = self._book.deliveries(lane.name)
        groups: dict[str, list[tuple[Alert, Delivery]]] = {}
        for a in alerts:
            row = rows.get(a.id) or Delivery(lane.name, a.id)
            if a.muted or (a.state is AlertState.RESOLVED and row.sent_state != "firing"):
                continue
            groups.setdefault(a.incident_id or a.id, []).append((a, row))
        for members in groups.values():
            members.sort(key=lambda p: (p[0].state is not AlertState.FIRING, _starts_ms(p[0])))
        return groups

    async def _send_all(
        self, lane: _Lane, requests: list[_Request], now_ms: int, report: DeliveryReport
    ) -> set[str]:
        """Send in order until the rate limit says no; the rest waits for a later pass.

        Returns the ids of the alerts accepted.
        """
        done: set[str] = set()
        for n, request in enumerate(requests):
            outcome = await self._call(lane, "POST", request.url, request.body, now_ms, report)
            if outcome.limited:
                self._defer(lane, requests[n:], report)
                break
            self._record(lane, request, outcome, now_ms, report)
            if outcome.ok:
                done.update(a.id for a, _ in request.alerts)
        return done

    def _defer(self, lane: _Lane, requests: list[_Request], report: DeliveryReport) -> None:
        ids = [(lane.name, a.id) for r in requests for a, _ in r.alerts]
        report.deferred += ids
        for _ in requests:
            self._count(lane, "rate_limited")
        logger.debug(
            "alert notifications rate limited",
            receiver=lane.name,
            requests=len(requests),
            alerts=len(ids),
        )

    def _record(
        self,
        lane: _Lane,
        request: _Request,
        outcome: _Outcome,
        now_ms: int,
        report: DeliveryReport,
    ) -> None:
        """Note one request's outcome on every alert in it, in the book at once."""
        ids = [(lane.name, a.id) for a, _ in request.alerts]
        if outcome.error:
            rows = [failed(d, outcome.error, now_ms, self._settings) for _, d in request.alerts]
            report.failed += ids
            logger.warning(
                "alert notification failed",
                receiver=lane.name,
                status=outcome.status,
                alerts=len(ids),
                error=outcome.error,
            )
        else:
            rows = [accepted(d, a.state.value, now_ms) for a, d in request.alerts]
            report.sent += ids
            logger.debug(
                "alert notification sent",
                receiver=lane.name,
                status=outcome.status,
                alerts=len(ids),
            )
        self._book.save_deliveries(rows)
        self._count(lane, "failed" if outcome.error else "sent")

    def _count(self, lane: _Lane, outcome: str) -> None:
        if self._counter is not None:
            self._counter.labels(lane.name, outcome).inc()

    async def _call(
        self, lane: _Lane, method: str, url: str, body: Any, now_ms: int, report: DeliveryReport
    ) -> _Outcome:
        """One request, if the rate limit allows; errors come back short and token-free."""
        if not lane.take_slot(now_ms):
            return _Outcome(limited=True)
        # The window outlives the process: a restart must not reopen it to a storm.
        self._book.put_state(f"delivery:{lane.name}:requests", list(lane.sent_at))
        report.requests += 1
        try:
            response = await self._client.request(
                method,
                url,
                json=body,
                headers=lane.headers(),
                timeout=lane.settings.timeout_seconds,
            )
        except httpx.HTTPError as exc:
            return _Outcome(error=lane.scrub(f"{type(exc).__name__}: {exc}".rstrip(": ")))
        if not response.is_success:
            text = response.text.strip()
            return _Outcome(
                status=response.status_code,
                error=lane.scrub(f"HTTP {response.status_code}: {text}"),
            )
        try:
            data = response.json() if response.content else None
        except ValueError:
            data = None
        return _Outcome(status=response.status_code, data=data)

    # --- silences -------------------------------------------------------------------------

    async def _mirror_silences(self, lane: _Lane, now_ms: int, report: DeliveryReport) -> None:
        """Create hbmwatch's silences in Alertmanager; expire there those ended early here."""
        key = f"delivery:{lane.name}:silences"
        mirrored: dict[str, dict[str, Any]] = dict(self._book.get_state(key) or {})
        current = {s.id: s for s in self._book.silences()}
        live = {sid for sid, s in current.items() if s.ends_ms > now_ms}
        for sid in sorted(set(mirrored) | live):
            retry = lane.silence_retry.get(sid)
            if retry is not None and retry[1] > now_ms:
                continue
            entry = mirrored.get(sid)
            outcome, new = await self._sync_silence(
                lane, sid, current.get(sid), entry, now_ms, report
            )
            if outcome.limited:
                break
            if outcome.error:
                self._silence_failed(lane, sid, outcome, now_ms)
                continue
            lane.silence_retry.pop(sid, None)
            if new == entry:
                continue
            if new is None:
                mirrored.pop(sid, None)
            else:
                mirrored[sid] = new
            self._book.put_state(key, mirrored)  # at once: a crash must not mirror twice

    async def _sync_silence(
        self,
        lane: _Lane,
        sid: str,
        silence: Silence | None,
        entry: dict[str, Any] | None,
        now_ms: int,
        report: DeliveryReport,
    ) -> tuple[_Outcome, dict[str, Any] | None]:
        """Bring one silence in line; returns the request's outcome and the new mirror entry."""
        url = f"{lane.base}/api/v2/silences"
        if entry is None:
            assert silence is not None
            outcome = await self._call(lane, "POST", url, silence_body(silence), now_ms, report)
            new = _mirror_entry(outcome, silence)
            if new is not None:
                report.silences_mirrored.append((lane.name, sid))
            return _checked(outcome, new), new
        if entry["ends_ms"] <= now_ms:  # over there already; recreated next pass if extended
            return _Outcome(), None
        ends_ms = silence.ends_ms if silence is not None else now_ms  # gone: over now
        if ends_ms == entry["ends_ms"]:  # unchanged: Alertmanager ends it by itself
            return _Outcome(), entry
        if ends_ms <= now_ms or silence is None:  # ended early: expire it there
            outcome = await self._call(
                lane, "DELETE", f"{lane.base}/api/v2/silence/{entry['id']}", None, now_ms, report
            )
            if outcome.ok or "not found" in outcome.error:
                report.silences_expired.append((lane.name, sid))
                return _Outcome(status=outcome.status), None
            return outcome, entry
        body = {**silence_body(silence), "id": entry["id"]}  # moved: update it there
        outcome = await self._call(lane, "POST", url, body, now_ms, report)
        if "not found" in outcome.error:
            return _Outcome(status=outcome.status), None  # lost there: recreated next pass
        new = _mirror_entry(outcome, silence)
        return _checked(outcome, new), new if new is not None else entry

    def _silence_failed(self, lane: _Lane, sid: str, outcome: _Outcome, now_ms: int) -> None:
        attempts = lane.silence_retry.get(sid, (0, 0))[0] + 1
        lane.silence_retry[sid] = (attempts, now_ms + backoff_ms(attempts, self._settings))
        logger.warning(
            "silence mirroring failed",
            receiver=lane.name,
            silence=sid,
            status=outcome.status,
            error=outcome.error,
        )


def _mirror_entry(outcome: _Outcome, silence: Silence) -> dict[str, Any] | None:
    data = outcome.data if outcome.ok else None
    silence_id = data.get("silenceID") if isinstance(data, dict) else None
    return {"id": str(silence_id), "ends_ms": silence.ends_ms} if silence_id else None


def _checked(outcome: _Outcome, entry: dict[str, Any] | None) -> _Outcome:
    """A 2xx without a silence id is a failure too."""
    if outcome.ok and entry is None:
        return replace(outcome, error="no silenceID in Alertmanager's answer")
    return outcome


def _owed(pairs: Iterable[tuple[Alert, Delivery]], done: set[str], now_ms: int) -> list[int]:
    """When the owed, not yet accepted resolutions resolved: the next pass reads from there."""
    return [
        _ends_ms(a, now_ms) for a, _ in pairs if a.state is AlertState.RESOLVED and a.id not in done
    ]


def _since_ms(saved: Any, default: int) -> int:
    """Oldest resolution to read: the saved watermark covers owed ones and any downtime."""
    return min(saved, default) if isinstance(saved, int) else default


def _should_save_since(saved: Any, new: int) -> bool:
    """An older saved watermark is only more reading, never a miss: save when it must move
    back, else at most about once a minute rather than every pass."""
    return not isinstance(saved, int) or new < saved or new - saved >= RATE_WINDOW_MS
