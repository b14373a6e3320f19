"""Per-stack HBM thermals, power, clocks and throttling, vectorised over the whole fleet.

Calibrated to the real H200 trace in DOMAIN.md:

* HBM temperature has a fast component (time constant ``TAU_FAST`` = 1 s, driven by the
  stack's own traffic: 41 -> 57 C within ~3 s of a full-bandwidth copy) and a slow one
  (``TAU_SLOW`` = 40 s: the creep to 60 C, die heat soaking into the package, neighbours).
* The die (hotspot) follows its power with ``TAU_DIE`` = 4 s; compute-heavy work (GEMM at
  ~690 W) warms HBM only through that coupling (43-51 C) while the die reaches ~58 C.
* After the load stops, temperatures fall back within seconds.

Throttling: past the SKU's hotspot or memory slowdown temperature a controller pulls the
compute clock (or, for HBM, the memory bandwidth) down until the temperature holds at the
limit; past the power cap the compute clock drops until power meets the cap.  Residency
counters and active flags record each reason, as the real counters do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbmwatch.simulator.faults import Effects
from hbmwatch.simulator.fleet import MAX_LINKS, MAX_STACKS, Fleet
from hbmwatch.skus import Vendor

TAU_FAST, TAU_SLOW, TAU_DIE = 1.0, 40.0, 4.0
MEM_IDLE_OFFSET_C = {"air": 14.0, "dlc": 9.0}
DIE_IDLE_OFFSET_C = {"air": 8.0, "dlc": 5.0}
HBM_FAST_RISE_C = {"air": 18.0, "dlc": 13.0}  # at full bandwidth
HBM_SLOW_RISE_C = 3.5
DIE_RISE_C = {"air": 32.0, "dlc": 24.0}  # at the board's power in the die
DIE_TO_HBM = 0.3
NEIGHBOUR_COUPLING = 0.15
THERMAL_GAIN = 0.05  # clock fraction per degree over the limit per second
RECOVERY_RATE = 0.03  # clock fraction per second once 3 C below the limit
MIN_CLOCK = 0.35
WRAP_32 = 2.0**32

#: Canonical throttle reasons, in a fixed column order.
REASONS = ("power", "socket_thermal", "hbm_thermal", "sw_thermal", "hw_thermal")
R = {name: i for i, name in enumerate(REASONS)}


@dataclass
class Demand:
    """What the workloads ask of each GPU this step."""

    compute: np.ndarray  # 0..1
    memory: np.ndarray  # 0..1 of bandwidth
    fabric: np.ndarray  # 0..1 of link bandwidth (collectives)


class Physics:
    """The fleet's physical state; ``step`` advances it by ``dt`` seconds."""

    def __init__(self, fleet: Fleet, seed: int) -> None:
        self.fleet = fleet
        n = fleet.size
        rng = np.random.default_rng([seed, 2])
        self.rng = np.random.default_rng([seed, 3])
        self.sensor_rng = np.random.default_rng([seed, 5])
        cooling = [fleet.scenario.racks[g.rack].effective_cooling for g in fleet.gpus]
        self.rack_of = np.array([g.rack for g in fleet.gpus])
        self.base_inlet = np.array([r.effective_inlet_c for r in fleet.scenario.racks])
        self.amd = np.array([g.sku.vendor is Vendor.AMD for g in fleet.gpus])
        self.board_power = fleet.sku_array("board_power_watts")
        self.p_idle = 0.17 * self.board_power
        self.p_mem = 0.18 * self.board_power
        self.p_comp = 1.05 * self.board_power - self.p_idle - self.p_mem
        self.hot_limit = fleet.sku_array("hotspot_slowdown_c")
        self.mem_limit = fleet.sku_array("memory_slowdown_c")
        self.clock_max = fleet.sku_array("compute_clock_mhz")
        self.mem_clock = fleet.sku_array("memory_clock_mhz")
        self.link_bw = fleet.sku_array("fabric_link_bytes_per_second")
        self.links = np.array([g.sku.fabric_links for g in fleet.gpus])
        self.stacks = np.array([g.sku.hbm_stacks for g in fleet.gpus])
        self.stack_mask = np.arange(MAX_STACKS)[None, :] < self.stacks[:, None]
        self.link_mask = np.arange(MAX_LINKS)[None, :] < self.links[:, None]
        self.mem_offset = np.array([MEM_IDLE_OFFSET_C[c] for c in cooling])
        self.die_offset = np.array([DIE_IDLE_OFFSET_C[c] for c in cooling])
        self.fast_rise = np.array([HBM_FAST_RISE_C[c] for c in cooling])
        self.die_rise = np.array([DIE_RISE_C[c] for c in cooling])
        # Manufacturing spread: each stack's and die's thermal resistance differs a little.
        self.stack_r = np.clip(rng.normal(1.0, 0.04, (n, MAX_STACKS)), 0.85, 1.15)
        self.die_r = np.clip(rng.normal(1.0, 0.03, n), 0.9, 1.1)
        self.memory_total = fleet.sku_array("memory_bytes")

        self.x_fast = np.zeros((n, MAX_STACKS))
        self.x_slow = np.zeros((n, MAX_STACKS))
        self.x_die = np.zeros(n)
        self.clock_thermal = np.ones(n)  # hotspot controller
        self.bw_thermal = np.ones(n)  # HBM controller
        self.clock_factor = np.ones(n)
        self.bw_factor = np.ones(n)
        self.power = self.p_idle.copy()
        self.power_limit = self.board_power.copy()
        self.util_compute = np.zeros(n)
        self.util_memory = np.zeros(n)
        self.inlet = self.base_inlet[self.rack_of].copy()
        self.active = np.zeros((n, len(REASONS)), dtype=bool)
        # Counters, as the hardware keeps them (start where a running machine would be).
        self.energy_j = rng.uniform(1e7, 1e9, n)
        self.throttle_s = np.zeros((n, len(REASONS)))
        self.violation_ticks = rng.uniform(1e6, 1e9, n).round()
        self.fabric_bytes = rng.uniform(1e11, 1e13, (n, MAX_LINKS, 2)) * self.link_mask[..., None]
        self.fabric_errors = np.zeros((n, MAX_LINKS, 2))  # crc, replay
        self.pcie_replays = np.where(
            rng.random(n) < 0.25, WRAP_32 - rng.uniform(1e3, 5e4, n), rng.integers(0, 500, n)
        ).round()
        self.pcie_recoveries = np.zeros(n)
        self.pcie_naks = np.zeros((n, 2))
        self.ecc = np.zeros((n, 3))
        self.memory_used = np.zeros(n)
        # Sensor readings (what the exporters show), updated each step.
        self.stack_temp = np.zeros((n, MAX_STACKS))
        self.mem_temp = np.zeros(n)
        self.hot_temp = np.zeros(n)

    # -- one step -----------------------------------------------------------------------
    def step(self, dt: float, demand: Demand, effects: Effects, ambient_c: np.ndarray) -> None:
        self.inlet = (self.base_inlet + ambient_c + effects.inlet_rise_c)[self.rack_of]
        self.power_limit = self.board_power * effects.power_cap_fraction
        self._clocks_and_power(demand, effects)
        self._thermals(dt, effects)
        self._controllers(dt)
        self._counters(dt, demand, effects)

    def _clocks_and_power(self, demand: Demand, effects: Effects) -> None:
        duty = np.clip(effects.co_tenant_duty, 0, 1)
        u_c = np.clip(demand.compute, 0, 1)
        u_m = np.clip(demand.memory + 0.9 * duty, 0, 1)
        b = self.bw_thermal
        dynamic = self.p_comp * u_c
        budget = self.power_limit - self.p_idle - self.p_mem * u_m * b
        with np.errstate(divide="ignore", invalid="ignore"):
            f_power = np.where(
                dynamic > budget, (np.clip(budget, 1e-6, None) / dynamic) ** 0.4, 1.0
            )
        f_power = np.clip(np.nan_to_num(f_power, nan=1.0), MIN_CLOCK, 1.0)
        self.clock_factor = np.minimum(f_power, self.clock_thermal)
        self.bw_factor = b
        self.util_compute = u_c
        self.util_memory = u_m * b
        self.power = (
            self.p_idle + self.p_comp * u_c * self.clock_factor**2.5 + self.p_mem * self.util_memory
        )
        self.active[:] = False
        self.active[:, R["power"]] = f_power < 0.999

    def _thermals(self, dt: float, effects: Effects) -> None:
        a_fast, a_slow, a_die = (1 - np.exp(-dt / tau) for tau in (TAU_FAST, TAU_SLOW, TAU_DIE))
        r = self.stack_r * effects.stack_resistance
        p_die = self.power - self.p_mem * self.util_memory
        die_target = self.die_r * self.die_rise * p_die / self.board_power
        self.x_die += (die_target - self.x_die) * a_die
        fast_target = r * (self.fast_rise * self.util_memory)[:, None]
        self.x_fast += (fast_target - self.x_fast) * a_fast
        masked = np.where(self.stack_mask, self.x_fast, np.nan)
        with np.errstate(invalid="ignore"):
            neighbours = np.nan_to_num(np.nanmean(masked, axis=1))[:, None]
        slow_target = (
            r * (HBM_SLOW_RISE_C * self.util_memory[:, None] + DIE_TO_HBM * self.x_die[:, None])
            + NEIGHBOUR_COUPLING * neighbours
        )
        self.x_slow += (slow_target - self.x_slow) * a_slow
        stacks = self.inlet[:, None] + self.mem_offset[:, None] + self.x_fast + self.x_slow
        self.stack_temp = np.where(self.stack_mask, stacks, np.nan)
        self.mem_temp = np.nanmax(self.stack_temp, axis=1)
        self.hot_temp = self.inlet + self.die_offset + self.x_die

    def _controllers(self, dt: float) -> None:
        for temp, limit, state in (
            (self.hot_temp, self.hot_limit, self.clock_thermal),
            (self.mem_temp, self.mem_limit, self.bw_thermal),
        ):
            over = temp - limit
            state -= np.where(over > 0, THERMAL_GAIN * over * dt, 0.0)
            state += np.where(over < -3, RECOVERY_RATE * dt, 0.0)
            np.clip(state, MIN_CLOCK, 1.0, out=state)
        hot, hbm = self.clock_thermal < 0.999, self.bw_thermal < 0.999
        self.active[:, R["socket_thermal"]] = hot & self.amd
        self.active[:, R["hbm_thermal"]] = hbm & self.amd
        self.active[:, R["sw_thermal"]] = (hot | hbm) & ~self.amd
        self.active[:, R["hw_thermal"]] = (self.clock_thermal < 0.5) & ~self.amd

    def _counters(self, dt: float, demand: Demand, effects: Effects) -> None:
        rng = self.rng
        self.energy_j += self.power * dt
        self.throttle_s += self.active * dt
        self.violation_ticks += 1000.0 * dt
        traffic = (0.02 + 0.4 * np.clip(demand.fabric, 0, 1))[:, None] * self.link_bw[:, None]
        moved = traffic * effects.link_bandwidth * self.link_mask * dt
        self.fabric_bytes += moved[..., None] * np.array([0.5, 0.5])
        errors = rng.poisson(effects.link_error_rate * dt)
        self.fabric_errors[..., 0] += errors
        self.fabric_errors[..., 1] += rng.poisson(effects.link_error_rate * dt * 0.3)
        replays = rng.poisson(effects.pcie_replay_rate * dt + 1e-4 * dt)
        self.pcie_replays = (self.pcie_replays + replays) % WRAP_32
        self.pcie_recoveries += rng.poisson(effects.pcie_replay_rate * dt / 200.0)
        self.pcie_naks += np.stack([replays, rng.poisson(replays * 0.5)], axis=1)
        self.ecc[:, 0] += rng.poisson(2e-4 * dt, len(self.ecc))
        self.memory_used = np.where(demand.compute > 0.05, 0.9, 0.02) * self.memory_total

    # -- what the exporters read ----------------------------------------------------------
    def compute_clock_mhz(self) -> np.ndarray:
        return np.round(self.clock_max * self.clock_factor)

    def memory_clock_mhz(self) -> np.ndarray:
        return np.round(self.mem_clock * np.where(self.bw_factor < 0.999, self.bw_factor, 1.0))
