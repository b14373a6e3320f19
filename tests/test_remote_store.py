"""Samples on a real engine: remote-write to VictoriaMetrics and Prometheus, reads back.

Each engine runs for real (bench/engines.py); the store's SQL half is a SQLite file.  What
must hold (issue 16): every sample written is in the engine (counted there); a 4xx from the
receiver is counted as refused and never retried; a 5xx or a refused connection never loses
a sample (the collector's spool keeps it and replays it in order).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmwatch.bench.engines import (
    EngineProcess,
    EngineUnavailable,
    PrometheusServer,
    VictoriaMetrics,
)
from hbmwatch.collector.spool import Spool
from hbmwatch.collector.writer import SpoolingWriter
from hbmwatch.matchers import Matcher
from hbmwatch.query import parse_selector
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import load_settings
from hbmwatch.store import remote_write
from hbmwatch.store.engine import create_store_engine
from hbmwatch.store.migrate import upgrade
from hbmwatch.store.remote import RemoteStore, narrowing
from hbmwatch.store.store import StoreUnavailable, open_store

ENGINES = {"victoria-metrics": VictoriaMetrics, "prometheus": PrometheusServer}
DEADLINE_S = 60.0


def start_engine(kind: str, folder: Path, **options: object) -> EngineProcess:
    """The engine, or a skip (a failure under HBMWATCH_REQUIRE_SERVICES=1) if not installed."""
    try:
        return ENGINES[kind](folder, **options)
    except EngineUnavailable as exc:
        if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture(scope="module", params=sorted(ENGINES))
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcess]:
    with start_engine(request.param, tmp_path_factory.mktemp(request.param)) as running:
        yield running


def remote_store(tmp_path: Path, write_url: str, query_url: str, **remote: object) -> RemoteStore:
    tmp_path.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    engine = create_store_engine(url)
    upgrade(engine)
    engine.dispose()
    remote = {"write_url": write_url, "query_url": query_url, **remote}
    store = open_store(load_settings(store={"url": url, "remote": remote}).store)
    assert isinstance(store, RemoteStore)
    return store


def gpu_keys(tag: str, hosts: int = 3, gpus: int = 2) -> list[SeriesKey]:
    return [
        SeriesKey(
            "gpu_power_watts",
            {"cluster": tag, "rack": "r0", "host": f"n{h}", "gpu": str(g), "sku": "H200"},
        )
        for h in range(hosts)
        for g in range(gpus)
    ]


def eventually(check, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {DEADLINE_S:g} s: {what}")
        time.sleep(0.2)  # polling a condition, with a deadline


def engine_count(engine: EngineProcess, selector: str) -> float:
    answer = httpx.post(engine.url + "/api/v1/query",
                        data={"query": f"sum(count_over_time({selector}[1d]))"}).json()  # fmt: skip
    result = answer["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


# -- the wire format ---------------------------------------------------------------------------
labels = st.dictionaries(st.sampled_from(["host", "gpu", "rack", "cluster", "sku"]),
                         st.text(min_size=1, max_size=12), max_size=5)  # fmt: skip
samples = st.lists(
    st.tuples(st.integers(-(2**62), 2**62), st.floats(allow_nan=False)), min_size=1, max_size=5
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(labels, samples), min_size=1, max_size=4))
def test_requests_are_what_the_library_builds_from_the_proto(series: list) -> None:
    wanted = {SeriesKey("gpu_power_watts", lab): s for lab, s in series}
    reference = remote_write.WriteRequest()
    for key, pairs in wanted.items():
        ts = reference.timeseries.add()
        for name, value in sorted([("__name__", key.metric), *key.labels]):
            ts.labels.add(name=name, value=value)
        for t, v in pairs:
            ts.samples.add(value=v, timestamp=t)
    ours = remote_write.WriteRequest.FromString(remote_write.encode(wanted))
    assert ours == reference


def test_the_narrowest_selector_covers_every_series_and_little_else() -> None:
    keys = [*gpu_keys("c"), SeriesKey("gpu_power_watts", {"host": "n9"})]
    shown = [str(m) for m in narrowing(keys)]
    assert shown == ['__name__="gpu_power_watts"', 'host=~"n0|n1|n2|n9"']
    assert all(m.matches(k.label_dict.get(m.label, k.metric)) for m in narrowing(keys)[1:]
               for k in keys)  # fmt: skip


# -- against the real engines ----------------------------------------------------------------
def test_every_sample_written_is_in_the_engine_and_reads_back(
    engine: EngineProcess, tmp_path: Path
) -> None:
    store = remote_store(tmp_path, engine.write_url, engine.url)
    tag = f"w{time.time_ns()}"
    keys = gpu_keys(tag)
    now = int(time.time()) * 1000
    batch = [Sample(k, now - 60_000 + i * 1000, float(i + j)) for i in range(60)
             for j, k in enumerate(keys)]  # fmt: skip
    result = store.write(batch)
    assert (result.accepted, result.rejected_total) == (len(batch), 0)
    selector = f'gpu_power_watts{{cluster="{tag}"}}'
    eventually(lambda: engine_count(engine, selector) == len(batch), "every sample counted")

    answer = store.range_query(parse_selector(f"gpu_power_watts{{cluster={tag},host=n1}}"),
                               (now - 60_000) / 1000, now / 1000 + 1, 1.0)  # fmt: skip
    assert answer.tier == "raw" and len(answer.series) == 2
    by_gpu = {s.series.label("gpu"): s.points for s in answer.series}
    assert [p.value for p in by_gpu["1"]] == [float(i + 3) for i in range(60)]

    latest = store.latest(parse_selector(f"gpu_power_watts{{cluster={tag}}}"))
    assert sorted((v.series.label("host"), v.series.label("gpu"), v.timestamp, v.value)
                  for v in latest)[0] == ("n0", "0", now / 1000 - 1, 59.0)  # fmt: skip
    name = Matcher.of("cluster", "=", tag)
    assert len(store.label_sets([name], now - 10_000, now)) == len(keys)

    store.watch(["gpu_power_watts"], wants=lambda k: k.label("cluster") == tag)
    cursor, block = store.read_new(None, now - 120_000)
    assert len(block) == len(batch)
    assert list(block.timestamps_ms) == sorted(block.timestamps_ms)
    # Read by time: from a later instant, only what was written after it.
    later = int(time.time() * 1000) + 1000
    store.write([Sample(k, later, 1.0) for k in keys])
    got = eventually(lambda: len(store.read_new(cursor, later)[1]), "the next samples")
    assert got == len(keys)
    store.close()


def test_bad_samples_are_judged_here_and_never_sent(engine: EngineProcess, tmp_path: Path) -> None:
    store = remote_store(tmp_path, engine.write_url, engine.url)
    now = int(time.time()) * 1000
    key = gpu_keys(f"b{time.time_ns()}")[0]
    result = store.write([Sample(key, now, math.nan), Sample(SeriesKey("no_such_metric"), now, 1.0),
                          Sample(key, now + 3_600_000, 1.0), Sample(key, now, 2.0)])  # fmt: skip
    assert result.accepted == 1
    assert dict(result.rejected) == {"non_finite": 1, "unknown_metric": 1, "future": 1}
    store.close()


def test_a_refusal_is_counted_once_and_never_retried(tmp_path: Path) -> None:
    """Prometheus refuses out-of-order samples with a 400: dropped, counted, not spooled."""
    with start_engine("prometheus", tmp_path / "prom") as prom:
        store = remote_store(tmp_path, prom.write_url, prom.url)
        key = gpu_keys(f"o{time.time_ns()}")[0]
        now = int(time.time()) * 1000
        assert store.write([Sample(key, now, 1.0)]).accepted == 1
        writer = SpoolingWriter(store.write, Spool(tmp_path / "spool", 2**20))
        done = writer.write([Sample(key, now - 5_000, 2.0)])  # older than what it holds
        assert (done.accepted, done.rejected, done.spooled) == (0, 1, 0)
        assert "out of order" in writer.last_result.errors[0]
        assert not writer.spool.pending()
        store.close()


class _Answering(BaseHTTPRequestHandler):
    status = 503
    seen: list[int] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append(self.status)
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(b"overloaded")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("status", [503, 429])
def test_a_5xx_or_429_is_retryable(status: int, tmp_path: Path) -> None:
    handler = type("H", (_Answering,), {"status": status, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        store = remote_store(tmp_path, url + "/api/v1/write", url)
        with pytest.raises(StoreUnavailable, match=f"HTTP {status}: overloaded"):
            store.write([Sample(gpu_keys("x")[0], int(time.time() * 1000), 1.0)])
        assert handler.seen == [status]
        store.close()
    finally:
        server.shutdown()


def test_nothing_scraped_is_lost_while_the_receiver_is_down(tmp_path: Path) -> None:
    """VictoriaMetrics stopped: batches spool, with backoff; restarted on the same data and
    port: the spool replays in order and the engine counts every sample once."""
    folder = tmp_path / "vm"
    vm = start_engine("victoria-metrics", folder)
    port = vm.port
    store = remote_store(tmp_path, vm.write_url, vm.url, retry_min_seconds=0.1)
    writer = SpoolingWriter(store.write, Spool(tmp_path / "spool", 2**24), 0.1, 0.4)
    keys = gpu_keys(f"d{time.time_ns()}")
    start = int(time.time()) * 1000 - 100_000
    rounds = [[Sample(k, start + i * 1000, float(i)) for k in keys] for i in range(30)]
    for batch in rounds[:10]:
        assert writer.write(batch).accepted == len(keys)
    vm.stop()
    spooled = sum(writer.write(batch).spooled for batch in rounds[10:20])
    assert spooled == 10 * len(keys)
    vm = start_engine("victoria-metrics", folder, port=port)  # the same data, the same port
    try:
        for batch in rounds[20:]:
            writer.write(batch)  # spooled behind the others until a retry gets through
        eventually(lambda: writer.write([]) and not writer.spool.pending(), "the spool drained")
        selector = f'gpu_power_watts{{cluster="{keys[0].label("cluster")}"}}'
        eventually(lambda: engine_count(vm, selector) == 30 * len(keys), "every sample once")
    finally:
        store.close()
        vm.stop()


def test_the_prometheus_api_and_federate_answer_from_the_engine(
    engine: EngineProcess, tmp_path: Path
) -> None:
    """``/prometheus`` evaluates over samples read back from the engine; ``/federate`` gives
    their newest values; tiers are refused in one line (the engine has them or not)."""
    from fastapi.testclient import TestClient

    from hbmwatch.api.main import create_app

    store = remote_store(tmp_path, engine.write_url, engine.url)
    tag = f"p{time.time_ns()}"
    keys = gpu_keys(tag)
    now = int(time.time()) * 1000
    store.write([Sample(k, now - 30_000 + i * 1000, float(i * j)) for i in range(31)
                 for j, k in enumerate(keys)])  # fmt: skip
    selector = f'gpu_power_watts{{cluster="{tag}"}}'
    eventually(lambda: engine_count(engine, selector) == 31 * len(keys), "samples in the engine")
    settings = load_settings(store=store.settings.model_dump())
    with TestClient(create_app(settings, store)) as client:
        params = {"query": f"sum(max_over_time({selector}[1m]))", "time": now / 1000}
        body = client.get("/prometheus/api/v1/query", params=params).json()
        assert body["data"]["result"][0]["value"][1] == str(30 * sum(range(len(keys))))
        asked = client.get("/prometheus/api/v1/query", params={**params, "resolution": "1m"})
        assert asked.status_code == 400 and "remote engine" in asked.json()["error"]
        page = client.get("/federate", params={"match[]": selector}).text
        assert page.count(f'cluster="{tag}"') == len(keys)
    store.close()


def test_a_reader_with_a_fresh_registry_learns_the_series_from_the_engine(
    engine: EngineProcess, tmp_path: Path
) -> None:
    """A detector process over a store of its own reads what another process wrote."""
    writer = remote_store(tmp_path / "writer", engine.write_url, engine.url)
    reader = remote_store(tmp_path / "reader", engine.write_url, engine.url)
    tag = f"f{time.time_ns()}"
    now = int(time.time()) * 1000
    writer.write([Sample(k, now - 1000, 1.0) for k in gpu_keys(tag)])
    reader.watch(["gpu_power_watts"], wants=lambda k: k.label("cluster") == tag)
    block = eventually(lambda: len(reader.read_new(None, now - 60_000)[1]), "the writer's samples")
    assert block == len(gpu_keys(tag))
    writer.close()
    reader.close()
