"""Findings as rows: written as detectors open, update and end them; read for triage."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, delete, select

from hbmwatch.records import (
    Finding,
    finding_from_dict,
    finding_to_dict,
)
from hbmwatch.store.guard import guarded
from hbmwatch.store.models import FindingRow

MAX_FINDINGS_PER_QUERY = 5_000
#: Findings one ``updated_since`` reads: a storm's worth (each finding is one row).
MAX_FINDINGS_STATED = 200_000


@guarded  # every method raises StoreUnavailable when the database cannot answer
class FindingLog:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def save(self, findings: Iterable[Finding]) -> int:
        """Insert or replace findings by id (a finding is updated in place as it evolves)."""
        rows = [_row(f) for f in findings]
        if not rows:
            return 0
        with self.engine.begin() as conn:
            conn.execute(delete(FindingRow).where(FindingRow.id.in_([r["id"] for r in rows])))
            conn.execute(FindingRow.__table__.insert(), rows)
        return len(rows)

    def query(
        self,
        *,
        open_only: bool = False,
        kind: str | None = None,
        host: str | None = None,
        rack: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        limit: int = 1000,
    ) -> list[Finding]:
        """Findings, newest first; ``since``/``until`` select those active in that span."""
        q = select(FindingRow.__table__).order_by(FindingRow.started_ms.desc(), FindingRow.id)
        if open_only:
            q = q.where(FindingRow.ended_ms.is_(None))
        if kind is not None:
            q = q.where(FindingRow.kind == kind)
        if host is not None:
            q = q.where(FindingRow.host == host)
        if rack is not None:
            q = q.where(FindingRow.rack == rack)
        if since_ms is not None:
            q = q.where((FindingRow.ended_ms.is_(None)) | (FindingRow.ended_ms >= since_ms))
        if until_ms is not None:
            q = q.where(FindingRow.started_ms <= until_ms)
        q = q.limit(min(limit, MAX_FINDINGS_PER_QUERY))
        with self.engine.connect() as conn:
            return [_finding(row._mapping) for row in conn.execute(q)]

    def updated_since(self, since_ms: int, limit: int = MAX_FINDINGS_STATED) -> list[Finding]:
        """Findings stated at or after ``since_ms`` (by ``updated_ms``), oldest first: what
        the alert leader reads from every detector process.  Not capped as the API's reads
        are: a reader that always got the same oldest rows would never see the newest."""
        q = (
            select(FindingRow.__table__)
            .where(FindingRow.updated_ms >= since_ms)
            .order_by(FindingRow.updated_ms, FindingRow.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [_finding(row._mapping) for row in conn.execute(q)]

    def get(self, finding_id: str) -> Finding | None:
        with self.engine.connect() as conn:
            q = select(FindingRow.__table__).where(FindingRow.id == finding_id)
            row = conn.execute(q).first()
        return None if row is None else _finding(row._mapping)


def _row(f: Finding) -> dict[str, Any]:
    d = finding_to_dict(f)
    d["host"] = f.entity.get("host", "")
    d["rack"] = f.entity.get("rack", "")
    d["entity"] = dict(f.entity)
    d["evidence"] = [dataclasses.asdict(e) for e in f.evidence]
    d["causes"] = [dataclasses.asdict(c) for c in f.causes]
    return d


def _finding(row: Mapping[str, Any]) -> Finding:
    return finding_from_dict(dict(row))
