"""``/federate`` (and ``api.expose_canonical_series`` on ``/metrics``): canonical series for a
Prometheus that scrapes hbmwatch, checked with prometheus_client's parser and with a real
Prometheus 2.42 scraping a running app."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from hbmwatch.api.main import create_app
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.store.store import Store
from tests.conftest import Clock, make_store
from tests.test_api import READ, bearer, settings_for
from tests.test_service import free_port

POWER, ENERGY, REQS = "gpu_power_watts", "gpu_energy_joules_total", "workload_requests_total"
ODD_POD = 'pod "a"\\b\nc'  # every character the text format escapes
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def device(host: str, g: int) -> dict[str, str]:
    return {"cluster": "c0", "rack": "r0", "host": host, "gpu": str(g), "sku": "MI300X"}


def fill(store: Store, now_ms: int) -> dict[str, float]:
    """Four GPUs' power and energy over the last minute, and one odd workload series; the
    newest value of each series by its text."""
    samples, newest = [], {}
    for h in ("n1", "n2"):
        for g in (0, 1):
            power = SeriesKey(POWER, device(h, g))
            energy = SeriesKey(ENERGY, device(h, g))
            for i in range(60):
                ts = now_ms - (59 - i) * 1000
                samples += [Sample(power, ts, 300.0 + g + i / 7), Sample(energy, ts, 1e6 + i)]
            newest[power.text], newest[energy.text] = 300.0 + g + 59 / 7, 1e6 + 59
    reqs = SeriesKey(REQS, {"service": "llm", "phase": "e2e", "pod": ODD_POD, "host": "n1"})
    samples.append(Sample(reqs, now_ms - 2000, 42.0))
    newest[reqs.text] = 42.0
    assert store.write(samples).accepted == len(samples)
    return newest


def parsed(text: str) -> tuple[dict[str, str], dict[str, tuple[float, float | None]]]:
    """Family types and samples (value, timestamp in s) by series text, as a client reads them."""
    types, values = {}, {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            types[s.name] = family.type
            values[SeriesKey(s.name, s.labels).text] = (s.value, s.timestamp)
    return types, values


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(store, federate_max_series=5), store)) as c:
        yield c


def test_newest_sample_of_each_series_with_types_and_timestamps(
    client: TestClient, store: Store, clock: Clock
) -> None:
    now_ms = int(clock() * 1000)
    newest = fill(store, now_ms)
    stale = SeriesKey(POWER, device("n9", 0))  # nothing within the 5-minute lookback
    assert store.write([Sample(stale, now_ms - 301_000, 1.0)]).accepted == 1
    r = client.get("/federate", params={"match[]": [f'{POWER}{{host="n1"}}', REQS]})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    types, values = parsed(r.text)
    assert types == {POWER: "gauge", REQS: "counter"}
    want = {k: v for k, v in newest.items() if k.startswith(REQS) or 'host="n1"' in k}
    want = {k: v for k, v in want.items() if not k.startswith(ENERGY)}
    assert {k: v[0] for k, v in values.items()} == want
    assert values[SeriesKey(POWER, device("n1", 0)).text][1] == now_ms / 1000
    assert values[next(k for k in values if k.startswith(REQS))][1] == (now_ms - 2000) / 1000
    assert "# TYPE gpu_power_watts gauge\n" in r.text
    assert 'pod="pod \\"a\\"\\\\b\\nc"' in r.text  # escaped, and read back by the parser above


def test_name_matchers_union_and_label_order(
    client: TestClient, store: Store, clock: Clock
) -> None:
    fill(store, int(clock() * 1000))
    matches = ['{__name__=~"gpu_(power|energy).*",host="n2"}', f"{POWER}{{gpu='0'}}"]
    r = client.get("/federate", params={"match[]": matches})
    assert r.status_code == 200, r.text
    _, values = parsed(r.text)
    assert len(values) == 5  # n2's four series, and n1's gpu 0 power (n2's counted once)
    lines = [line for line in r.text.splitlines() if not line.startswith("#")]
    assert [line.split("{")[0] for line in lines] == [ENERGY] * 2 + [POWER] * 3
    for line in lines:
        body = line[line.index("{") + 1 : line.index("}")]
        names = [pair.split("=")[0] for pair in body.split(",")]
        assert names == sorted(names)


def test_bad_selectors_and_no_selector_are_400(client: TestClient) -> None:
    bad = ('gpu_power_watts{host=~"(?=n)"}', "not a selector{", '{host=""}', "{}",
           "rate(gpu_energy_joules_total[5m])", "gpu_power_watts offset 5m")  # fmt: skip
    for text in bad:
        r = client.get("/federate", params={"match[]": [POWER, text]})
        assert r.status_code == 400, (text, r.text)
        assert r.text.endswith("\n") and r.text.count("\n") == 1 and text[:10] in r.text
    r = client.get("/federate")
    assert r.status_code == 400 and "match[]" in r.text


def test_over_the_cap_is_a_422_naming_the_setting(
    client: TestClient, store: Store, clock: Clock
) -> None:
    fill(store, int(clock() * 1000))  # 9 series; the fixture's cap is 5
    r = client.get("/federate", params={"match[]": '{__name__=~"gpu_.*"}'})
    assert r.status_code == 422
    assert "api.federate_max_series" in r.text and r.text.count("\n") == 1
    assert client.get("/federate", params={"match[]": POWER}).status_code == 200  # 4 series


def test_reads_need_the_read_scope(store: Store, clock: Clock) -> None:
    fill(store, int(clock() * 1000))
    app = create_app(settings_for(store, open_reads=False), store)
    with TestClient(app) as c:
        assert c.get("/federate", params={"match[]": POWER}).status_code == 401
        r = c.get("/federate", params={"match[]": POWER}, headers=bearer(READ))
        assert r.status_code == 200 and len(parsed(r.text)[1]) == 4


def test_metrics_exposes_canonical_series_only_when_asked(store: Store, clock: Clock) -> None:
    newest = fill(store, int(clock() * 1000))
    with TestClient(create_app(settings_for(store), store)) as c:
        assert POWER not in c.get("/metrics").text
    app = create_app(settings_for(store, expose_canonical_series=True), store)
    with TestClient(app) as c:
        text = c.get("/metrics").text
    types, values = parsed(text)
    assert {k: v[0] for k, v in values.items() if k in newest} == newest
    assert types[POWER] == "gauge" and "# TYPE hbmwatch_detection_lag_seconds gauge" in text
    capped = create_app(
        settings_for(store, expose_canonical_series=True, federate_max_series=3), store
    )
    with TestClient(capped) as c:
        r = c.get("/metrics")
    assert r.status_code == 422 and "api.federate_max_series" in r.text


# -- a real Prometheus scraping a running app --------------------------------------------------
class Served:
    """The app under uvicorn on a free port, in a thread of this process."""

    def __init__(self, store: Store) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            create_app(settings_for(store), store), host="127.0.0.1", port=self.port,
            log_level="warning", lifespan="off",
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        wait_for(lambda: self.server.started, "uvicorn to start")
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def wait_for(condition, what: str, deadline_s: float = 120.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if result := condition():
                return result
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def prometheus_scraping(
    tmp: Path, app_port: int, matches: list[str]
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    quoted = ", ".join(f"'{m}'" for m in matches)
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: hbmwatch\n"
        "    honor_labels: true\n"
        "    metrics_path: /federate\n"
        f"    params: {{'match[]': [{quoted}]}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{app_port}']}}]\n"
    )
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.slow
@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="needs the prometheus binary")
def test_a_real_prometheus_holds_the_canonical_series(tmp_path: Path) -> None:
    store = make_store(f"sqlite:///{tmp_path / 'hbmwatch.db'}", time.time)  # type: ignore[arg-type]
    newest = fill(store, int(time.time() * 1000))
    with Served(store) as served:
        proc, prom = prometheus_scraping(tmp_path, served.port, ['{__name__=~"gpu_.*"}', REQS])
        try:
            wait_for(lambda: httpx.get(f"{prom}/-/ready").status_code == 200, "prometheus ready")
            q = f"{prom}/api/v1/query"

            def held() -> list[dict]:
                result = httpx.get(q, params={"query": '{__name__=~"gpu_.*|workload_.*"}'})
                found = result.json()["data"]["result"]
                return found if len(found) == len(newest) else []

            result = wait_for(held, "prometheus to scrape /federate")
            meta = httpx.get(f"{prom}/api/v1/metadata").json()["data"]
        finally:
            proc.terminate()
            proc.wait(60)
    store.close()
    got = {}
    for series in result:
        labels = dict(series["metric"])
        assert labels.pop("job") == "hbmwatch" and labels.pop("instance")
        got[SeriesKey(labels.pop("__name__"), labels).text] = float(series["value"][1])
    assert got == newest  # same names, labels (the odd pod included) and values
    assert meta[ENERGY][0]["type"] == "counter" and meta[POWER][0]["type"] == "gauge"
