"""Sharded collectors: each target scraped by exactly one of N collectors, chosen by the
hash of its URL as Prometheus' ``hashmod`` chooses, re-balanced as the target file changes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from hbmwatch.collector.engine import BatchingSink, ScrapeEngine
from hbmwatch.collector.targets import TargetSet
from hbmwatch.settings import CollectorSettings
from hbmwatch.sharding import Shard, hashmod
from hbmwatch.store.store import Store
from tests.conftest import Clock
from tests.prometheus_server import PROMETHEUS, prometheus, wait_for
from tests.test_collector import engine_for, simulated

URLS = [f"http://10.0.{i // 250}.{i % 250}:9400/metrics" for i in range(200)]
#: Computed with Prometheus' algorithm (md5, low 8 bytes big-endian, mod N) and checked
#: against a real Prometheus below: any change to the hash breaks deployments that mix.
EXPECTED = {
    "http://10.0.0.1:9400/metrics": {2: 1, 3: 2, 4: 1, 7: 5},
    "http://10.0.0.2:9400/metrics": {2: 0, 3: 2, 4: 2, 7: 6},
    "http://node7:5000/metrics": {2: 0, 3: 1, 4: 0, 7: 5},
}


def settings(urls: list[str], shard: str | None = None, **kw: object) -> CollectorSettings:
    targets = [{"kind": "dcgm", "url": u} for u in urls]
    return CollectorSettings(targets=targets, shard=shard, **kw)  # type: ignore[arg-type]


def owned(urls: list[str], shard: str) -> set[str]:
    return {t.url for t in TargetSet(settings(urls, shard)).current()}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16])
def test_every_target_is_owned_by_exactly_one_shard(n: int) -> None:
    shares = [owned(URLS, f"{i}/{n}") for i in range(n)]
    assert sum(len(s) for s in shares) == len(URLS)
    assert set().union(*shares) == set(URLS)
    if n > 1:  # spread, not all on one: 200 targets, each shard gets some
        assert all(shares)


def test_the_mapping_is_prometheus_hashmod_and_fixed() -> None:
    for url, by_n in EXPECTED.items():
        for n, index in by_n.items():
            assert hashmod(url, n) == index
            assert owned([url], f"{index}/{n}") == {url}


def test_the_mapping_is_the_same_in_another_process() -> None:
    code = (
        "import json, sys; from hbmwatch.sharding import hashmod; "
        "print(json.dumps([hashmod(u, 7) for u in json.loads(sys.argv[1])]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(URLS[:50])],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    assert json.loads(out) == [hashmod(u, 7) for u in URLS[:50]]


@pytest.mark.slow
@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="needs the prometheus binary")
def test_a_real_prometheus_shards_the_same_way(tmp_path: Path) -> None:
    """Prometheus' own ``hashmod`` + ``keep`` over the URLs keeps, for each i/N, ours."""
    urls = list(dict.fromkeys(URLS[:40] + list(EXPECTED)))
    targets = [{"targets": ["127.0.0.1:1"], "labels": {"url": u}} for u in urls]
    jobs = []
    for n in (2, 3, 5):
        for i in range(n):
            relabel = [
                {"source_labels": ["url"], "modulus": n, "target_label": "__tmp_hash",
                 "action": "hashmod"},
                {"source_labels": ["__tmp_hash"], "regex": str(i), "action": "keep"},
            ]  # fmt: skip
            jobs.append(
                {"job_name": f"s{i}_{n}", "static_configs": targets, "relabel_configs": relabel}
            )
    config = {"global": {"scrape_interval": "1h"}, "scrape_configs": jobs}
    with prometheus(tmp_path, json.dumps(config)) as url:  # JSON is YAML

        def active() -> dict[str, set[str]]:
            found = httpx.get(f"{url}/api/v1/targets", params={"state": "active"}).json()
            by_job: dict[str, set[str]] = {j["job_name"]: set() for j in jobs}
            for t in found["data"]["activeTargets"]:
                by_job[t["labels"]["job"]].add(t["labels"]["url"])
            kept = sum(len(v) for v in by_job.values())
            return by_job if kept == 3 * len(urls) else {}

        by_job = wait_for(active, "prometheus to load its targets")
    for n in (2, 3, 5):
        for i in range(n):
            assert by_job[f"s{i}_{n}"] == owned(urls, f"{i}/{n}"), f"shard {i}/{n}"


def test_a_changed_target_file_rebalances(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    path.write_text(json.dumps([{"kind": "dcgm", "url": u} for u in URLS[:20]]))
    sets = [TargetSet(CollectorSettings(target_file=str(path), shard=f"{i}/3")) for i in range(3)]
    first = [{t.url for t in s.current()} for s in sets]
    assert sorted(u for share in first for u in share) == sorted(URLS[:20])
    path.write_text(json.dumps([{"kind": "dcgm", "url": u} for u in URLS[10:50]]))
    os.utime(path, ns=(1, 1))  # a new stamp even within the clock's resolution
    second = [{t.url for t in s.current()} for s in sets]
    assert sorted(u for share in second for u in share) == sorted(URLS[10:50])
    for i, share in enumerate(second):
        assert share == {u for u in URLS[10:50] if hashmod(u, 3) == i}
        assert first[i] & set(URLS[10:20]) == share & set(URLS[10:20])  # the kept stay put
    assert all(s.total == 40 for s in sets)


def test_the_engine_exposes_how_many_targets_it_owns() -> None:
    registry = CollectorRegistry()
    c = settings(URLS[:30], "1/4")
    sink = BatchingSink(lambda batch: None, 1000, 1.0)
    engine = ScrapeEngine(TargetSet(c), sink, c, registry=registry)
    mine = engine.current_targets()
    assert len(mine) == sum(hashmod(u, 4) == 1 for u in URLS[:30])
    assert registry.get_sample_value("hbmwatch_collector_targets_owned") == len(mine)
    assert registry.get_sample_value("hbmwatch_collector_targets_total") == 30


@pytest.mark.parametrize(
    ("flag", "why"),
    [("3/2", "need 0 <= i < N"), ("1", "not of the form i/N"), ("-1/2", "not of the form")],
)
def test_a_bad_shard_flag_is_one_line_and_exit_2(tmp_path: Path, flag: str, why: str) -> None:
    from hbmwatch.cli.main import app

    targets = tmp_path / "t.json"
    targets.write_text("[]")
    result = CliRunner().invoke(app, ["collect", "--targets", str(targets), "--shard", flag])
    assert result.exit_code == 2, result.output
    assert why in result.output and len(result.output.strip().splitlines()) == 1


def test_the_shard_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="need 0 <= i < N"):
        CollectorSettings(shard="2/2")
    assert Shard.parse(CollectorSettings(shard=" 1 / 2 ").shard) == Shard(1, 2)


def test_shards_share_one_store_and_each_writes_its_devices(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    """Three collectors, shards 0/3, 1/3 and 2/3 of the simulated fleet, into one store:
    every target scraped once, every host's devices in the inventory."""

    async def run() -> tuple[int, list[list[str]]]:
        async with simulated(clock.now - 10) as (sim, targets):
            scraped = []
            for i in range(3):
                engine = engine_for(
                    store, targets, tmp_path / str(i), lambda: sim.now_unix, shard=f"{i}/3"
                )
                async with engine:
                    sim.step()
                    reports = await engine.scrape_round(int(sim.now_unix * 1000))
                    await engine.sink.flush()
                scraped.append([r.target for r in reports if r.up])
            return len(targets), scraped

    total, scraped = asyncio.run(run())
    urls = [u for share in scraped for u in share]
    assert all(scraped) and len(urls) == len(set(urls)) == total
    hosts = {d.host for d in store.devices()}
    assert hosts == {"r0-node0", "r1-node0", "r2-node0"}
    assert len(store.devices()) == 24  # three nodes of eight GPUs
