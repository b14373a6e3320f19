"""NVML in-process (nvidia-ml-py), for hosts without dcgm-exporter.

Reads memory temperature (field 82), GPU temperature, power and its limit, energy, SM and
memory clocks, the clocks-event reasons and their residency counters, PCIe counters (which
wrap at 2^32), GPM DRAM-bandwidth utilisation where the device supports GPM (Hopper),
NVLink data counters per active link, utilisation, memory and ECC; XID events, row
remapping and retired pages through ``nvml_errors``.  The ``pynvml`` module is
passed in, so tests run against a stand-in and the same code runs on a real GPU.  A reading
the device does not support is dropped, counted, and not asked for again; ``unsupported``
lists them by name.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import Any

from hbmwatch.collector.sources.nvml_errors import NvmlErrors
from hbmwatch.collector.spellings import dcgm as dcgm_spelling
from hbmwatch.collector.spellings import nvml as spelling
from hbmwatch.collector.translate import Collected, device_for
from hbmwatch.records import Device, SeriesKey


def import_pynvml() -> Any:
    from hbmwatch.collector.sources.amdsmi import SourceUnavailable

    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        raise SourceUnavailable(
            "nvidia-ml-py is not installed (pip install 'hbmwatch[nvidia]')"
        ) from None
    return pynvml


class NvmlCollector:
    kind = "nvml"

    def __init__(
        self, nvml: Any, static_labels: Mapping[str, str] | None = None, *, host: str | None = None
    ) -> None:
        self.nvml = nvml
        self.static = dict(static_labels or {})
        self.host = self.static.get("host") or host or socket.gethostname()
        self.unsupported: dict[str, set[str]] = {}
        self._devices: list[tuple[Any, Device]] = []
        self._gpm: dict[int, Any] = {}
        self._links: dict[int, list[int]] = {}
        self._errors = NvmlErrors(nvml, self._try)

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        n = self.nvml
        n.nvmlInit()
        driver = _text(n.nvmlSystemGetDriverVersion())
        for index in range(n.nvmlDeviceGetCount()):
            self._open_device(index, n.nvmlDeviceGetHandleByIndex(index), driver)
        self._errors.open(self._devices)

    def _open_device(self, index: int, handle: Any, driver: str) -> None:
        n, gpu = self.nvml, str(index)
        serial = self._try(gpu, "serial", lambda: _text(n.nvmlDeviceGetSerial(handle)))
        device = device_for(
            self.static,
            host=self.host,
            gpu=gpu,
            vendor="nvidia",
            model=_text(n.nvmlDeviceGetName(handle)),
            uuid=_text(n.nvmlDeviceGetUUID(handle)).removeprefix("GPU-"),
            serial=serial or "",
            driver=driver,
        )
        self._devices.append((handle, device))
        self._links[index] = [
            link
            for link in range(spelling.NVLINK_LINKS)
            if self._try(
                gpu,
                f"nvlink{link}_state",
                lambda link=link: n.nvmlDeviceGetNvLinkState(handle, link),
                quiet=True,
            )
            == 1
        ]
        support = self._try(gpu, "gpm", lambda: n.nvmlGpmQueryDeviceSupport(handle))
        if support is not None and getattr(support, "isSupportedDevice", 0):
            self._gpm[index] = None

    def close(self) -> None:
        self._errors.close()
        self.nvml.nvmlShutdown()

    @property
    def devices(self) -> list[Device]:
        return [d for _, d in self._devices]

    # -- helpers ----------------------------------------------------------------------------
    def _try(self, gpu: str, what: str, call: Callable[[], Any], quiet: bool = False) -> Any:
        """Call NVML; a NotSupported reading is remembered and not asked for again."""
        skip = self.unsupported.setdefault(gpu, set())
        if what in skip:
            return None
        try:
            return call()
        except self.nvml.NVMLError as exc:
            not_supported = getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
            if not quiet and getattr(exc, "value", None) == not_supported:
                skip.add(what)  # other errors may pass: ask again next time
            return None

    # -- one collection ---------------------------------------------------------------------
    def collect(self, ts_ms: int) -> Collected:
        out = Collected()
        for index, (handle, device) in enumerate(self._devices):
            out.devices[device.identity] = device
            self._device(out, index, handle, device.labels(), ts_ms)
            self._errors.device(out, str(index), handle, device.labels(), ts_ms)
        self._errors.poll(out, ts_ms)
        return out

    def _device(
        self, out: Collected, index: int, h: Any, labels: dict[str, str], ts_ms: int
    ) -> None:
        n, gpu = self.nvml, str(index)

        def add(metric: str, value: float | None, **extra: str) -> None:
            if value is None:
                out.drop("unsupported")
            else:
                out.add(SeriesKey(metric, {**labels, **extra}), ts_ms, float(value))

        temp = self._try(
            gpu, "temperature_gpu", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
        )
        add("gpu_hotspot_temperature_celsius", temp)
        power = self._try(gpu, "power_usage", lambda: n.nvmlDeviceGetPowerUsage(h))
        add("gpu_power_watts", None if power is None else power / 1000)
        limit = self._try(gpu, "enforced_power_limit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h))
        add("gpu_power_limit_watts", None if limit is None else limit / 1000)
        for domain, clock in (("compute", "NVML_CLOCK_SM"), ("memory", "NVML_CLOCK_MEM")):
            mhz = self._try(
                gpu, f"clock_{domain}", lambda c=clock: n.nvmlDeviceGetClockInfo(h, getattr(n, c))
            )
            add("gpu_clock_hertz", None if mhz is None else mhz * 1e6, domain=domain)
        util = self._try(gpu, "utilization", lambda: n.nvmlDeviceGetUtilizationRates(h))
        add("gpu_utilization_ratio", None if util is None else util.gpu / 100)
        memory = self._try(gpu, "memory_info", lambda: n.nvmlDeviceGetMemoryInfo(h))
        if memory is not None:
            add("gpu_memory_used_bytes", memory.used)
            add("gpu_memory_total_bytes", memory.total)
        width = self._try(gpu, "pcie_link_width", lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h))
        add("gpu_pcie_link_width_lanes", width)
        for severity, kind in (
            ("correctable", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
            ("uncorrectable", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        ):
            count = self._try(
                gpu,
                f"ecc_{severity}",
                lambda k=kind: n.nvmlDeviceGetTotalEccErrors(h, getattr(n, k), n.NVML_VOLATILE_ECC),
            )
            add("gpu_ecc_errors_total", count, severity=severity)
        self._reasons(out, gpu, h, labels, ts_ms)
        self._fields(out, gpu, h, labels, ts_ms)
        bandwidth = self._gpm_dram(index, h)
        if bandwidth is None and util is not None:
            bandwidth = util.memory / 100  # memory-controller busy time, when GPM is absent
        add("gpu_memory_bandwidth_utilization_ratio", bandwidth)

    def _reasons(
        self, out: Collected, gpu: str, h: Any, labels: dict[str, str], ts_ms: int
    ) -> None:
        n = self.nvml
        getter = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        bits = self._try(gpu, "clocks_event_reasons", lambda: getter(h))
        if bits is None:
            out.drop("unsupported")
            return
        for bit, reason in dcgm_spelling.THROTTLE_BITS.items():  # NVML's bits, as DCGM's
            out.add(
                SeriesKey("gpu_throttle_active", {**labels, "reason": reason}),
                ts_ms,
                1.0 if bits & bit else 0.0,
            )

    def _fields(self, out: Collected, gpu: str, h: Any, labels: dict[str, str], ts_ms: int) -> None:
        skip = self.unsupported.setdefault(gpu, set())
        ids = [f for f, spec in spelling.FIELDS.items() if spec[0] not in skip]
        requests: list[Any] = list(ids)
        for link in self._links.get(int(gpu), []):
            requests += [
                (f, link) for f, (name, _) in spelling.NVLINK_FIELDS.items() if name not in skip
            ]
        if not requests:
            return
        values = self._try(
            gpu, "field_values", lambda: self.nvml.nvmlDeviceGetFieldValues(h, requests)
        )
        if values is None:
            out.drop("unsupported", len(requests))
            return
        for request, value in zip(requests, values, strict=False):
            field, link = request if isinstance(request, tuple) else (request, None)
            if link is None:
                name, metric, extra, factor = spelling.FIELDS[field]
            else:
                name, direction = spelling.NVLINK_FIELDS[field]
                metric, extra, factor = (
                    "gpu_fabric_bytes_total",
                    {"fabric": "nvlink", "link": str(link), "direction": direction},
                    1024.0,
                )
            if getattr(value, "nvmlReturn", 0) != 0:
                if link is None:
                    skip.add(name)
                out.drop("unsupported")
                continue
            member = spelling.VALUE_MEMBERS.get(getattr(value, "valueType", 0), "dVal")
            raw = getattr(value.value, member)
            out.add(SeriesKey(metric, {**labels, **extra}), ts_ms, float(raw) * factor)

    def _gpm_dram(self, index: int, h: Any) -> float | None:
        """DRAM bandwidth utilisation between this and the previous GPM sample (Hopper)."""
        if index not in self._gpm:
            return None
        n = self.nvml
        try:
            sample = n.nvmlGpmSampleAlloc()
            n.nvmlGpmSampleGet(h, sample)
            previous, self._gpm[index] = self._gpm[index], sample
            if previous is None:
                return None
            metrics = n.c_nvmlGpmMetricsGet_t()
            metrics.version = n.NVML_GPM_METRICS_GET_VERSION
            metrics.numMetrics = 1
            metrics.sample1 = previous
            metrics.sample2 = sample
            metrics.metrics[0].metricId = n.NVML_GPM_METRIC_DRAM_BW_UTIL
            n.nvmlGpmMetricsGet(metrics)
            n.nvmlGpmSampleFree(previous)
            return float(metrics.metrics[0].value) / 100
        except n.NVMLError:
            self._gpm.pop(index, None)
            self.unsupported.setdefault(str(index), set()).add("gpm_dram_bw_util")
            return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
