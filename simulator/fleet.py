"""The simulated fleet's topology: clusters -> racks -> nodes -> 8 GPUs -> HBM stacks.

Everything here is fixed for a run and derived from the scenario and its seed: identities
(UUIDs, serials), SKU parameters as per-GPU arrays, services and training jobs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np

from hbmwatch.records import Device
from hbmwatch.simulator.scenario import Scenario
from hbmwatch.skus import SKUS, Sku, Vendor

GPUS_PER_NODE = 8
MAX_STACKS = 8
MAX_LINKS = 18
MODELS = ("llama-3.1-70b-instruct", "qwen2.5-72b-instruct", "mixtral-8x22b-instruct")


@dataclass(frozen=True)
class Gpu:
    index: int
    node: int
    rack: int
    device: Device
    sku: Sku
    partitions: int


@dataclass(frozen=True)
class Node:
    index: int
    host: str
    rack: int
    cluster: str
    rack_name: str
    sku: Sku
    gpus: tuple[int, ...]
    exporter: str  # "dme" | "dcgm"
    dcgm_names: str
    hbm_stack_sensors: bool
    driver: str


@dataclass(frozen=True)
class Service:
    """An inference service on one GPU (or one partition of it)."""

    index: int
    name: str
    model: str
    gpu: int
    partition: int
    node: int


@dataclass(frozen=True)
class Job:
    index: int
    name: str
    gpus: tuple[int, ...]
    step_seconds: float
    node: int  # where its step-time endpoint lives


@dataclass
class Fleet:
    scenario: Scenario
    gpus: list[Gpu] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)

    @classmethod
    def build(cls, scenario: Scenario, seed: int) -> Fleet:
        rng = np.random.default_rng([seed, 1])
        fleet = cls(scenario)
        for rack_index, rack in enumerate(scenario.racks):
            sku = SKUS[rack.sku]
            for n in range(rack.nodes):
                host = rack.host(n)
                node_index = len(fleet.nodes)
                first = len(fleet.gpus)
                driver = "6.14.14" if sku.vendor is Vendor.AMD else "580.159.04"
                for g in range(GPUS_PER_NODE):
                    device = Device(
                        host=host,
                        gpu=str(g),
                        cluster=rack.cluster,
                        rack=rack.name,
                        uuid=str(uuid.UUID(bytes=rng.bytes(16), version=4)),
                        serial=str(int(rng.integers(10**11, 10**12))),
                        vendor=sku.vendor.value,
                        sku=sku.name,
                        compute_partition=rack.compute_partition
                        if sku.vendor is Vendor.AMD
                        else "",
                        memory_partition=rack.memory_partition if sku.vendor is Vendor.AMD else "",
                        driver=driver,
                    )
                    fleet.gpus.append(
                        Gpu(first + g, node_index, rack_index, device, sku, rack.partitions)
                    )
                fleet.nodes.append(
                    Node(
                        node_index,
                        host,
                        rack_index,
                        rack.cluster,
                        rack.name,
                        sku,
                        tuple(range(first, first + GPUS_PER_NODE)),
                        "dme" if sku.vendor is Vendor.AMD else "dcgm",
                        rack.dcgm_names,
                        rack.hbm_stack_sensors,
                        driver,
                    )
                )
        fleet._place_services(rng)
        fleet._place_jobs()
        return fleet

    def _place_services(self, rng: np.random.Generator) -> None:
        training = {rack for job in self.scenario.workload.training for rack in job.racks}
        for gpu in self.gpus:
            node = self.nodes[gpu.node]
            if node.rack_name in training:
                continue
            per_node = self.scenario.racks[node.rack].services_per_node
            if per_node is not None and int(gpu.device.gpu) >= per_node:
                continue  # an idle GPU: a pod may move onto it
            for p in range(gpu.partitions):
                suffix = f"-p{p}" if gpu.partitions > 1 else ""
                self.services.append(
                    Service(
                        len(self.services),
                        f"{node.host}-gpu{gpu.device.gpu}{suffix}",
                        MODELS[int(rng.integers(len(MODELS)))],
                        gpu.index,
                        p,
                        gpu.node,
                    )
                )

    def _place_jobs(self) -> None:
        for job in self.scenario.workload.training:
            gpus = tuple(g.index for g in self.gpus if g.device.rack in job.racks)
            self.jobs.append(
                Job(len(self.jobs), job.name, gpus, job.step_seconds, self.gpus[gpus[0]].node)
            )

    # -- lookups ------------------------------------------------------------------------
    def gpu_index(self, host: str, gpu: int) -> int:
        node = next(n for n in self.nodes if n.host == host)
        return node.gpus[gpu]

    def node_index(self, host: str) -> int:
        return next(n.index for n in self.nodes if n.host == host)

    def rack_index(self, name: str) -> int:
        return next(i for i, r in enumerate(self.scenario.racks) if r.name == name)

    def sku_array(self, attribute: str) -> np.ndarray:
        return np.array([getattr(g.sku, attribute) for g in self.gpus], dtype=np.float64)

    @property
    def size(self) -> int:
        return len(self.gpus)
