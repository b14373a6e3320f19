"""Kubernetes pods on the simulated GPUs: names, labels and moves between GPUs over time.

A rack with ``pods = true`` runs each inference service in a pod (a Deployment's: namespace
``inference``, container ``vllm``), and its exporter writes that pod on the GPU's device
lines as dcgm-exporter and DME do on Kubernetes.  A scenario's ``[[moves]]`` reschedule a
service's pod onto another GPU at a time: the service then runs there under a new pod name
(its ReplicaSet's hash with a new suffix, as a recreated pod gets); a move onto a GPU that
runs a service swaps the two.  Names are drawn from a hash of the seed and the service, not
from the simulation's random streams, so runs without pods draw exactly what they did.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from hbmwatch.validation import ConfigError, parse_duration

if TYPE_CHECKING:
    from hbmwatch.simulator.fleet import Fleet
    from hbmwatch.simulator.scenario import Scenario

NAMESPACE = "inference"
CONTAINER = "vllm"
#: Kubernetes' pod-name suffix alphabet (no vowels, no look-alikes).
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class GpuRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str
    gpu: int = Field(ge=0, le=7)


class PodMove(BaseModel):
    """At ``at``, the service on ``source`` moves to ``destination`` (swapping with the
    service there, if any).  TOML: ``{ at = "10m", from = {...}, to = {...} }``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    at: Annotated[float, BeforeValidator(parse_duration)]
    source: GpuRef = Field(alias="from")
    destination: GpuRef = Field(alias="to")


def check_moves(scenario: Scenario) -> None:
    """Each move names GPUs of the fleet, within the run, and its source runs a service."""
    racks = {r.host(i): r for r in scenario.racks for i in range(r.nodes)}
    for i, move in enumerate(scenario.moves):
        where = f"moves[{i}]"
        for side, ref in (("from", move.source), ("to", move.destination)):
            if ref.host not in racks:
                raise ConfigError(f"{where}.{side}.host: unknown host {ref.host!r}",
                                  field=f"{where}.{side}.host")  # fmt: skip
        if move.source == move.destination:
            raise ConfigError(f"{where}: from and to are the same GPU", field=f"{where}.to")
        if racks[move.source.host].vendor != racks[move.destination.host].vendor:
            raise ConfigError(f"{where}: a pod moves between GPUs of one vendor",
                              field=f"{where}.to")  # fmt: skip
        if not 0 < move.at < scenario.duration:
            raise ConfigError(f"{where}.at: {move.at:g} s is not within the run",
                              field=f"{where}.at")  # fmt: skip


@dataclass(frozen=True)
class Pod:
    """One pod as the exporters label a GPU with it."""

    namespace: str
    name: str
    container: str
    uid: str
    service: str


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()


def _letters(digest: bytes, n: int) -> str:
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:n])


def make_pod(seed: int, service: str, generation: int) -> Pod:
    """The service's pod after ``generation`` reschedules: same ReplicaSet, new suffix.

    >>> a, b = make_pod(1, "r0-node0-gpu3", 0), make_pod(1, "r0-node0-gpu3", 1)
    >>> a.name.rsplit("-", 1)[0] == b.name.rsplit("-", 1)[0], a.name != b.name
    (True, True)
    """
    replicaset = _letters(_digest(seed, service, "rs"), 10)
    suffix = _letters(_digest(seed, service, "pod", generation), 5)
    uid = str(uuid.UUID(bytes=_digest(seed, service, "uid", generation)[:16], version=4))
    return Pod(NAMESPACE, f"{service}-{replicaset}-{suffix}", CONTAINER, uid, service)


class Placement:
    """Which service (and pod) runs on which GPU, as the scenario's moves change it."""

    def __init__(self, fleet: Fleet, seed: int) -> None:
        self.fleet = fleet
        self.seed = seed
        scenario = fleet.scenario
        self.moves = sorted(scenario.moves, key=lambda m: m.at)
        self._next = 0
        self.service_gpu = [s.gpu for s in fleet.services]
        self.generation = [0] * len(fleet.services)
        self.labelled = {g.index for g in fleet.gpus if scenario.racks[g.rack].pods}
        #: Every pod that ran on each GPU, for the ground truth.
        self.history: dict[int, list[dict[str, object]]] = {}
        for s in fleet.services:
            self._record(s.index, s.gpu, 0.0)

    def pods_on(self, gpu: int) -> list[Pod]:
        """The pods on a GPU now (only on racks with pods)."""
        if gpu not in self.labelled:
            return []
        return [self.pod(s) for s, g in enumerate(self.service_gpu) if g == gpu]

    def pod_labels(self, gpu: int, exporter: str) -> list[tuple[str, str]]:
        """The pod labels an exporter (``dcgm`` or ``dme``) writes on a GPU's lines."""
        pods = self.pods_on(gpu)
        if not pods:
            return []
        pod = pods[0]  # the exporters name one pod per device (partition 0's in CPX)
        pairs = [("container", pod.container), ("namespace", pod.namespace), ("pod", pod.name)]
        if exporter == "dcgm":
            return [*pairs, ("pod_uid", pod.uid)]
        return [*pairs, ("job_id", ""), ("job_partition", ""), ("job_user", "")]

    def pod(self, service: int) -> Pod:
        return make_pod(self.seed, self.fleet.services[service].name, self.generation[service])

    def advance(self, t: float) -> set[int]:
        """Apply the moves due by ``t``; return the GPUs whose pods changed."""
        changed: set[int] = set()
        while self._next < len(self.moves) and self.moves[self._next].at <= t + 1e-9:
            move = self.moves[self._next]
            self._next += 1
            src = self.fleet.gpu_index(move.source.host, move.source.gpu)
            dst = self.fleet.gpu_index(move.destination.host, move.destination.gpu)
            for s, g in enumerate(list(self.service_gpu)):
                if g in (src, dst):
                    self.service_gpu[s] = dst if g == src else src
                    self.generation[s] += 1
                    self._record(s, self.service_gpu[s], move.at)
            changed |= {src, dst}
        return changed

    def _record(self, service: int, gpu: int, since: float) -> None:
        if gpu not in self.labelled:
            return
        pod = self.pod(service)
        self.history.setdefault(gpu, []).append(
            {
                "namespace": pod.namespace,
                "pod": pod.name,
                "container": pod.container,
                "service": pod.service,
                "since_s": since,
            }
        )

    def pods_during(self, gpu: int, start: float, end: float) -> list[str]:
        """Pod names on a GPU at any time in ``[start, end]`` (seconds into the run)."""
        spans = self.history.get(gpu, [])
        out = []
        for entry in spans:
            since = float(entry["since_s"])  # type: ignore[arg-type]
            # An entry holds until the GPU's next entry, or until its service moved away.
            until = self._until(gpu, since)
            if since <= end and until >= start:
                out.append(str(entry["pod"]))
        return sorted(set(out))

    def _until(self, gpu: int, since: float) -> float:
        """When the next move touching the GPU after ``since`` happens (inf: none)."""
        moved = [m.at for m in self.moves if m.at > since and gpu in self._move_gpus(m)]
        return min(moved, default=float("inf"))

    def _move_gpus(self, move: PodMove) -> set[int]:
        return {
            self.fleet.gpu_index(move.source.host, move.source.gpu),
            self.fleet.gpu_index(move.destination.host, move.destination.gpu),
        }
