"""The default scrape deadline: a page a second late at a 1 s interval is late, not down.

With 0.8 x the interval, a 20-minute `hbmwatch up` on a starved 2-core host counted every
exporter down (their pages took about 1 s to come), lost the faults on those hosts and paged
target-down for each; with a 5 s floor the same run found all five faults.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hbmwatch.collector.targets import Target, resolve
from hbmwatch.settings import CollectorSettings, TargetSettings
from hbmwatch.store.store import Store
from tests.conftest import Clock, make_store
from tests.test_scrape_limits import SlowPage, engine


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", Clock(time.time()))
    store._clock = time.time
    yield store
    store.close()


def settings(**kw: object) -> CollectorSettings:
    return CollectorSettings.model_validate(kw)


def target_settings(**kw: object) -> TargetSettings:
    return TargetSettings.model_validate({"kind": "dcgm", "url": "http://127.0.0.1:1/", **kw})


def test_default_deadline_has_a_floor_and_prometheus_ceiling() -> None:
    assert resolve(target_settings(), settings()).timeout_seconds == 5.0
    assert resolve(target_settings(interval_seconds=8), settings()).timeout_seconds == 6.4
    assert resolve(target_settings(interval_seconds=60), settings()).timeout_seconds == 10.0


def test_an_explicit_deadline_is_kept() -> None:
    assert resolve(target_settings(timeout_seconds=0.5), settings()).timeout_seconds == 0.5
    got = resolve(target_settings(), settings(timeout_seconds=0.7))
    assert got.timeout_seconds == 0.7


def test_a_page_a_second_late_is_up_at_the_default_deadline(
    sqlite_store: Store, tmp_path: Path
) -> None:
    async def run() -> object:
        async with SlowPage(1.2) as url:
            target = resolve(target_settings(url=url, labels={"host": "h"}), settings())
            eng = engine(sqlite_store, [target], tmp_path, CollectorRegistry())
            async with eng:
                report = await asyncio.wait_for(eng.scrape(target, int(time.time() * 1000)), 60)
            await eng.sink.flush()
            return report

    report = asyncio.run(run())
    assert report.up, report  # type: ignore[attr-defined]


def test_the_bundled_simulators_targets_get_the_same_default() -> None:
    """`hbmwatch up`'s own fleet used to be cut at 0.8 s whatever resolve() said."""
    from hbmwatch.runtime.service import simulator_targets
    from hbmwatch.settings import Settings
    from hbmwatch.simulator.inprocess import InProcessServer
    from hbmwatch.simulator.runner import Simulation
    from hbmwatch.simulator.scenario import load_scenario

    served = asyncio.run(InProcessServer(Simulation(load_scenario("default"))).start())
    got = simulator_targets(served, Settings())
    assert got and {t.timeout_seconds for t in got} == {5.0}
    assert Target("dcgm", "http://x/metrics").timeout_seconds == 5.0
    assert Target("dcgm", "http://x/metrics", {}, 30.0).timeout_seconds == 10.0
    assert Target("dcgm", "http://x/metrics", {}, 1.0, 0.3).timeout_seconds == 0.3
