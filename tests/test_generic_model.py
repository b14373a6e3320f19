"""The generic series model: causal, resumable, unit- and cadence-free scores in [0, 1]."""

from __future__ import annotations

import json

import numpy as np

from hbmwatch.detectors.generic_model import SeriesConfig, SeriesModel, score_series

T0 = 1_700_000_000_000
T0_DAY = 1_699_920_000_000  # a midnight (UTC)
STEP = 300_000  # NAB's 5 minutes


def _noisy(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 50.0 + np.cumsum(rng.normal(0, 0.05, n)) + rng.normal(0, 1.0, n)


def _times(n: int, step: int = STEP) -> np.ndarray:
    return T0 + np.arange(n, dtype=float) * step


def test_scores_lie_in_unit_interval_and_nan_stays_nan() -> None:
    x = _noisy(600)
    x[[100, 400]] = np.nan
    s = score_series(_times(600), x)
    assert np.isnan(s[[100, 400]]).all()
    rest = np.delete(s, [100, 400])
    assert ((rest >= 0) & (rest <= 1)).all()


def test_a_file_cut_short_scores_identically_up_to_the_cut() -> None:
    x = _noisy(800)
    x[500] += 15
    full = score_series(_times(800), x)
    cut = score_series(_times(520), x[:520])
    assert np.array_equal(full[:520], cut)


def test_state_round_trip_mid_series_gives_identical_scores() -> None:
    n, half = 700, 400
    x = _noisy(n)
    x[550:] += 8  # a level shift after the restart
    t = _times(n)
    whole = score_series(t, x)
    first = SeriesModel()
    score_series(t[:half], x[:half], first)
    resumed = SeriesModel()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert np.array_equal(score_series(t[half:], x[half:], resumed), whole[half:])


def test_rows_step_together_with_their_own_timestamps() -> None:
    """Many series in one model, each with its own clock and gaps, score as they would alone."""
    a, b = _noisy(300, 1), _noisy(300, 2) * 1e3
    ta, tb = _times(300), _times(300, 1_000) + 12_345
    b[50:60] = np.nan
    m = SeriesModel()
    rows = m.rows(["a", "b"])
    together = np.array(
        [m.update(rows, np.array([ta[i], tb[i]]), np.array([a[i], b[i]])) for i in range(300)]
    )
    assert np.array_equal(together[:, 0], score_series(ta, a))
    assert np.array_equal(together[:, 1], score_series(tb, b), equal_nan=True)


def test_scores_do_not_depend_on_units_or_cadence() -> None:
    """Less than a day at 5 minutes (no daily profile yet): the same at 1 s, in other units."""
    x = _noisy(240)
    x[220] += 10
    base = score_series(_times(240), x)
    assert base[220] >= SeriesModel.alert_score
    assert np.allclose(score_series(_times(240), x * 1e4 + 3e5), base, atol=1e-6)
    assert np.allclose(score_series(_times(240, 1_000), x), base, atol=1e-9)


def test_a_spike_alerts_and_noise_does_not() -> None:
    x = _noisy(1000)
    x[900] += 12
    s = score_series(_times(1000), x)
    assert s[900] >= SeriesModel.alert_score
    assert (np.delete(s, 900) < SeriesModel.alert_score).all()


def test_an_alert_onset_starts_a_refractory_period() -> None:
    """Two spikes 20 samples apart are one piece of news; one 80 samples later is another."""
    x = _noisy(1200)
    x[[900, 920, 1000]] += 15
    s = score_series(_times(1200), x)
    quiet = SeriesConfig().refractory
    assert s[900] >= SeriesModel.alert_score
    assert (s[901 : 901 + quiet] == 0.0).all()
    assert s[1000] >= SeriesModel.alert_score
    without = score_series(_times(1200), x, SeriesModel(SeriesConfig(refractory=0)))
    assert without[920] > 0.0 and (without[901 : 901 + quiet] > 0).any()


def test_a_level_shift_alerts_at_the_shift_then_becomes_normal() -> None:
    x = _noisy(1500)
    x[1000:] += 10
    s = score_series(_times(1500), x)
    assert s[1000:1003].max() >= SeriesModel.alert_score
    assert (s[1100:] < SeriesModel.alert_score).all()


def test_a_learned_daily_shape_is_not_an_anomaly_but_a_wrong_hour_is() -> None:
    """After days of the same daily steps (5-minute samples), the steps score low and the
    day's value at night stands out; without the profile it is the other way round."""
    n = 288 * 8
    hour = (np.arange(n) * 5 / 60) % 24
    x = 10 + 8 * ((hour >= 8) & (hour < 20)) + np.random.default_rng(3).normal(0, 0.3, n)
    x[288 * 7 + 24] = 18.0  # 02:00 on day eight, the day's level
    t = T0_DAY + np.arange(n, dtype=float) * STEP
    last = score_series(t, x)[288 * 7 :]
    assert last[24] > 4 * np.delete(last, 24).max()
    flat = score_series(t, x, SeriesModel(SeriesConfig(seasonal_min_days=1e9)))[288 * 7 :]
    assert flat[24] < np.delete(flat, 24).max()


def test_seasonal_profile_takes_one_time_per_entity() -> None:
    """``SeasonalProfile`` with a time per entity learns as each entity alone would."""
    from hbmwatch.detectors.scorers import SeasonalProfile

    both = SeasonalProfile(bins=4, period_s=4 * 3600, min_days=1.0)
    rows = both.rows(["a", "b"])
    alone = [SeasonalProfile(bins=4, period_s=4 * 3600, min_days=1.0) for _ in range(2)]
    for step in range(40):
        t = np.array([step * 1_800_000, step * 1_800_000 + 3_600_000])
        x = np.array([float(step % 8), float(step % 3)])
        both.learn_one(rows, x, t, np.array([1800.0, 1800.0]))
        for i, p in enumerate(alone):
            p.learn_one(p.rows(["x"]), x[i : i + 1], int(t[i]), 1800.0)
    got = both.adjust(rows, np.array([1.0, 1.0]), np.array([3_600_000, 0]))
    want = [
        p.adjust(p.rows(["x"]), np.array([1.0]), t)[0]
        for p, t in zip(alone, (3_600_000, 0), strict=True)
    ]
    assert np.allclose(got, want)


def test_trend_baseline_floor_replaces_min_scale_for_a_step() -> None:
    """``learn_one(floor=...)``: a per-entity scale floor; without it, nothing changes."""
    from hbmwatch.detectors.scorers import TrendBaseline

    plain, floored = TrendBaseline(warmup_s=0.0), TrendBaseline(warmup_s=0.0)
    rows = plain.rows(["a"])
    floored.rows(["a"])
    for i in range(5):
        plain.learn_one(rows, np.array([1.0]), i * 1000)
        floored.learn_one(rows, np.array([1.0]), i * 1000, floor=np.array([7.0]))
    assert plain.table["scale_"][0] < 1.0 < 5.0 < floored.table["scale_"][0]
