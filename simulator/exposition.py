"""Pages in the real exporters' formats, written with the collector's own spelling tables.

AMD nodes get a Device Metrics Exporter page (current names, lower-case mandatory labels,
every family typed gauge, accumulators included; in CPX the physical sensors only on
partition 0); NVIDIA nodes a dcgm-exporter page (old or DCGM 4.6 field names, ``Hostname``
or ``hostname``, the not-supported sentinel where a sensor drops out); each inference
service a vLLM page; each training job a step-time histogram.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from hbmwatch.collector.spellings import Family, dcgm, dme, vllm
from hbmwatch.simulator.error_pages import dcgm_error_families, dme_error_families
from hbmwatch.simulator.fleet import Fleet, Node
from hbmwatch.simulator.physics import Physics, R
from hbmwatch.simulator.workloads import Workloads

if TYPE_CHECKING:
    from hbmwatch.simulator.errors import GpuErrors
    from hbmwatch.simulator.pods import Placement

SENSOR_NOISE_C = 0.3  # read noise before the sensor rounds to whole degrees

Readings = dict[str, np.ndarray]
#: DME temperature families and the dropout column (0 memory, 1 hotspot) that hides them.
DME_SENSORS = {"gpu_memory_temperature": 0, "gpu_hbm_temperature": 0, "gpu_junction_temperature": 1}


def fmt(value: float) -> str:
    """Numbers as exporters print them: integers bare, floats in full precision.

    >>> fmt(45.0), fmt(8.969), fmt(2.5e18)
    ('45', '8.969', '2.5e+18')
    """
    if isinstance(value, int):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def _blanked(rows: list[tuple[str, float]], blank: list[bool] | None) -> list[tuple[str, float]]:
    """A node's rows (one per GPU, in order) with blank GPUs' values as DCGM's sentinel."""
    if blank is None:
        return rows
    return [(lab, dcgm.NOT_SUPPORTED if b else v) for (lab, v), b in zip(rows, blank, strict=True)]


class Exposition:
    """Renders pages from the simulation's current state."""

    def __init__(
        self,
        fleet: Fleet,
        physics: Physics,
        workloads: Workloads,
        errors: GpuErrors | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.fleet = fleet
        self.physics = physics
        self.workloads = workloads
        #: GPU errors and pods (simulator/errors.py, pods.py): only scenarios with either
        #: write their lines, so every other scenario's pages stay byte for byte the same.
        self.errors = errors if errors is not None and errors.enabled else None
        self.placement = placement
        self._dme_labels = {
            g.index: self._dme_label_sets(g.index)
            for g in fleet.gpus
            if fleet.nodes[g.node].exporter == "dme"
        }
        self._dcgm_labels = {
            g.index: self._dcgm_label_set(g.index)
            for g in fleet.gpus
            if fleet.nodes[g.node].exporter == "dcgm"
        }

    # -- labels ---------------------------------------------------------------------------
    def _dme_label_sets(self, gpu: int) -> list[str]:
        g = self.fleet.gpus[gpu]
        d = g.device
        out = []
        pods = self.pod_pairs(gpu, "dme")
        for p in range(g.partitions):
            pairs = [
                ("card_model", f"AMD Instinct {g.sku.name}"),
                ("gpu_compute_partition_type", d.compute_partition),
                ("gpu_id", str(int(d.gpu) * g.partitions + p)),
                ("gpu_memory_partition_type", d.memory_partition),
                ("gpu_partition_id", str(p)),
                ("gpu_uuid", d.uuid),
                ("hostname", d.host),
                ("serial_number", d.serial),
            ]
            out.append(_labels(sorted(pairs + pods) if pods else pairs))
        return out

    def pod_pairs(self, gpu: int, exporter: str) -> list[tuple[str, str]]:
        """The pod labels the exporter puts on a GPU's lines (none without a pod)."""
        return self.placement.pod_labels(gpu, exporter) if self.placement is not None else []

    def relabel(self, gpus: Iterable[int]) -> None:
        """Rebuild the label sets of GPUs whose pods changed."""
        for g in gpus:
            if g in self._dme_labels:
                self._dme_labels[g] = self._dme_label_sets(g)
            else:
                self._dcgm_labels[g] = self._dcgm_label_set(g)

    def dcgm_pairs(self, gpu: int) -> list[tuple[str, str]]:
        """A GPU's dcgm-exporter identity labels, in the exporter's order."""
        g = self.fleet.gpus[gpu]
        d = g.device
        node = self.fleet.nodes[g.node]
        host_label = "Hostname" if node.dcgm_names == "old" else "hostname"
        pairs = [
            ("gpu", d.gpu),
            ("UUID", f"GPU-{d.uuid}"),
            ("pci_bus_id", f"00000000:{0x18 + 0x10 * int(d.gpu):02X}:00.0"),
            ("device", f"nvidia{d.gpu}"),
            ("modelName", f"NVIDIA {g.sku.name}"),
            (host_label, d.host),
            ("DCGM_FI_DRIVER_VERSION", d.driver),
        ]
        return pairs

    def _dcgm_label_set(self, gpu: int) -> str:
        return _labels(self.dcgm_pairs(gpu) + self.pod_pairs(gpu, "dcgm"))

    # -- readings -------------------------------------------------------------------------
    def readings(self, held: Readings | None = None) -> Readings:
        """Canonical values per GPU, rounded as the sensors round them."""
        p = self.physics
        noise, sd = p.sensor_rng.normal, SENSOR_NOISE_C * self.fleet.scenario.noise
        stacks = p.stack_temp + noise(0, sd, p.stack_temp.shape)
        hotspot = p.hot_temp + noise(0, sd, p.hot_temp.shape)
        r = {
            "gpu_hotspot_temperature_celsius": np.round(hotspot),
            "gpu_memory_temperature_celsius": np.round(np.nanmax(stacks, axis=1)),
            "stack": np.round(stacks),
            "gpu_power_watts": np.round(p.power, 3),
            "gpu_power_limit_watts": np.round(p.power_limit),
            "gpu_energy_joules_total": np.floor(p.energy_j * 1000) / 1000,
            "gpu_utilization_ratio": np.round(p.util_compute, 2),
            "gpu_memory_bandwidth_utilization_ratio": np.round(p.util_memory, 4),
            "compute_mhz": p.compute_clock_mhz(),
            "memory_mhz": p.memory_clock_mhz(),
            "gpu_memory_used_bytes": np.round(p.memory_used / 2**20) * 2**20,
            "gpu_memory_total_bytes": np.round(p.memory_total / 2**20) * 2**20,
        }
        if held:
            r.update(held)
        return r

    # -- pages ----------------------------------------------------------------------------
    def node_page(self, node: Node, readings: Readings, dropout: np.ndarray) -> str:
        if node.exporter == "dme":
            return self._dme_page(node, readings, dropout)
        return self._dcgm_page(node, readings, dropout)

    def _family(
        self, out: list[str], name: str, help: str, kind: str, rows: list[tuple[str, float]]
    ) -> None:
        if not rows:
            return
        out.append(f"# HELP {name} {help}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{{{labels}}} {fmt(value)}" for labels, value in rows)

    def _dme_page(self, node: Node, rd: Readings, dropout: np.ndarray) -> str:
        p = self.physics
        out: list[str] = [
            "# HELP gpu_nodes_total Number of GPU nodes on the machine",
            "# TYPE gpu_nodes_total gauge",
            f"gpu_nodes_total {len(node.gpus)}",
        ]
        ticks = p.violation_ticks
        values: dict[str, Callable[[int], float]] = {
            "gpu_junction_temperature": lambda g: rd["gpu_hotspot_temperature_celsius"][g],
            "gpu_memory_temperature": lambda g: rd["gpu_memory_temperature_celsius"][g],
            "gpu_package_power": lambda g: round(float(rd["gpu_power_watts"][g])),
            "gpu_energy_consumed": lambda g: np.floor(p.energy_j[g] * 1e6),
            "gpu_gfx_activity": lambda g: round(100 * float(rd["gpu_utilization_ratio"][g])),
            "gpu_umc_activity": lambda g: round(
                100 * float(rd["gpu_memory_bandwidth_utilization_ratio"][g])
            ),
            "gpu_used_vram": lambda g: round(p.memory_used[g] / 2**20),
            "gpu_total_vram": lambda g: round(p.memory_total[g] / 2**20),
            "pcie_speed": lambda g: 32,
            "pcie_replay_count": lambda g: p.pcie_replays[g],
            "pcie_recovery_count": lambda g: p.pcie_recoveries[g],
            "pcie_nack_sent_count": lambda g: p.pcie_naks[g, 0],
            "pcie_nack_received_count": lambda g: p.pcie_naks[g, 1],
            "gpu_ecc_correct_total": lambda g: p.ecc[g, 0],
            "gpu_ecc_uncorrect_total": lambda g: p.ecc[g, 1],
            "gpu_ecc_deferred_total": lambda g: p.ecc[g, 2],
            "gpu_ecc_correct_xgmi_wafl": lambda g: p.fabric_errors[g, :, 0].sum(),
            dme.ACCUMULATION_COUNTER: lambda g: ticks[g],
        }
        for vendor, reason in dme.VIOLATION_REASONS.items():
            col = R.get(reason)
            values[f"gpu_violation_{vendor}_residency_accumulated"] = (
                (lambda g, c=col: np.floor(p.throttle_s[g, c] * 1000))
                if col is not None
                else (lambda g: 0.0)
            )
            values[f"gpu_violation_{vendor}_residency_percentage"] = (
                (lambda g, c=col: 100.0 * p.active[g, c]) if col is not None else (lambda g: 0.0)
            )
        gpus = node.gpus
        for family in dme.FAMILIES:
            if family.priority:  # an older alias of a family already written
                continue
            rows = self._dme_rows(family, gpus, values, rd, dropout, node)
            self._family(out, family.name, family.help, "gauge", rows)
        if self.errors is not None:
            dme_error_families(self, node, out)
        return "\n".join(out) + "\n"

    def _dme_rows(
        self,
        family: Family,
        gpus: tuple[int, ...],
        values: dict,
        rd: Readings,
        dropout: np.ndarray,
        node: Node,
    ) -> list[tuple[str, float]]:
        p = self.physics
        rows: list[tuple[str, float]] = []
        sensor = DME_SENSORS.get(family.name)  # a temperature that a dropout hides
        for g in gpus:
            for part, labels in enumerate(self._dme_labels[g]):
                if family.physical and part > 0:
                    continue  # CPX: physical sensors are reported on partition 0 only
                if sensor is not None and dropout[g, sensor]:
                    continue
                if self.errors is not None and self.errors.blank[g]:
                    continue  # a GPU off the bus: DME cannot read it
                if family.name == "gpu_hbm_temperature":
                    if node.hbm_stack_sensors:
                        for s in range(self.fleet.gpus[g].sku.hbm_stacks):
                            rows.append((f'{labels},hbm_index="{s}"', rd["stack"][g, s]))
                elif family.name == "gpu_clock":
                    clocks = (
                        ("system", 1, rd["compute_mhz"][g]),
                        ("memory", 8, rd["memory_mhz"][g]),
                        ("soc", 9, 1090.0),
                        ("data", 14, 800.0),
                    )
                    rows.extend(
                        (f'{labels},clock_index="{i}",clock_type="{t}"', v) for t, i, v in clocks
                    )
                elif family.name in ("gpu_xgmi_link_rx", "gpu_xgmi_link_tx"):
                    direction = 0 if family.name.endswith("rx") else 1
                    for link in range(self.fleet.gpus[g].sku.fabric_links):
                        kb = np.floor(p.fabric_bytes[g, link, direction] / 1024)
                        rows.append((f'{labels},link_index="{link}"', kb))
                elif family.name in values:
                    rows.append((labels, float(values[family.name](g))))
        return rows

    def _dcgm_page(self, node: Node, rd: Readings, dropout: np.ndarray) -> str:
        p = self.physics
        new = node.dcgm_names == "4.6"

        def name(old: str) -> str:
            return dcgm.RENAMED.get(old, old) if new else old

        per_gpu: list[tuple[str, str, Callable[[int], float]]] = [
            ("DCGM_FI_DEV_SM_CLOCK", "gauge", lambda g: rd["compute_mhz"][g]),
            ("DCGM_FI_DEV_MEM_CLOCK", "gauge", lambda g: rd["memory_mhz"][g]),
            (
                "DCGM_FI_DEV_MEMORY_TEMP",
                "gauge",
                lambda g: (
                    dcgm.NOT_SUPPORTED if dropout[g, 0] else rd["gpu_memory_temperature_celsius"][g]
                ),
            ),
            (
                "DCGM_FI_DEV_GPU_TEMP",
                "gauge",
                lambda g: (
                    dcgm.NOT_SUPPORTED
                    if dropout[g, 1]
                    else rd["gpu_hotspot_temperature_celsius"][g]
                ),
            ),
            ("DCGM_FI_DEV_POWER_USAGE", "gauge", lambda g: rd["gpu_power_watts"][g]),
            ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", lambda g: rd["gpu_power_limit_watts"][g]),
            (
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                "counter",
                lambda g: np.floor(p.energy_j[g] * 1000),
            ),
            ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", lambda g: p.pcie_replays[g]),
            ("DCGM_FI_DEV_GPU_UTIL", "gauge", lambda g: round(100 * p.util_compute[g])),
            ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", lambda g: round(100 * p.util_memory[g])),
            ("DCGM_FI_DEV_FB_USED", "gauge", lambda g: round(p.memory_used[g] / 2**20)),
            ("DCGM_FI_DEV_FB_TOTAL", "gauge", lambda g: round(p.memory_total[g] / 2**20)),
            ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", lambda g: self._event_bits(g)),
            (
                "DCGM_FI_DEV_POWER_VIOLATION",
                "counter",
                lambda g: np.floor(p.throttle_s[g, R["power"]] * 1e9),
            ),
            (
                "DCGM_FI_DEV_THERMAL_VIOLATION",
                "counter",
                lambda g: np.floor(p.throttle_s[g, R["sw_thermal"]] * 1e9),
            ),
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", lambda g: p.ecc[g, 0]),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", lambda g: p.ecc[g, 1]),
            ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", lambda g: round(float(p.util_memory[g]), 6)),
            (
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                "counter",
                lambda g: np.floor(p.fabric_bytes[g].sum()),
            ),
        ]
        out: list[str] = []
        blank = self._blank_mask(node)
        for old, kind, value in per_gpu:
            family = dcgm.BY_NAME.get(old)
            help = family.help if family else "Current clock event reasons (bitmask)."
            rows = _blanked([(self._dcgm_labels[g], value(g)) for g in node.gpus], blank)
            self._family(out, name(old), help, kind, rows)
        labels = [self._dcgm_labels[g] for g in node.gpus]
        links = range(dcgm.NVLINK_LINKS)
        # Per link, as Python floats in one conversion each (a numpy scalar per row cost
        # most of the page): (link, gpu) tables of the error counters and of the bandwidth.
        gpus = list(node.gpus)
        errors = p.fabric_errors[gpus][:, : dcgm.NVLINK_LINKS].astype(float).transpose(2, 1, 0)
        bandwidth = np.floor(p.fabric_bytes[gpus][:, : dcgm.NVLINK_LINKS].sum(axis=2)).T
        for kind, error in (("CRC_FLIT", 0), ("REPLAY", 1)):
            table = errors[error].tolist()
            for link in links:
                old = f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}"
                rows = _blanked(list(zip(labels, table[link], strict=True)), blank)
                self._family(out, name(old), dcgm.BY_NAME[old].help, "counter", rows)
        table = bandwidth.astype(float).tolist()
        for link in links:
            old = f"DCGM_FI_DEV_NVLINK_BANDWIDTH_L{link}"
            rows = _blanked(list(zip(labels, table[link], strict=True)), blank)
            self._family(out, name(old), dcgm.BY_NAME[old].help, "counter", rows)
        if self.errors is not None:
            dcgm_error_families(self, node, out, blank)
        return "\n".join(out) + "\n"

    def _blank_mask(self, node: Node) -> list[bool] | None:
        """Which of the node's GPUs read blank (None: none, the common case)."""
        if self.errors is None or not self.errors.blank[list(node.gpus)].any():
            return None
        return self.errors.blank[list(node.gpus)].tolist()

    def _event_bits(self, g: int) -> int:
        p = self.physics
        bits = 0
        if p.active[g, R["power"]]:
            bits |= 0x4
        if p.active[g, R["sw_thermal"]]:
            bits |= 0x20
        if p.active[g, R["hw_thermal"]]:
            bits |= 0x40
        if p.util_compute[g] < 0.05:
            bits |= 0x1
        return bits

    def service_page(self, index: int) -> str:
        w = self.workloads
        service = self.fleet.services[index]
        base = [("engine", "0"), ("model_name", service.model)]
        out: list[str] = []
        for hist in vllm.VLLM:
            counts = np.cumsum(w.counts[hist.phase][index])
            out.append(f"# HELP {hist.name} {hist.help}")
            out.append(f"# TYPE {hist.name} histogram")
            for edge, c in zip((*hist.buckets, float("inf")), counts.tolist(), strict=True):
                le = "+Inf" if edge == float("inf") else repr(float(edge))
                out.append(f"{hist.name}_bucket{{{_labels([*base, ('le', le)])}}} {c}")
            out.append(f"{hist.name}_count{{{_labels(base)}}} {int(counts[-1])}")
            out.append(f"{hist.name}_sum{{{_labels(base)}}} {fmt(w.sums[hist.phase][index])}")
        out.append(f"# HELP {vllm.VLLM_SUCCESS} Count of successfully processed requests.")
        out.append(f"# TYPE {vllm.VLLM_SUCCESS} counter")
        out.append(
            f"{vllm.VLLM_SUCCESS}{{{_labels([*base, ('finished_reason', 'stop')])}}} "
            f"{int(w.requests[index])}"
        )
        out.append(
            "# HELP vllm:num_requests_running Number of requests in model execution batches."
        )
        out.append("# TYPE vllm:num_requests_running gauge")
        out.append(f"vllm:num_requests_running{{{_labels(base)}}} {fmt(round(w.running[index]))}")
        return "\n".join(out) + "\n"

    def job_page(self, index: int) -> str:
        w = self.workloads
        job = self.fleet.jobs[index]
        (hist,) = vllm.TRAINING
        base = [("job", job.name)]
        counts = np.cumsum(w.job_counts[index])
        out = [f"# HELP {hist.name} {hist.help}", f"# TYPE {hist.name} histogram"]
        for edge, c in zip((*hist.buckets, float("inf")), counts.tolist(), strict=True):
            le = "+Inf" if edge == float("inf") else repr(float(edge))
            out.append(f"{hist.name}_bucket{{{_labels([*base, ('le', le)])}}} {c}")
        out.append(f"{hist.name}_count{{{_labels(base)}}} {int(counts[-1])}")
        out.append(f"{hist.name}_sum{{{_labels(base)}}} {fmt(w.job_sums[index])}")
        return "\n".join(out) + "\n"
