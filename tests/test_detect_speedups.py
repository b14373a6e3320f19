"""The fast detector paths against the code they replaced, kept here as the reference.

Each rewrite for speed (issue 5: a 1,024-GPU cycle in under a second) must conclude what
the code before it concluded.  The reference classes below are that code, verbatim but for
names: ``TrendBaseline`` learning on the table row by row, and ``ThermalExcursions``
stepping every table, every Hysteresis key and every rack in Python each step.  The fast
paths must give the same findings, scores and state, bit for bit, on fleets built to
exercise every branch (warm-up, dropouts, stacks, racks warming, SKU limits, restarts).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from hbmwatch.detectors.base import Episode, Hysteresis, latest, nanmedian, quiet_nan
from hbmwatch.detectors.frame import Entities, Frame
from hbmwatch.detectors.scorers import TrendBaseline, decay, group_median, group_median_columns
from hbmwatch.detectors.signals import MAX_STACKS
from hbmwatch.detectors.thermal import ThermalExcursions
from hbmwatch.detectors.thermal_layout import (
    DEFAULT_LIMITS,
    N_SENSORS,
    PRIOR_SLOPE,
    SENSOR_DRIVER,
    SENSORS,
    Trace,
    peer_load_gaps,
)
from hbmwatch.records import Finding
from hbmwatch.skus import lookup
from hbmwatch.store.feed import RecentSamples, SampleBlock


# -- the reference: TrendBaseline before its *_local forms ----------------------------------
class ReferenceTrendBaseline(TrendBaseline):
    """Each call gathers the rows it needs from the table and scatters what it learned."""

    def predict(self, rows: np.ndarray, t_ms: int | np.ndarray) -> np.ndarray:
        t = self.table
        dt = np.nan_to_num((t_ms - t["last_ms_"][rows]) / 1000.0)
        return t["level_"][rows] + t["trend_"][rows] * dt  # type: ignore[no-any-return]

    def scale(self, rows: np.ndarray) -> np.ndarray:
        return np.fmax(
            np.nan_to_num(self.table["scale_"][rows], nan=self.min_scale), self.min_scale
        )

    def deviation(self, rows: np.ndarray, x: np.ndarray, t_ms: int | np.ndarray) -> np.ndarray:
        ready = self.table["seen_s_"][rows] >= self.warmup_s
        return np.where(ready, x - self.predict(rows, t_ms), np.nan)

    def learn_one(
        self,
        rows: np.ndarray,
        x: np.ndarray,
        t_ms: int | np.ndarray,
        learn: np.ndarray | float = 1.0,
    ) -> None:
        t = self.table
        ok = ~np.isnan(x)
        if not ok.any():
            return
        r, x = rows[ok], x[ok]
        rate = np.broadcast_to(np.asarray(learn, dtype=float), ok.shape)[ok]
        t_now = np.broadcast_to(np.asarray(t_ms, dtype=float), ok.shape)[ok]
        last = t["last_ms_"][r]
        fresh = np.isnan(last) | np.isnan(t["level_"][r])
        dt = np.where(fresh, 1.0, np.clip((t_now - last) / 1000.0, 1e-3, 3600.0))
        pred = t["level_"][r] + t["trend_"][r] * dt
        scale = np.fmax(np.nan_to_num(t["scale_"][r], nan=self.min_scale), self.min_scale)
        warm = t["seen_s_"][r] < self.warmup_s
        first = 1.0 / (t["n_"][r] + 1.0)
        if self.warm_half_life_s is not None:
            first = np.fmax(first, decay(dt, self.warm_half_life_s))
        resid = np.where(warm, x - pred, np.clip(x - pred, -self.clip * scale, self.clip * scale))
        a_level = decay(dt, self.level_half_life_s)
        a = np.where(warm, np.fmax(a_level, first), a_level) * rate
        b = np.where(warm, 0.0, decay(dt, self.trend_half_life_s)) * rate
        level = np.where(fresh, x, pred + a * resid)
        trend = np.where(
            fresh, 0.0, t["trend_"][r] + b * ((level - t["level_"][r]) / dt - t["trend_"][r])
        )
        a_scale = decay(dt, self.scale_half_life_s)
        c = np.where(warm, np.fmax(a_scale, first), a_scale) * rate
        scale_new = np.where(
            np.isnan(t["scale_"][r]),
            self.min_scale,
            t["scale_"][r] + c * (1.25 * np.abs(resid) - t["scale_"][r]),
        )
        t["level_"][r] = level
        t["trend_"][r] = trend
        t["scale_"][r] = scale_new
        t["seen_s_"][r] += np.where(fresh, 0.0, dt * (rate > 0))
        t["last_ms_"][r] = t_now
        t["n_"][r] += rate > 0


def assert_same(a: object, b: object, path: str = "") -> None:
    """Equal, NaN equal to NaN, arrays and nested containers alike."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, np.ndarray | list) and not (isinstance(a, list) and a and isinstance(
            a[0], str | dict)):  # fmt: skip
        x = np.asarray(a, dtype=float) if isinstance(a, list) else a
        y = np.asarray(b, dtype=float) if isinstance(b, list) else b
        assert x.shape == y.shape, path
        np.testing.assert_array_equal(x, y, err_msg=path)
    else:
        assert a == b, path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trend_baseline_local_steps_equal_the_row_by_row_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    kw = {"level_half_life_s": 60.0, "trend_half_life_s": 300.0, "warmup_s": 20.0, "clip": 3.0}
    fast, ref, by_table = TrendBaseline(**kw), ReferenceTrendBaseline(**kw), TrendBaseline(**kw)
    keys = [f"e{i}" for i in range(40)]
    rows = [b.rows(keys) for b in (fast, ref, by_table)]
    assert all((r == rows[0]).all() for r in rows)
    local = fast.local(rows[0])
    t_ms = 0
    for step in range(300):
        t_ms += int(rng.choice([1000, 1000, 1000, 250, 5000]))  # irregular steps
        x = 50 + 0.01 * step + rng.normal(0, 1, len(keys)) + (rng.random(len(keys)) < 0.02) * 9
        x[rng.random(len(keys)) < 0.15] = np.nan  # dropouts
        x[:3] = np.nan  # never seen
        learn = np.where(rng.random(len(keys)) < 0.1, 0.02, 1.0)
        learn[5] = 0.0  # frozen
        want = ref.deviation(rows[1], x, t_ms)
        np.testing.assert_array_equal(fast.deviation_local(local, x, t_ms), want)
        np.testing.assert_array_equal(by_table.deviation(rows[2], x, t_ms), want)
        np.testing.assert_array_equal(fast.predict_local(local, t_ms), ref.predict(rows[1], t_ms))
        fast.learn_local(local, x, t_ms, learn)
        ref.learn_one(rows[1], x, t_ms, learn)
        by_table.learn_one(rows[2], x, t_ms, learn)
    fast.store(rows[0], local)
    assert_same(fast.state_dict(), ref.state_dict())
    assert_same(by_table.state_dict(), ref.state_dict())


@pytest.mark.parametrize("shape", [(50, 7), (9, 1), (64, 60), (3, 5)])
def test_group_median_columns_equals_one_group_median_per_column(
    shape: tuple[int, int],
) -> None:
    rng = np.random.default_rng(sum(shape))
    values = np.round(rng.normal(60, 3, shape))
    values[rng.random(shape) < 0.3] = np.nan
    groups = rng.integers(0, 4, shape[0])
    med, count = group_median_columns(values, groups)
    for col in range(shape[1]):
        want_med, want_count = group_median(values[:, col], groups)
        np.testing.assert_array_equal(med[:, col], want_med)
        np.testing.assert_array_equal(count[:, col], want_count)


def test_a_feed_read_with_held_samples_in_front_is_the_concatenation() -> None:
    feed = RecentSamples(10_000, lambda sid: sid % 2 == 0)
    for t in range(5):
        feed.append([(t * 1000, sid, float(t + sid)) for sid in range(6)])
    head = SampleBlock(np.array([8, 4]), np.array([9000, 9000]), np.array([1.0, 2.0]))
    plain = feed.read(4)
    with_head = feed.read(4, head=head)
    assert plain is not None and with_head is not None
    want = SampleBlock.concat([head, plain])
    for name in ("series_ids", "timestamps_ms", "values"):
        np.testing.assert_array_equal(getattr(with_head, name), getattr(want, name))
    assert feed.read(-1, head=head) is None  # evicted: the caller goes to SQL


# -- the reference: ThermalExcursions stepping everything in Python -------------------------
class ReferenceThermal(ThermalExcursions):
    """``update`` as it was: every key looked up and every rack walked at every step."""

    def _init_state(self) -> None:
        super()._init_state()
        for name in ("temps_", "drivers_", "rate_"):
            fast = getattr(self, name)
            ref = ReferenceTrendBaseline(
                level_half_life_s=fast.level_half_life_s, trend_half_life_s=fast.trend_half_life_s,
                scale_half_life_s=fast.scale_half_life_s, min_scale=fast.min_scale,
                warmup_s=fast.warmup_s, clip=fast.clip, warm_half_life_s=fast.warm_half_life_s,
            )  # fmt: skip
            setattr(self, name, ref)

    def update(self, frame: Frame) -> list[Finding]:
        n = len(frame.gpus)
        if n == 0 or frame.steps == 0:
            return []
        x = self._sensor_values(frame)
        limits = self._ref_limits(frame)
        groups = _ref_peer_groups(frame)
        keys = [f"{g}#{s}" for g in frame.gpus.keys for s in SENSORS]
        rows = self.temps_.rows(keys)
        srows = self.sensors_.rows(keys)
        drows = self.drivers_.rows([f"{g}#{d}" for g in frame.gpus.keys for d in ("bw", "pw")])
        frows = self.rate_.rows(frame.gpus.keys)
        drivers = _ref_drivers(frame)
        # The gap to peers at the same load is a whole frame's arithmetic, as the gaps'
        # medians are: the reference steps what is learned from it.
        load_gaps = np.where(
            np.isnan(x), np.nan, peer_load_gaps(x, drivers, groups)[:, SENSOR_DRIVER]
        )
        lrows = self.lag_.rows([f"{g}#{d}" for g in frame.gpus.keys for d in ("bw", "pw")])
        kept = 1.0 - decay(frame.step_ms / 1000.0, self.lag_half_life_s)
        rise = np.full((n, N_SENSORS, frame.steps), np.nan)
        excess = np.full((n, N_SENSORS, frame.steps), np.nan)
        is_open = self.gpu_open_.is_open(frame.gpus.keys)
        bw_dev = np.full((n, frame.steps), np.nan)
        scores = np.full((n, frame.steps), np.nan)
        findings: list[Finding] = []
        for i, t_ms in enumerate(frame.times_ms.tolist()):
            d_now = drivers[:, :, i].ravel()
            d_dev = self.drivers_.deviation(drows, d_now, t_ms).reshape(n, 2)
            self.drivers_.learn_one(drows, d_now, t_ms)
            bw_dev[:, i] = d_dev[:, 0]
            load = np.repeat(d_dev[:, :1], N_SENSORS, axis=1)
            load[:, 1] = d_dev[:, 1]
            xi = x[:, :, i].ravel()
            dev = self.temps_.deviation(rows, xi, t_ms)
            lag = np.fmax(d_now, self.lag_["load_"][lrows] * kept)
            self.lag_["load_"][lrows] = lag
            load_abs = drivers[:, :, i][:, SENSOR_DRIVER].ravel()
            settling = lag.reshape(n, 2)[:, SENSOR_DRIVER].ravel() - load_abs > 0.2
            rise_i, excess_i = self._ref_adjust(
                srows, dev, load.ravel(), xi, groups, n,
                (load_gaps[:, :, i].ravel(), load_abs, settling),
            )  # fmt: skip
            rise[:, :, i], excess[:, :, i] = rise_i, excess_i
            seen = self.temps_.table["seen_s_"][rows]
            young = (seen < self.young_s) & (xi < limits.ravel() - self.young_margin_c)
            learn = np.repeat(np.where(is_open, 0.02, 1.0), N_SENSORS)
            self.temps_.learn_one(rows, xi, t_ms, learn)
            score, gpu_rise = self._ref_score(
                rise_i, excess_i, x[:, :, i], limits, young.reshape(n, N_SENSORS)
            )
            scores[:, i] = score
            self.rate_.learn_one(frows, gpu_rise, t_ms)
            trace = Trace(x, rise, excess, limits)
            findings += self._ref_step_gpus(frame, i, t_ms, score, trace)
            is_open = self.gpu_open_.is_open(frame.gpus.keys)
            findings += self._ref_step_racks(frame, t_ms, gpu_rise)
        frame.derived["thermal_rise"] = quiet_nan(np.nanmax, rise, axis=1)
        frame.derived["bw_dev"] = bw_dev
        frame.scores[self.name] = scores
        findings += self._ref_refresh_open(frame, Trace(x, rise, excess, limits))
        return latest(findings)

    def _ref_limits(self, frame: Frame) -> np.ndarray:
        out = np.empty((len(frame.gpus), N_SENSORS))
        for row, labels in enumerate(frame.gpus.labels):
            sku = lookup(labels.get("sku", "")) if labels.get("sku") else None
            mem, hot = (sku.memory_slowdown_c, sku.hotspot_slowdown_c) if sku else DEFAULT_LIMITS
            out[row] = mem
            out[row, 1] = hot
        return out

    def _ref_adjust(
        self,
        srows: np.ndarray,
        dev: np.ndarray,
        load: np.ndarray,
        x: np.ndarray,
        groups: np.ndarray,
        n: int,
        at: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> tuple[np.ndarray, np.ndarray]:
        s = self.sensors_
        load_gap, load_abs, settling = at
        by_peers = np.tile(np.arange(N_SENSORS) < 2, n)
        gap = _ref_gaps(x.reshape(n, N_SENSORS), groups)
        excess, at_load = self._ref_excess(srows, gap.ravel(), load_gap, by_peers)
        ok = ~np.isnan(dev) & ~np.isnan(load)
        a = decay(1.0, self.level_half_life_s)
        sxy, sxx = s["sxy_"][srows], s["sxx_"][srows]
        beta = np.clip(sxy / np.fmax(sxx, 1e-9), 0.0, 60.0)
        beta = np.where(sxx > 1e-6, beta, 0.0)
        load0 = np.nan_to_num(load)
        unseen = load0 > np.fmax(3.0 * np.sqrt(sxx), 0.2)
        prior = np.tile(PRIOR_SLOPE, n)
        rise = dev - np.where(unseen, np.fmax(beta, prior), beta) * load0
        hi = s["hi_"][srows]
        hi = np.where(np.isnan(hi) & (sxx > 1e-6), load_abs - load + 3.0 * np.sqrt(sxx), hi)
        beyond = (load_abs > hi + 0.2) & ~np.isnan(at_load) & ~np.isnan(rise)
        rise = np.where(beyond, np.fmin(rise, at_load), rise)
        calm = ok & (np.abs(dev) < 4.0)
        s["sxy_"][srows] = np.where(calm, sxy + a * (dev * load - sxy), sxy)
        s["sxx_"][srows] = np.where(calm, sxx + a * (load * load - sxx), sxx)
        s["hi_"][srows] = np.where(calm, np.fmax(hi, load_abs - np.fmax(load, 0.0)), hi)
        rise = np.where(settling & ~np.isnan(rise), np.fmin(rise, 0.0), rise)
        excess = np.where(settling & by_peers & ~np.isnan(excess), np.fmin(excess, 0.0), excess)
        return rise.reshape(n, N_SENSORS), excess.reshape(n, N_SENSORS)

    def _ref_excess(
        self, srows: np.ndarray, gap: np.ndarray, load_gap: np.ndarray, by_peers: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        s = self.sensors_
        usual = s["gap_"][srows]
        usual_at_load = s["lgap_"][srows]
        seen = s["gap_seen_"][srows]
        allow = np.tile(self._peer_enter(), len(gap) // N_SENSORS)
        warm = seen >= self.warmup_s
        excess = np.where(warm, gap - usual, gap - allow)
        at_load = np.where(warm, load_gap - usual_at_load, load_gap - allow)
        vetoed = by_peers & ~np.isnan(excess) & ~np.isnan(at_load)
        excess = np.where(vetoed, np.fmin(excess, at_load), excess)
        ok = ~np.isnan(gap)
        a = np.where(seen < self.warmup_s, 1.0 / (seen + 1.0), decay(1.0, self.offset_half_life_s))
        quiet = ~(np.nan_to_num(excess) > self.stack_enter_c / 2)
        for name, old, new in (("gap_", usual, gap), ("lgap_", usual_at_load, load_gap)):
            step = np.where(np.isnan(old), new, old + a * (new - np.nan_to_num(old)))
            s[name][srows] = np.where(quiet & ~np.isnan(new), step, old)
        s["gap_seen_"][srows] = seen + (quiet & ok)
        return excess, np.where(warm, at_load, np.nan)

    def _ref_score(
        self,
        rise: np.ndarray,
        excess: np.ndarray,
        x: np.ndarray,
        limits: np.ndarray,
        young: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(all="ignore"):
            peer_enter = np.r_[self.peer_enter_c, self.peer_enter_c, [self.stack_enter_c] * 8]
            parts = np.stack(
                [
                    np.where(young, np.nan, rise) / self.rise_enter_c,
                    excess / peer_enter[None, :],
                    (x - (limits - self.margin_c)) / self.margin_c + 1.0,
                ]
            )
            score = np.nanmax(np.nan_to_num(parts, nan=-np.inf).max(axis=0), axis=1)
            gpu_rise = nanmedian(rise, axis=1)
        score = np.where(np.isinf(score), np.nan, score)
        return score, gpu_rise

    def _ref_step_gpus(
        self, frame: Frame, i: int, t_ms: int, score: np.ndarray, trace: Trace
    ) -> list[Finding]:
        keys = frame.gpus.keys
        opened, closed = self.gpu_open_.step(keys, score, t_ms)
        out = []
        for key in opened:
            row = frame.gpus.index[key]
            start = int(self.gpu_open_.over_since(key))
            self.gpu_open_.episodes[key] = Episode(started_ms=start, raised_ms=t_ms)
            out.append(self._gpu_finding(frame, row, i, t_ms, trace))
        for key in closed:
            row = frame.gpus.index[key]
            out.append(self._gpu_finding(frame, row, i, t_ms, trace, end=t_ms))
            self.gpu_open_.episodes.pop(key, None)
        return out

    def _ref_step_racks(self, frame: Frame, t_ms: int, gpu_rise: np.ndarray) -> list[Finding]:
        racks: dict[str, list[int]] = {}
        for row, labels in enumerate(frame.gpus.labels):
            racks.setdefault(f"{labels.get('cluster', '')}/{labels.get('rack', '')}", []).append(
                row
            )
        keys = list(racks)
        rrows = self.racks_.rows(keys)
        score = np.full(len(keys), np.nan)
        for j, (_rkey, members) in enumerate(racks.items()):
            r = gpu_rise[members]
            r = r[~np.isnan(r)]
            if len(r) < self.rack_min_gpus:
                continue
            row = rrows[j]
            last = self.racks_["last_ms_"][row]
            a = decay((t_ms - last) / 1000.0 if not np.isnan(last) else 1.0, self.rack_half_life_s)
            self.racks_["rise_"][row] += a * (float(r.mean()) - self.racks_["rise_"][row])
            self.racks_["frac_"][row] += a * (float((r > 0.5).mean()) - self.racks_["frac_"][row])
            self.racks_["last_ms_"][row] = t_ms
            frac_ok = self.racks_["frac_"][row] >= self.rack_fraction
            score[j] = self.racks_["rise_"][row] / self.rack_enter_c if frac_ok else 0.0
        opened, closed = self.rack_open_.step(keys, score, t_ms)
        out = []
        for key in opened:
            start = int(self.rack_open_.over_since(key))
            self.rack_open_.episodes[key] = Episode(started_ms=start, raised_ms=t_ms)
            out.append(self._rack_finding(frame, key, racks[key], t_ms))
        for key in closed:
            out.append(self._rack_finding(frame, key, racks[key], t_ms, end=t_ms))
            self.rack_open_.episodes.pop(key, None)
        return out

    def _ref_refresh_open(self, frame: Frame, trace: Trace) -> list[Finding]:
        last = frame.steps - 1
        t_ms = int(frame.times_ms[last])
        out = []
        for key in self.gpu_open_.episodes:
            row = frame.gpus.index.get(key)
            if row is not None and not np.isnan(trace.x[row, :, last]).all():
                out.append(self._gpu_finding(frame, row, last, t_ms, trace))
        for rack_key in self.rack_open_.episodes:
            members = [
                r for r, lab in enumerate(frame.gpus.labels)
                if f"{lab.get('cluster', '')}/{lab.get('rack', '')}" == rack_key
            ]  # fmt: skip
            if members:
                out.append(self._rack_finding(frame, rack_key, members, t_ms))
        return out


def _ref_peer_groups(frame: Frame) -> np.ndarray:
    names = [
        f"{lab.get('cluster', '')}/{lab.get('rack', '')}/{lab.get('sku', '')}"
        for lab in frame.gpus.labels
    ]
    _, groups = np.unique(np.array(names), return_inverse=True)
    return groups


def _ref_gaps(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    out = np.full(x.shape, np.nan)
    for col in (0, 1):
        med, count = group_median(x[:, col], groups)
        out[:, col] = np.where(count >= 3, x[:, col] - med, np.nan)
    stacks = x[:, 2:]
    sib = nanmedian(stacks, axis=1)
    have = (~np.isnan(stacks)).sum(axis=1) >= 3
    out[:, 2:] = np.where(have[:, None], stacks - sib[:, None], np.nan)
    return out


def _ref_drivers(frame: Frame) -> np.ndarray:
    power = frame.g("power")
    limit = frame.g("power_limit")

    def board(sku: str) -> float:
        found = lookup(sku) if sku else None
        return found.board_power_watts if found else 1000.0

    boards = np.array([board(lab.get("sku", "")) for lab in frame.gpus.labels])
    scale = np.where(np.isnan(limit), boards[:, None], limit)
    rel = power / np.fmax(scale, 1.0)
    return np.stack([frame.g("bw"), rel], axis=1)


# -- a fleet that exercises every branch --------------------------------------------------
PER_RACK = 8
SKUS = ("H200", "MI300X", "MI300X", "X-unknown")  # per rack: no stacks, stacks, unknown limits


def fleet_frames(seed: int, gpus: int = 32) -> list[Callable[[], Frame]]:
    """Frames of a fleet of four racks, as factories (each detector needs its own frame).

    Rack r1 warms together (cooling), one GPU steps up alone, one stack runs hot, one GPU
    sits near its slowdown limit, sensors drop out, a GPU leaves for a frame and comes
    back, frames have 60, 37 and 1 steps, and one frame starts after a gap.
    """
    rng = np.random.default_rng(seed)
    lengths = [60] * 6 + [37, 1] + [60] * 5 + [23] + [60] * 3
    total = sum(lengths) + 40
    t = np.arange(total)
    level = 50 + 5 * (np.arange(gpus) % 3)[:, None] + 0.002 * t[None, :]
    bw = np.clip(0.5 + 0.2 * np.sin(t / 90.0)[None, :] + rng.normal(0, 0.03, (gpus, total)), 0, 1)
    mem = level + 15 * (bw - 0.5) + rng.normal(0, 0.4, (gpus, total))
    rack = np.arange(gpus) // PER_RACK
    ramp = np.clip((t - 420) / 120.0, 0, 1) * 4.0
    mem[rack == 1] += ramp  # rack r1 loses coolant
    mem[3, 480:720] += 11.0  # one GPU alone, then back: opens and closes
    near = 30
    limit = lookup("H200")
    assert limit is not None
    mem[near % gpus] = limit.memory_slowdown_c - 3.5 + rng.normal(0, 0.3, total)
    hot = mem + 8 + rng.normal(0, 0.5, (gpus, total))
    stacks = mem[:, None, :] + rng.normal(0, 0.4, (gpus, MAX_STACKS, total))
    stacks[np.isin(rack, [0])] = np.nan  # H200 rack: no stack sensors
    stacks[rack == 2, 6:, :] = np.nan  # some GPUs report six stacks
    stacks[12, 2, 540:] += 9.0  # one stack hotter than its siblings
    power = 300 + 300 * bw + rng.normal(0, 10, (gpus, total))
    power_limit = np.where(rack[:, None] == 3, np.nan, 700.0) + 0 * t[None, :]
    for a in (mem, hot, power, bw):
        a[rng.random(a.shape) < 0.03] = np.nan  # dropouts
    mem, hot, stacks = np.round(mem), np.round(hot), np.round(stacks)
    out, start = [], 0
    for k, steps in enumerate(lengths):
        gap = 40 if k == 9 else 0
        sl = slice(start + gap, start + gap + steps)
        keep = np.arange(gpus) if k != 8 else np.delete(np.arange(gpus), [5, 21])
        arrays = {"mem_temp": mem, "hot_temp": hot, "power": power,
                  "power_limit": power_limit, "bw": bw}  # fmt: skip
        out.append(_factory((start + gap) * 1000, keep, {k: v[:, sl] for k, v in arrays.items()},
                            stacks[:, :, sl]))  # fmt: skip
        start += gap + steps
    return out


def _factory(t0: int, keep: np.ndarray, signals: dict[str, np.ndarray],
             stacks: np.ndarray) -> Callable[[], Frame]:  # fmt: skip
    def make() -> Frame:
        gpus = Entities()
        for i in keep.tolist():
            r = i // PER_RACK
            gpus.add(f"c/h{i}/0", {"cluster": "c", "rack": f"r{r}", "host": f"h{i}", "gpu": "0",
                                   "sku": SKUS[r % len(SKUS)]})  # fmt: skip
        steps = stacks.shape[2]
        f = Frame(t0, 1000, steps, gpus, Entities(), Entities(), {}, stacks[keep].copy(),
                  {}, {}, {}, {}, {})  # fmt: skip
        f.gpu.update({k: v[keep].copy() for k, v in signals.items()})
        return f

    return make


def test_thermal_matches_the_reference_on_a_fleet_frame_by_frame() -> None:
    kw = {"warmup_s": 60.0, "min_on_s": 3.0, "min_off_s": 20.0}
    fast, ref = ThermalExcursions(**kw), ReferenceThermal(**kw)
    found = []
    for k, make in enumerate(fleet_frames(seed=7)):
        if k == 11:  # a restart: each reloads its own saved state
            for det in (fast, ref):
                det.load_state_dict(json.loads(json.dumps(det.state_dict())))
        f_fast, f_ref = make(), make()
        got, want = fast.update(f_fast), ref.update(f_ref)
        assert got == want, f"frame {k}"
        assert_same(f_fast.scores, f_ref.scores, f"frame {k} scores")
        assert_same(f_fast.derived, f_ref.derived, f"frame {k} derived")
        found += got
    kinds = {(("host" in f.entity), f.top_cause, f.ended_ms is not None) for f in found}
    assert len({f.id for f in found}) >= 4 and len(kinds) >= 3  # GPUs and racks, open, closed
    got_state, want_state = fast.state_dict(), ref.state_dict()
    # Unused clocks: GPUs never over the threshold are not stepped (``SparseGate``).
    for state in (got_state, want_state):
        state["gpu_open"]["table"]["arrays"].pop("under_since")
    assert_same(got_state, want_state)


def test_hysteresis_clocks_the_sparse_gate_skips_are_never_read() -> None:
    """The only state the fast path leaves different: ``under_since`` of GPUs that were
    never over the threshold, which ``Hysteresis.step`` reads only for open entities."""
    h = Hysteresis(enter=1.0, exit=0.5, min_on_s=0.0, min_off_s=0.0)
    h.step(["a"], np.array([0.1]), 0)
    assert not h.is_open(["a"]).any()
    h.table["under_since"][h.table.index["a"]] = -1e9  # whatever it was
    assert h.step(["a"], np.array([2.0]), 1000) == (["a"], [])  # opening resets the clock
    assert np.isnan(h.table["under_since"][h.table.index["a"]])


def reference_worst_sensor(
    det: ThermalExcursions, x: np.ndarray, rise: np.ndarray, excess: np.ndarray, limits: np.ndarray
) -> int:
    peer_enter = np.r_[det.peer_enter_c, det.peer_enter_c, [det.stack_enter_c] * 8]
    with np.errstate(all="ignore"):
        parts = np.stack([
            rise / det.rise_enter_c,
            excess / peer_enter,
            (x - (limits - det.margin_c)) / det.margin_c + 1.0,
        ])  # fmt: skip
        per_sensor = np.nan_to_num(parts, nan=-np.inf).max(axis=0)
    per_sensor = np.where(np.isnan(x), -np.inf, per_sensor)
    return int(np.argmax(per_sensor)) if np.isfinite(per_sensor).any() else 0


def test_worst_sensor_and_number_cleaning_equal_the_numpy_forms() -> None:
    from hbmwatch.detectors.thermal_findings import _f

    det = ThermalExcursions()
    rng = np.random.default_rng(11)
    pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 7.5, -3.0, 90.0, 1e308])
    for _ in range(3000):
        x, rise, excess = (rng.choice(pool, N_SENSORS) for _ in range(3))
        x[rng.random(N_SENSORS) < 0.5] = rng.normal(60, 20)
        limits = np.r_[95.0, 89.0, [95.0] * MAX_STACKS]
        assert det._worst_sensor(x, rise, excess, limits) == reference_worst_sensor(
            det, x, rise, excess, limits
        )
    for v in [*pool.tolist(), np.float64(-2.5), 5]:
        got, want = _f(v), float(np.nan_to_num(v))
        assert got == want and np.signbit(got) == np.signbit(want)
