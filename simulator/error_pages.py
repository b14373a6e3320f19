"""The GPU error families on the simulated exporters' pages, in the real exporters' spelling.

dcgm-exporter: ``DCGM_FI_DEV_XID_ERRORS`` (a gauge of the last XID, 0 for none, with
``err_code``/``err_msg`` labels), the remapped-row counters, ``DCGM_FI_DEV_ROW_REMAP_FAILURE``
and ``DCGM_FI_DEV_ROW_REMAP_PENDING`` (help texts as in dcgm-exporter's counter lists).
DME: ``gpu_afid_errors{afid_index, severity}`` (the AFIDs of the last RAS event, none before
one) and ``gpu_health`` (1 healthy).  Written only where a scenario has GPU error faults or
pods (``GpuErrors.enabled``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hbmwatch.collector.spellings import dcgm, dme
from hbmwatch.simulator.errors import xid_message
from hbmwatch.simulator.fleet import Node

if TYPE_CHECKING:
    from hbmwatch.simulator.exposition import Exposition

#: Help texts as the exporters write them (the spelling tables keep the names and texts).
_ERROR_HELP = {f.name: f.help for f in dcgm.ERROR_FAMILIES}
XID_FIELD = dcgm.XID_FIELDS[0]
XID_HELP = "Value of the last XID error encountered."
AFID_HELP = "Last Occured RAS Event associated AMD Field Identifier list"  # sic, DME's text
HEALTH_HELP = "Health of the GPU (1 healthy, 0 unhealthy)"


def _quote(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in pairs)


def dcgm_error_families(
    exp: Exposition, node: Node, out: list[str], blank: list[bool] | None
) -> None:
    """Append the XID and row-remap families of a dcgm-exporter node page to ``out``."""
    errors = exp.errors
    assert errors is not None
    gpus = list(node.gpus)
    xid_rows = []
    for g in gpus:
        code = int(errors.last_xid[g])
        extra = [("err_code", str(code)), ("err_msg", xid_message(code))]
        pods = exp.pod_pairs(g, "dcgm")
        xid_rows.append((_quote(exp.dcgm_pairs(g) + sorted(extra + pods)), float(code)))
    exp._family(out, XID_FIELD, XID_HELP, "gauge", xid_rows)
    labels = [exp._dcgm_labels[g] for g in gpus]
    by_metric = {(f.metric, f.labels.get("severity")): f.name for f in dcgm.ERROR_FAMILIES}
    values = {
        by_metric["gpu_row_remaps_total", "uncorrectable"]: ("counter", errors.rows[gpus, 1]),
        by_metric["gpu_row_remaps_total", "correctable"]: ("counter", errors.rows[gpus, 0]),
        by_metric["gpu_row_remap_failed", None]: ("gauge", errors.failed[gpus]),
        by_metric["gpu_row_remap_pending", None]: ("gauge", errors.pending[gpus]),
    }
    for name, (kind, column) in values.items():
        rows = [
            (lab, dcgm.NOT_SUPPORTED if blank and blank[i] else float(v))
            for i, (lab, v) in enumerate(zip(labels, column.tolist(), strict=True))
        ]
        exp._family(out, name, _ERROR_HELP[name], kind, rows)


def dme_error_families(exp: Exposition, node: Node, out: list[str]) -> None:
    """Append ``gpu_afid_errors`` and ``gpu_health`` to a DME node page's ``out``."""
    errors = exp.errors
    assert errors is not None
    afid_rows: list[tuple[str, float]] = []
    health_rows: list[tuple[str, float]] = []
    for g in node.gpus:
        labels = exp._dme_labels[g][0]  # a device-level verdict: partition 0's labels
        event = errors.afids.get(g)
        if event is not None:
            codes, severity = event
            afid_rows.extend(
                (f'afid_index="{i}",{labels},severity="{severity}"', float(code))
                for i, code in enumerate(codes)
            )
        health_rows.append((labels, 1.0 if errors.healthy(g) else 0.0))
    exp._family(out, dme.AFID_ERRORS, AFID_HELP, "gauge", afid_rows)
    exp._family(out, dme.HEALTH, HEALTH_HELP, "gauge", health_rows)
