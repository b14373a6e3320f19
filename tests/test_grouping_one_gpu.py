"""One GPU, one page (issue 13, "one incident per fault"): alerts live on the same GPU ride
on one incident instead of each opening its own under its own cause.

Seen in `hbmwatch eval default` (seed 1 at 09:00, seed 101 at the 14:50 peak): a noisy
neighbour's GPU also throttled on power, and that throttle (which pages only because the
GPU's workload regressed) opened a `power_cap` incident beside the `co_tenant` one; a rack
losing coolant got one `power_cap` incident per host from its GPUs' power throttling at the
peak, and one `co_tenant` incident for a late regression on one of its hot GPUs.  Hand-built
findings through the alert engine; they run in milliseconds.
"""

from __future__ import annotations

from hbmwatch.alerts.engine import AlertEngine
from hbmwatch.records import Incident
from hbmwatch.taxonomy import Cause
from tests.test_alerts_engine import at
from tests.test_incident_grouping import (
    engine,
    hot_gpu,
    incidents,
    members,
    p99,
    rack_warms,
    throttle,
)


def causes(inc: Incident) -> list[str]:
    return [str(c.cause) for c in inc.causes]


def added(e: AlertEngine, inc: Incident) -> list[str]:
    return [ev.text for ev in e.incidents[inc.id].timeline if ev.kind == "alert_added"]


def test_a_throttle_that_pages_for_a_regression_on_its_gpu_joins_that_regressions_incident(
) -> None:  # fmt: skip
    e = engine()
    e.apply([p99("chat", "r2-node0", 3, 0, Cause.CO_TENANT)], at(1))
    e.apply([throttle("r2-node0", 3, 5)], at(6))  # power throttling on the same GPU
    (inc,) = incidents(e)
    assert members(e, inc) == {"P99LatencyRegression", "GPUThrottling"}
    assert causes(inc)[:2] == [Cause.CO_TENANT, Cause.POWER_CAP]  # its own cause stays, second
    # The slowdown the co-tenant is known by leads; the throttle is a symptom beside it.
    assert inc.title == ("host r2-node0 (c0) co_tenant: p99 2.4x on chat/e2e, "
                         "power throttling 45% of the time on r2-node0 gpu 3")  # fmt: skip
    assert "joined: P99LatencyRegression on this GPU" in added(e, inc)[-1]  # not silently


def test_a_throttle_on_another_gpu_of_the_host_is_its_own_incident() -> None:
    e = engine()
    e.apply([p99("chat", "r2-node0", 3, 0, Cause.CO_TENANT)], at(1))
    e.apply([throttle("r2-node0", 4, 5)], at(6))
    assert [causes(i)[0] for i in incidents(e)] == [Cause.CO_TENANT, Cause.POWER_CAP]


def test_a_regression_and_its_throttle_firing_in_one_moment_are_one_incident() -> None:
    e = engine()
    e.apply([throttle("r2-node0", 3, 0), p99("chat", "r2-node0", 3, 0, Cause.CO_TENANT)], at(1))
    (inc,) = incidents(e)
    assert causes(inc)[0] == Cause.CO_TENANT


def test_a_rack_losing_coolant_keeps_its_gpus_throttles_and_regressions_in_one_incident(
) -> None:  # fmt: skip
    e = engine()
    e.apply([rack_warms(0), hot_gpu("r0-node0", 3, 0, cause=Cause.COOLING),
             hot_gpu("r0-node1", 2, 0, cause=Cause.COOLING)], at(1))  # fmt: skip
    # A late regression on a hot GPU, ranked co_tenant on a small bandwidth excess ...
    e.apply([p99("chat", "r0-node0", 3, 60, Cause.CO_TENANT)], at(61))
    # ... and power throttling at the daily peak that pages for the GPUs' regressions.
    e.apply([p99("embed", "r0-node1", 2, 70, Cause.THERMAL),
             throttle("r0-node1", 2, 70), throttle("r0-node0", 3, 75)], at(76))  # fmt: skip
    (inc,) = incidents(e)
    assert causes(inc)[0] == Cause.COOLING and inc.title.startswith("rack r0 (c0) cooling:")
    assert members(e, inc) == {"HBMRackThermalExcursion", "HBMThermalExcursion",
                               "P99LatencyRegression", "GPUThrottling"}  # fmt: skip
    assert any("joined: this GPU's heat" in t for t in added(e, inc))


def test_a_regression_on_a_cool_gpu_of_a_warming_rack_is_not_absorbed() -> None:
    """Only the GPU whose heat the rack's cooling explains: not every GPU of the rack."""
    e = engine()
    e.apply([rack_warms(0), hot_gpu("r0-node0", 3, 0, cause=Cause.COOLING)], at(1))
    e.apply([p99("chat", "r0-node1", 5, 60, Cause.CO_TENANT)], at(61))
    assert [causes(i)[0] for i in incidents(e)] == [Cause.COOLING, Cause.CO_TENANT]


def test_a_regression_on_a_gpu_with_its_own_heat_problem_keeps_its_own_cause() -> None:
    """A GPU's own (host-wide) thermal incident is no wider cause: a co-tenant there is two."""
    e = engine()
    e.apply([hot_gpu("r0-node0", 1, 0)], at(1))
    e.apply([p99("chat", "r0-node0", 1, 60, Cause.CO_TENANT)], at(61))
    assert [causes(i)[0] for i in incidents(e)] == [Cause.THERMAL, Cause.CO_TENANT]
