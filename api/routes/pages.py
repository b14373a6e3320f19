"""Server-rendered pages for people: the incident page alert links point at.

Alerts carry ``incident_url`` = ``{alerts.external_url}/incidents/{id}``, so the page lives
at exactly ``/incidents/{id}``.  It is plain HTML with an inline SVG chart: readable with
JavaScript off, from a phone, through a proxy.  Jinja2 autoescapes every value; the chart
markup is built (and escaped) by ``hbmwatch.api.incident.svgchart``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from hbmwatch.api.deps import ScopeRead, StoreDep
from hbmwatch.api.incident.view import build_incident_view, incident_chart
from hbmwatch.api.incident.words import duration, relative, utc, utc_time
from hbmwatch.store.store import StoreUnavailable

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

router = APIRouter(tags=["pages"])


@cache
def templates() -> Environment:
    """One environment per process: templates compile once."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(utc=utc, utc_time=utc_time, relative=relative, duration=duration)
    return env


def render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    html = templates().get_template(name).render(**context)
    return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})


@router.get("/incidents/{incident_id}", response_class=HTMLResponse, include_in_schema=False)
def incident_page(
    incident_id: str, request: Request, store: StoreDep, _: ScopeRead
) -> HTMLResponse:
    """The incident page: header, chart, evidence in words, timeline, entities, alerts.

    Reads are open by default; with ``api.open_reads = false`` a browser needs a proxy that
    adds the read token.
    """
    try:
        view = build_incident_view(store, incident_id)
    except StoreUnavailable as exc:
        return render("error.html", 503, heading="The store is unavailable",
                      reason=str(exc), hint="Reload in a moment.")  # fmt: skip
    if view is None:
        return render(
            "error.html", 404, heading="No such incident",
            reason=f"No incident with id {incident_id!r} is stored here.",
            hint="Incidents are kept with their alerts; the id may be mistyped, or it may "
            "belong to another hbmwatch (check the link's host).",
        )  # fmt: skip
    base_url = str(request.base_url).rstrip("/")
    chart = Markup(incident_chart(view))  # built and escaped by hbmwatch.api.incident.svgchart
    return render("incident.html", view=view, chart=chart, base_url=base_url)
