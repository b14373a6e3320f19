"""What a real GPU's NVML says about errors and health: XID events, row remapping, retired
pages, ECC, PCIe replays, recovery action and fabric state, each call's answer or its error.

A recording for issue 18 (errors and health as canonical series): run on a GPU host, it
writes one JSON document, so the NVML source's mapping can be written and tested against
what the driver really answers (and what it refuses) without a GPU.

    python3 scripts/nvml_health_probe.py --listen-seconds 20 --out nvml_health.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import pynvml as nvml

FIELDS = [
    "NVML_FI_DEV_REMAPPED_COR",
    "NVML_FI_DEV_REMAPPED_UNC",
    "NVML_FI_DEV_REMAPPED_PENDING",
    "NVML_FI_DEV_REMAPPED_FAILURE",
    "NVML_FI_DEV_RETIRED_SBE",
    "NVML_FI_DEV_RETIRED_DBE",
    "NVML_FI_DEV_RETIRED_PENDING",
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    "NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER",
    "NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER",
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
    "NVML_FI_DEV_RESET_STATUS",
    "NVML_FI_DEV_DRAIN_AND_RESET_STATUS",
    "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS",
]
EVENT_TYPES = [
    name
    for name in dir(nvml)
    if name.startswith("nvmlEventType") and name not in ("nvmlEventTypeAll", "nvmlEventTypeNone")
]

#: nvmlFieldValue_t.valueType -> the union member holding the value
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


def plain(value: Any) -> Any:
    """NVML's ctypes structures as JSON-able dicts."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "_fields_"):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return repr(value)


def answer(call: Callable[[], Any]) -> Any:
    try:
        return {"value": plain(call())}
    except nvml.NVMLError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # a binding older than the call: record it
        return {"error": f"{type(exc).__name__}: {exc}"}


def fields(h: Any) -> dict[str, Any]:
    ids = [getattr(nvml, name) for name in FIELDS if hasattr(nvml, name)]
    names = [name for name in FIELDS if hasattr(nvml, name)]
    try:
        values = nvml.nvmlDeviceGetFieldValues(h, ids)
    except nvml.NVMLError as exc:
        return {"error": str(exc)}
    out = {}
    for name, v in zip(names, values, strict=True):
        if v.nvmlReturn != nvml.NVML_SUCCESS:
            out[name] = {"error": str(nvml.NVMLError(v.nvmlReturn))}
        else:
            out[name] = {"value": plain(getattr(v.value, _VALUE_MEMBER.get(v.valueType, "ullVal")))}
    return out


def device(h: Any) -> dict[str, Any]:
    ecc = {}
    for err, err_name in ((0, "corrected"), (1, "uncorrected")):
        for counter, counter_name in ((0, "volatile"), (1, "aggregate")):
            ecc[f"{err_name}_{counter_name}"] = answer(
                lambda e=err, c=counter: nvml.nvmlDeviceGetTotalEccErrors(h, e, c)
            )
    supported = answer(lambda: nvml.nvmlDeviceGetSupportedEventTypes(h))
    mask = supported.get("value") or 0
    return {
        "name": answer(lambda: nvml.nvmlDeviceGetName(h)),
        "uuid": answer(lambda: nvml.nvmlDeviceGetUUID(h)),
        "ecc_mode": answer(lambda: nvml.nvmlDeviceGetEccMode(h)),
        "ecc_total": ecc,
        "remapped_rows": answer(lambda: nvml.nvmlDeviceGetRemappedRows(h)),
        "row_remapper_histogram": answer(lambda: nvml.nvmlDeviceGetRowRemapperHistogram(h)),
        "retired_pages_sbe": answer(lambda: nvml.nvmlDeviceGetRetiredPages(h, 0)),
        "retired_pages_dbe": answer(lambda: nvml.nvmlDeviceGetRetiredPages(h, 1)),
        "retired_pages_pending": answer(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        "pcie_replay": answer(lambda: nvml.nvmlDeviceGetPcieReplayCounter(h)),
        "repair_status": answer(lambda: nvml.nvmlDeviceGetRepairStatus(h)),
        "fabric": answer(lambda: nvml.nvmlDeviceGetGpuFabricInfo(h)),
        "clocks_event_reasons_supported": answer(
            lambda: nvml.nvmlDeviceGetSupportedClocksEventReasons(h)
        ),
        "supported_event_types": supported,
        "supported_event_names": [name for name in EVENT_TYPES if mask & getattr(nvml, name)],
        "fields": fields(h),
    }


def listen(handles: list[Any], seconds: float) -> dict[str, Any]:
    """Register every supported event and record what arrives (XIDs are the ones that count)."""
    out: dict[str, Any] = {"registered": {}, "events": []}
    es = nvml.nvmlEventSetCreate()
    for i, h in enumerate(handles):
        try:
            mask = nvml.nvmlDeviceGetSupportedEventTypes(h)
            nvml.nvmlDeviceRegisterEvents(h, mask, es)
            out["registered"][str(i)] = mask
        except nvml.NVMLError as exc:
            out["registered"][str(i)] = f"error: {exc}"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ev = nvml.nvmlEventSetWait_v2(es, 1000)
        except nvml.NVMLError as exc:
            if "Timeout" not in str(exc):
                out["events"].append({"error": str(exc)})
                break
            continue
        out["events"].append(
            {
                "type": ev.eventType,
                "data": ev.eventData,
                "t": time.time(),
                "gpu_instance": getattr(ev, "gpuInstanceId", None),
            }
        )
    nvml.nvmlEventSetFree(es)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen-seconds", type=float, default=20.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    nvml.nvmlInit()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    report = {
        "driver": answer(nvml.nvmlSystemGetDriverVersion),
        "nvml": answer(nvml.nvmlSystemGetNVMLVersion),
        "binding": getattr(nvml, "__version__", "?"),
        "devices": [device(h) for h in handles],
        "listen": listen(handles, args.listen_seconds),
    }
    nvml.nvmlShutdown()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report)[:3000])


if __name__ == "__main__":
    main()
