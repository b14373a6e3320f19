"""Inference services and training jobs: load on the GPUs, latency out of them.

Each inference service draws Poisson arrivals around a daily pattern.  A request's time to
first token is queueing plus prefill (compute-bound: slower when clocks drop); its
inter-token latency is decode (memory-bound: slower when HBM bandwidth is held down, a
little slower with lower clocks).  A co-tenant's HBM copy slows only the tokens (and
first tokens) that overlap its bursts: at 10% duty those take about 3.3x longer, so the p99
of first-token and inter-token latency rises while their p50 stays flat, as in DOMAIN.md's
H200 trace; end-to-end latency, an average over many tokens, rises a little.  Latencies
land in vLLM's own histogram buckets.

A training job's step takes as long as its slowest GPU's compute plus its collectives over
the slowest link: one throttled GPU or one degraded link slows the whole job.

A service on a GPU that fell off the bus (``xid_fatal``) stalls: a tenth of its requests
finish, late.  A pod moved to another GPU (``simulator/pods.py``) takes its load along.
"""

from __future__ import annotations

import math

import numpy as np

from hbmwatch.collector.spellings.vllm import STEP_BUCKETS, VLLM
from hbmwatch.simulator.fleet import Fleet
from hbmwatch.simulator.physics import Demand, Physics

PREFILL_SECONDS_PER_TOKEN = 25e-6
DECODE_SECONDS_PER_TOKEN = 0.018
CO_TENANT_SLOWDOWN = 3.3
PCIE_SLOWDOWN_PER_REPLAY = 1.0 / 1000.0  # ttft x (1 + replays per second / 1000)
PHASES = tuple(h.phase for h in VLLM)
JITTER, JITTER_SECONDS = 0.04, 3.0  # relative spread of a GPU's traffic, and its memory
#: A service on a GPU that fell off the bus: a tenth of its requests finish (the rest fail),
#: after waiting out a client timeout for the first token, decoding slowly on retries.
STALL_COMPLETE, STALL_WAIT_S, STALL_SLOWDOWN = 0.1, 30.0, 5.0


class Workloads:
    """The fleet's services and jobs, with their cumulative histograms."""

    def __init__(self, fleet: Fleet, seed: int) -> None:
        self.fleet = fleet
        self.rng = np.random.default_rng([seed, 4])
        w = fleet.scenario.workload
        self.rps = w.requests_per_second
        self.amplitude = w.diurnal_amplitude
        self.prompt_tokens = w.prompt_tokens
        self.output_tokens = w.output_tokens
        services = fleet.services
        self.service_gpu = np.array([s.gpu for s in services], dtype=np.int64)
        self.partitions = np.array([fleet.gpus[s.gpu].partitions for s in services])
        self.buckets = {h.phase: np.array(h.buckets) for h in VLLM}
        n = len(services)
        self.counts = {p: np.zeros((n, len(self.buckets[p]) + 1), dtype=np.int64) for p in PHASES}
        self.sums = {p: np.zeros(n) for p in PHASES}
        self.requests = np.zeros(n, dtype=np.int64)
        self.running = np.zeros(n)
        self.stall_carry = np.zeros(n)
        self.step_buckets = np.array(STEP_BUCKETS)
        jobs = fleet.jobs
        self.job_counts = np.zeros((len(jobs), len(STEP_BUCKETS) + 1), dtype=np.int64)
        self.job_sums = np.zeros(len(jobs))
        self.job_steps = np.zeros(len(jobs), dtype=np.int64)
        self.job_progress = np.zeros(len(jobs))
        self.job_last_step = np.array([j.step_seconds for j in jobs], dtype=np.float64)
        self.training_gpus = np.zeros(fleet.size, dtype=bool)
        for job in jobs:
            self.training_gpus[list(job.gpus)] = True
        # Batch sizes and sequence lengths vary from second to second: traffic jitter.
        self.jitter_rng = np.random.default_rng([seed, 6])
        self.jitter_sd = JITTER * fleet.scenario.noise
        self.jitter = np.zeros((2, fleet.size))

    def load(self, unix: float) -> float:
        """The daily pattern: busiest mid-afternoon UTC, quietest before dawn."""
        hour = (unix % 86_400) / 3600.0
        return 1.0 + self.amplitude * math.sin(2 * math.pi * (hour - 9.0) / 24.0)

    def demand(self, unix: float, dt: float = 1.0) -> Demand:
        n = self.fleet.size
        load = self.load(unix)
        keep = math.exp(-dt / JITTER_SECONDS)
        noise = self.jitter_rng.normal(
            0.0, self.jitter_sd * math.sqrt(1 - keep**2), self.jitter.shape
        )
        self.jitter = self.jitter * keep + noise
        per_gpu = np.zeros(n)
        np.add.at(per_gpu, self.service_gpu, 1.0 / self.partitions)
        compute = np.where(per_gpu > 0, 0.25 + 0.55 * load * per_gpu, 0.02)
        memory = np.where(per_gpu > 0, 0.25 + 0.5 * load * per_gpu, 0.01)
        compute = np.where(self.training_gpus, 0.92, compute) * (1 + self.jitter[0])
        memory = np.where(self.training_gpus, 0.65, memory) * (1 + self.jitter[1])
        fabric = np.where(self.training_gpus, 0.8, 0.0)
        return Demand(compute, memory, fabric)

    def step(
        self,
        dt: float,
        unix: float,
        physics: Physics,
        co_tenant: np.ndarray,
        pcie_replay_rate: np.ndarray,
        link_bandwidth: np.ndarray,
        stalled: np.ndarray | None = None,
    ) -> None:
        if len(self.requests):
            self._serve(dt, unix, physics, co_tenant, pcie_replay_rate, stalled)
        if len(self.job_steps):
            self._train(dt, physics, link_bandwidth)

    def _serve(
        self,
        dt: float,
        unix: float,
        physics: Physics,
        co_tenant: np.ndarray,
        pcie_replay_rate: np.ndarray,
        stalled: np.ndarray | None = None,
    ) -> None:
        rng = self.rng
        load = self.load(unix)
        arrivals = rng.poisson(self.rps * load * dt, len(self.requests))
        hung = None
        if stalled is not None and stalled.any():
            hung = stalled[self.service_gpu]
            arrivals = self._stall(arrivals, hung)
        svc = np.repeat(np.arange(len(arrivals)), arrivals)
        if len(svc) == 0:
            self.running[:] = 0
            return
        gpu = self.service_gpu[svc]
        clock = physics.clock_factor[gpu]
        bandwidth = physics.bw_factor[gpu]
        prompt = np.clip(rng.lognormal(math.log(self.prompt_tokens), 0.5, len(svc)), 1, 32_000)
        output = np.clip(
            rng.lognormal(math.log(self.output_tokens), 0.6, len(svc)), 1, 8_000
        ).round()
        utilisation = np.clip(load * 0.55 / clock, 0, 0.95)
        wait = rng.exponential(0.02 * utilisation / (1 - utilisation))
        prefill = prompt * PREFILL_SECONDS_PER_TOKEN / clock
        ttft = (wait + prefill) * (1 + pcie_replay_rate[gpu] * PCIE_SLOWDOWN_PER_REPLAY)
        itl = (
            DECODE_SECONDS_PER_TOKEN
            * (0.8 + 0.4 * load)
            / (bandwidth * clock**0.25)
            * rng.lognormal(0.0, 0.15, len(svc))
        )
        # A co-tenant's copy bursts (duty d) slow the tokens and first tokens they overlap.
        duty = np.clip(co_tenant[gpu], 0, 0.9)
        ttft = np.where(rng.random(len(svc)) < duty, ttft * CO_TENANT_SLOWDOWN, ttft)
        if hung is not None:  # the few that finish waited on a hung engine
            slow = hung[svc]
            ttft = np.where(slow, ttft + STALL_WAIT_S, ttft)
            itl = np.where(slow, itl * STALL_SLOWDOWN, itl)
        e2e = ttft + output * itl * (1 + duty * (CO_TENANT_SLOWDOWN - 1))
        self._observe("e2e", svc, e2e, None)
        self._observe("ttft", svc, ttft, None)
        self._observe("inter_token", svc, itl, output * (1 - duty))
        if duty.any():
            self._observe("inter_token", svc, itl * CO_TENANT_SLOWDOWN, output * duty)
        self.requests += arrivals
        self.running = arrivals * (e2e.mean() if len(e2e) else 0.0) / max(dt, 1e-9)

    def _stall(self, arrivals: np.ndarray, hung: np.ndarray) -> np.ndarray:
        """On a dead GPU (``xid_fatal``) only ``STALL_COMPLETE`` of requests finish."""
        self.stall_carry += np.where(hung, arrivals * STALL_COMPLETE, 0.0)
        done = np.floor(self.stall_carry)
        self.stall_carry -= done
        return np.where(hung, done.astype(arrivals.dtype), arrivals)

    def place(self, service_gpu: list[int]) -> None:
        """Services moved between GPUs (a pod rescheduled): load follows them."""
        self.service_gpu = np.array(service_gpu, dtype=np.int64)
        self.partitions = np.array([self.fleet.gpus[g].partitions for g in service_gpu])

    def _observe(
        self, phase: str, svc: np.ndarray, values: np.ndarray, weight: np.ndarray | None
    ) -> None:
        counts = self.counts[phase]
        nb = counts.shape[1]
        bucket = np.searchsorted(self.buckets[phase], values, side="left")
        flat = np.bincount(svc * nb + bucket, weights=weight, minlength=counts.size)
        counts += flat.reshape(counts.shape).astype(np.int64)
        w = values if weight is None else values * weight
        self.sums[phase] += np.bincount(svc, weights=w, minlength=len(counts))

    def _train(self, dt: float, physics: Physics, link_bandwidth: np.ndarray) -> None:
        for job in self.fleet.jobs:
            gpus = list(job.gpus)
            slowest = physics.clock_factor[gpus].min()
            link = np.where(physics.link_mask[gpus], link_bandwidth[gpus], 1.0).min()
            step = (
                job.step_seconds
                * (0.75 / slowest + 0.25 / max(link, 0.05))
                * self.rng.lognormal(0.0, 0.02)
            )
            self.job_last_step[job.index] = step
            self.job_progress[job.index] += dt / step
            done = int(self.job_progress[job.index])
            if done:
                self.job_progress[job.index] -= done
                bucket = int(np.searchsorted(self.step_buckets, step, side="left"))
                self.job_counts[job.index, bucket] += done
                self.job_sums[job.index] += done * step
                self.job_steps[job.index] += done
