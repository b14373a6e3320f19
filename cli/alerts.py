"""``hbmwatch incidents``, ``hbmwatch silence ...`` and ``hbmwatch rules``: alerting from a shell.

These read and write the store directly (whoever runs them can read the database); a
running ``hbmwatch up`` picks up new and expired silences on its next detection cycle.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hbmwatch.settings import Settings

silence_app = typer.Typer(help="Silence alerts by label matchers.", no_args_is_help=True)
console = Console(stderr=True)
out = Console(width=160)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _store(settings: Settings):
    from hbmwatch.runtime.preflight import check_store
    from hbmwatch.store.store import open_store
    from hbmwatch.validation import HbmwatchError

    try:  # reading a database that is not there must not create an empty one
        check_store(settings.store, must_exist=True)
    except HbmwatchError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    return open_store(settings.store)


def list_incidents(settings: Settings, *, all_: bool, as_json: bool, limit: int) -> None:
    store = _store(settings)
    try:
        found = store.alerts.incidents(limit=limit)
    finally:
        store.close()
    if not all_:
        found = [i for i in found if i.open]
    if as_json:
        rows = [{"id": i.id, "state": i.state.value, "severity": i.severity.value,
                 "title": i.title, "opened_ms": i.opened_ms, "resolved_ms": i.resolved_ms,
                 "alerts": len(i.alerts), "causes": [c.cause for c in i.causes]}
                for i in found]  # fmt: skip
        print(json.dumps(rows, indent=2))
        return
    table = Table("id", "state", "severity", "opened (UTC)", "alerts", "title")
    for i in found:
        table.add_row(i.id, i.state.value, i.severity.value, _when(i.opened_ms),
                      str(len(i.alerts)), i.title)  # fmt: skip
    out.print(table)
    console.print(f"{len(found)} incident(s)" + ("" if all_ else " open (--all for every one)"))


def add_silence(settings: Settings, matchers: list[str], *, duration: str, by: str,
                comment: str) -> None:  # fmt: skip
    from hbmwatch.alerts.matchers import parse_matcher
    from hbmwatch.alerts.runner import Alerting
    from hbmwatch.validation import parse_duration

    try:
        parsed = [parse_matcher(m) for m in matchers]
        seconds = parse_duration(duration)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    store = _store(settings)
    try:
        alerting = Alerting(store, settings.alerts)
        now = store.now_ms()
        silence = alerting.add_silence(parsed, starts_ms=None, ends_ms=now + int(seconds * 1000),
                                       created_by=by, comment=comment)  # fmt: skip
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    finally:
        store.close()
    print(silence.id)
    console.print(f"silenced until {_when(silence.ends_ms)} UTC")


def list_silences(settings: Settings, *, all_: bool) -> None:
    store = _store(settings)
    try:
        now = store.now_ms()
        found = store.alerts.silences(active_at_ms=None if all_ else now)
    finally:
        store.close()
    table = Table("id", "matchers", "starts (UTC)", "ends (UTC)", "by", "comment")
    for s in found:
        text = ", ".join(f'{m.name}{m.op}"{m.value}"' for m in s.matchers)
        table.add_row(s.id, text, _when(s.starts_ms), _when(s.ends_ms), s.created_by, s.comment)
    out.print(table)


def expire_silence(settings: Settings, silence_id: str) -> None:
    from hbmwatch.alerts.runner import Alerting

    store = _store(settings)
    try:
        stored = {s.id: s for s in store.alerts.silences()}
        if silence_id not in stored:
            console.print(f"[red]error:[/red] no silence {silence_id}")
            raise typer.Exit(1)
        alerting = Alerting(store, settings.alerts)
        alerting.engine.silences = stored
        alerting.expire_silence(silence_id)
    finally:
        store.close()
    console.print(f"silence {silence_id} expired")


def write_rules(out_dir: Path) -> None:
    from hbmwatch.alerts.promrules import write_rules as write

    rules, tests = write(out_dir)
    console.print(f"wrote {rules} and {tests} (check: promtool check rules {rules}; "
                  f"test: promtool test rules {tests})")  # fmt: skip


AllOption = Annotated[bool, typer.Option("--all", help="Include resolved/expired ones.")]
