"""The ``prometheus`` source on hand-written federate pages: routing by name to the
scraping collector's translators, Prometheus' timestamps, re-reads, identity, health."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hbmwatch.collector.scrape import translator_for
from hbmwatch.collector.sources.dcgm import DcgmTranslator
from hbmwatch.collector.sources.dme import DmeTranslator
from hbmwatch.collector.sources.federated import FederatedTranslator, selectors
from hbmwatch.collector.targets import resolve
from hbmwatch.settings import CollectorSettings, TargetSettings

T0 = 1_700_000_000_000
DCGM = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",Hostname="n1"%s} 55'
DME = 'gpu_package_power{gpu_id="1",serial_number="S1",card_model="MI300X"%s} 410.5'
PROM = ',job="dcgm",instance="10.0.0.1:9400",cluster="c1",rack="r1"'
PROM_DME = ',job="amd",instance="10.0.0.2:5000"'


def page(ts: int, temp: float = 55.0) -> str:
    return "\n".join(
        [
            "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
            (DCGM % PROM).replace(" 55", f" {temp}") + f" {ts}",
            (DME % PROM_DME) + f" {ts + 500}",
            'DCGM_FI_DEV_SOMETHING_NEW{gpu="0",job="dcgm",instance="10.0.0.1:9400"} 1 ' + str(ts),
            f'up{{job="dcgm",instance="10.0.0.1:9400"}} 1 {ts}',
            f'up{{job="node",instance="10.0.0.9:9100"}} 1 {ts}',
        ]
    )


def test_each_series_goes_to_its_exporters_translator_at_its_own_time() -> None:
    got = FederatedTranslator().translate_text(page(T0), 0)
    direct_dcgm = DcgmTranslator({"cluster": "c1", "rack": "r1", "host": "n1"})
    direct_dme = DmeTranslator({"host": "10.0.0.2"})  # no Hostname: the instance's host
    want = (
        direct_dcgm.translate_text(DCGM % ',cluster="c1",rack="r1"', T0).samples
        + direct_dme.translate_text(DME % "", T0 + 500).samples
    )
    vendor = [s for s in got.samples if s.series.metric != "hbmwatch_target_up"]
    assert sorted(vendor, key=str) == sorted(want, key=str) and want
    assert got.dropped["unmapped"] == 1  # a field no table knows: asked for, never sent
    assert {d.host for d in got.devices.values()} == {"n1", "10.0.0.2"}


def test_an_unchanged_series_is_taken_once() -> None:
    translator = FederatedTranslator()
    first = translator.translate_text(page(T0), 0)
    assert first.samples
    assert translator.translate_text(page(T0), 0).samples == []
    later = translator.translate_text(page(T0 + 1000, temp=57.0), 0)
    assert {s.timestamp_ms for s in later.samples} == {T0 + 1000, T0 + 1500}
    assert 57.0 in [s.value for s in later.samples]


def test_the_up_of_a_known_exporter_becomes_its_health() -> None:
    got = FederatedTranslator().translate_text(page(T0), 0)
    health = [s for s in got.samples if s.series.metric == "hbmwatch_target_up"]
    assert len(health) == 1  # the node exporter's up is no exporter of ours
    labels = dict(health[0].series.labels)
    assert labels == {
        "cluster": "c1", "rack": "r1", "host": "n1",
        "target": "dcgm/10.0.0.1:9400", "source": "dcgm",
    }  # fmt: skip
    assert (health[0].timestamp_ms, health[0].value) == (T0, 1.0)


def test_a_host_label_and_the_targets_cluster() -> None:
    line = DME % f'{PROM_DME},node="gpu-node-7"' + f" {T0}"
    translator = FederatedTranslator({"cluster": "prod"}, host_label="node")
    got = translator.translate_text(line, 0)
    assert {(d.host, d.cluster) for d in got.devices.values()} == {("gpu-node-7", "prod")}


def test_settings_and_selectors() -> None:
    entry = TargetSettings(kind="prometheus", url="http://prom:9090", sources=["dcgm"])
    target = resolve(entry, CollectorSettings())
    translator = translator_for(target, CollectorSettings())
    assert isinstance(translator, FederatedTranslator)
    url, params = translator.request(target.url)
    assert url == "http://prom:9090/federate"
    assert [v for _, v in params] == [*selectors(["dcgm"])[:1], "up"]
    with pytest.raises(ValidationError, match="for kind = prometheus only"):
        TargetSettings(kind="dcgm", url="http://n1:9400/metrics", host_label="node")
    with pytest.raises(ValidationError):
        TargetSettings(kind="prometheus", url="http://p:9090", sources=["nvml"])  # type: ignore[list-item]
