"""tests/test_scale_e2e.py's run with Prometheus (``--web.enable-remote-write-receiver``) as
the receiver: a file of its own, so that ``--dist loadfile`` runs it beside the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from hbmwatch.bench.engines import PrometheusServer
from tests.test_scale_e2e import running, sharded_fleet

pytestmark = pytest.mark.postgres


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sharded_fleet_on_prometheus(pg_url: str, tmp_path: Path) -> None:
    with running(PrometheusServer, tmp_path / "prometheus") as engine:
        sharded_fleet(engine, pg_url, tmp_path)
