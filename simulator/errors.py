"""GPU error faults as the exporters show them: XIDs, AFIDs, row remapping, health, a dead GPU.

State at ``t`` is a function of the faults and ``t`` alone (no random draws: the other
streams stay what they were).  What each kind does, from its onset:

* ``xid_fatal``: one error event (NVIDIA: XID 79, fell off the bus; AMD: a fatal RAS event
  with AFIDs 30 and 25); the GPU stops working (its services stall: ``dead``), and
  ``magnitude`` seconds later its fields read blank (dcgm: the not-supported sentinel; DME:
  the GPU's lines are gone but ``gpu_afid_errors`` and ``gpu_health`` 0).  Until ``end``
  (a reset), if it has one.
* ``xid_storm``: benign events, ``magnitude`` a minute, evenly spaced, cycling through its
  codes (a repeat of one code would not show in dcgm's last-XID gauge); nothing physical.
* ``row_remap_failure``: uncorrectable remapped rows rise to ``magnitude`` over the ramp
  with a remap pending; at onset + ramp the remap fails (``DCGM_FI_DEV_ROW_REMAP_FAILURE``
  1) with XID 64; the GPU keeps running but needs service.
"""

from __future__ import annotations

import math

import numpy as np

from hbmwatch.gpu_errors import lookup
from hbmwatch.simulator.fleet import Fleet
from hbmwatch.simulator.scenario import ERROR_FAULTS, Fault, FaultKind
from hbmwatch.skus import Vendor
from hbmwatch.validation import ConfigError

#: DME's severity label of a RAS event's AFIDs, by fault kind.
AFID_SEVERITY = {FaultKind.XID_FATAL: "fatal", FaultKind.XID_STORM: "non_fatal_corrected"}
#: The codes a GPU error fault reports when the scenario names none, by vendor.  NVIDIA:
#: XID 79 (fell off the bus); benign application XIDs 13/31/43 cycled (a repeat of one code
#: is invisible in dcgm's last-XID gauge); XID 64 (row remap recording failed).  AMD: AFIDs
#: 30 and 25 (DME's documented example of a fatal RAS event's AFID list).
DEFAULT_CODES: dict[tuple[FaultKind, Vendor], tuple[int, ...]] = {
    (FaultKind.XID_FATAL, Vendor.NVIDIA): (79,),
    (FaultKind.XID_FATAL, Vendor.AMD): (30, 25),
    (FaultKind.XID_STORM, Vendor.NVIDIA): (13, 31, 43),
    (FaultKind.ROW_REMAP_FAILURE, Vendor.NVIDIA): (64,),
}


def fault_codes(fault: Fault, vendor: Vendor) -> tuple[int, ...]:
    """The codes a GPU error fault reports on a GPU of ``vendor``."""
    return fault.codes or DEFAULT_CODES[(fault.kind, vendor)]


def check_error_fault(fault: Fault, vendor: Vendor, where: str) -> None:
    """Refuse what the simulator cannot show: row remaps on AMD, AMD codes nobody named."""
    if fault.kind is FaultKind.ROW_REMAP_FAILURE and vendor is not Vendor.NVIDIA:
        raise ConfigError(f"{where}: row_remap_failure is simulated on NVIDIA GPUs only",
                          field=f"{where}.host")  # fmt: skip
    if fault.codes is None and (fault.kind, vendor) not in DEFAULT_CODES:
        raise ConfigError(
            f"{where}: a {fault.kind.value} fault on {vendor.value} needs codes (AFIDs)",
            field=f"{where}.codes",
        )


class GpuErrors:
    """Per-GPU error state; ``update(t)`` sets it for ``t`` seconds into the run."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        n = fleet.size
        self.faults = [
            (f, fleet.gpu_index(f.target.host, f.target.gpu))  # type: ignore[arg-type]
            for f in fleet.scenario.faults
            if f.kind in ERROR_FAULTS
        ]
        #: Whether the exporters write the error families at all: only where a scenario
        #: has GPU error faults or pods, so the other scenarios' pages stay as they were.
        self.enabled = bool(self.faults) or any(r.pods for r in fleet.scenario.racks)
        self.last_xid = np.zeros(n, dtype=np.int64)
        self.afids: dict[int, tuple[tuple[int, ...], str]] = {}
        self.rows = np.zeros((n, 2), dtype=np.int64)  # correctable, uncorrectable
        self.pending = np.zeros(n, dtype=bool)
        self.failed = np.zeros(n, dtype=bool)
        self.dead = np.zeros(n, dtype=bool)
        self.blank = np.zeros(n, dtype=bool)

    def update(self, t: float) -> None:
        self.last_xid[:] = 0
        self.afids.clear()
        for arr in (self.rows, self.pending, self.failed, self.dead, self.blank):
            arr[...] = 0
        latest: dict[int, float] = {}
        for fault, g in self.faults:
            if t < fault.onset:
                continue
            active = fault.end is None or t < fault.end
            when, codes = self._last_event(fault, g, t)
            if when is not None and when >= latest.get(g, -math.inf):
                latest[g] = when
                self._report(fault, g, codes)
            if fault.kind is FaultKind.XID_FATAL and active:
                self.dead[g] = True
                self.blank[g] = t >= fault.onset + fault.effective_magnitude
            elif fault.kind is FaultKind.ROW_REMAP_FAILURE:
                self._remap(fault, g, t, active)

    def _last_event(self, fault: Fault, g: int, t: float) -> tuple[float | None, tuple[int, ...]]:
        """When the fault's last event by ``t`` happened, and its codes."""
        codes = fault_codes(fault, self.fleet.gpus[g].sku.vendor)
        if fault.kind is FaultKind.XID_FATAL:
            return fault.onset, codes
        if fault.kind is FaultKind.ROW_REMAP_FAILURE:
            failed_at = fault.onset + fault.ramp
            return (failed_at, codes) if t >= failed_at else (None, codes)
        period = 60.0 / max(fault.effective_magnitude, 1e-9)
        stop = t if fault.end is None else min(t, fault.end - 1e-9)
        k = math.floor((stop - fault.onset) / period + 1e-9)
        return fault.onset + k * period, (codes[k % len(codes)],)

    def _report(self, fault: Fault, g: int, codes: tuple[int, ...]) -> None:
        if self.fleet.gpus[g].sku.vendor.value == "amd":
            self.afids[g] = (codes, AFID_SEVERITY.get(fault.kind, "fatal"))
        else:
            self.last_xid[g] = codes[-1]

    def _remap(self, fault: Fault, g: int, t: float, active: bool) -> None:
        progress = 1.0 if fault.ramp <= 0 else min(1.0, (t - fault.onset) / fault.ramp)
        self.rows[g, 1] += max(1, math.ceil(fault.effective_magnitude * progress))
        failed = t >= fault.onset + fault.ramp
        self.pending[g] = active and not failed
        self.failed[g] = active and failed

    def healthy(self, g: int) -> bool:
        """DME's ``gpu_health``: unhealthy while the GPU is dead (until its reset)."""
        return not bool(self.dead[g])


def xid_message(code: int) -> str:
    """dcgm-exporter's ``err_msg`` for a code (``No Error`` for 0)."""
    return "No Error" if code == 0 else lookup("xid", code).meaning
