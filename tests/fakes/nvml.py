"""A stand-in for the pynvml module, shaped like an H200 (values from the real capture in
``tests/fixtures/real/h200``).  NVML does not run on the test machine; the same
collector runs against the real library on a GPU host (docs/collector.md)."""

from __future__ import annotations

from types import SimpleNamespace

NVML_ERROR_NOT_SUPPORTED = 3
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_ERROR_TIMEOUT = 10
nvmlEventTypeXidCriticalError = 0x8
SUPPORTED_EVENT_TYPES = 65439  # what the real H200 answered (nvml_health.json)


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """Module-like object; ``pcie_tx`` advances 25 MB per read and wraps at 2**32."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_MEMORY_ERROR_TYPE_CORRECTED = NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError

    def __init__(self, devices: int = 1) -> None:
        self.devices = devices
        self.pcie_tx = 2**32 - 60_000_000
        self.reads = 0
        self.calls: list[str] = []
        #: Error side (issue 18): event masks registered per device, events waiting,
        #: (corrected, uncorrected, pending, failure) rows; retired pages are unsupported
        #: as on Hopper.
        self.registered: dict[int, int] = {}
        self.waiting: list[SimpleNamespace] = []
        self.remapped = (0, 0, 0, 0)
        self.event_sets = 0

    def raise_xid(self, h: int, code: int) -> None:
        """What the driver does on an XID: an event in the set of whoever registered it."""
        if self.registered.get(h, 0) & nvmlEventTypeXidCriticalError:
            self.waiting.append(
                SimpleNamespace(device=h, eventType=nvmlEventTypeXidCriticalError, eventData=code)
            )

    def nvmlEventSetCreate(self) -> object:
        self.event_sets += 1
        return object()

    def nvmlEventSetFree(self, es: object) -> None:
        self.event_sets -= 1

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        return SUPPORTED_EVENT_TYPES

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, es: object) -> None:
        self.registered[h] = self.registered.get(h, 0) | mask

    def nvmlEventSetWait_v2(self, es: object, timeout_ms: int) -> SimpleNamespace:
        if not self.waiting:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return self.waiting.pop(0)

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return self.remapped

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-eb263b03-88ae-94c4-583e-d18c57d09aa{h}"

    def nvmlDeviceGetSerial(self, h: int) -> str:
        return "1653924101904"

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # a PCIe H200: no NVLink

    def nvmlGpmQueryDeviceSupport(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=0)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 37

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 125_750  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 1980 if clock == NVML_CLOCK_SM else 3201

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=31, memory=3)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=0, total=143771 * 2**20)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return 0

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0x4 if self.reads > 2 else 0x1  # SW power cap after a while

    def nvmlDeviceGetFieldValues(self, h: int, ids: list) -> list:
        self.reads += 1
        self.pcie_tx = (self.pcie_tx + 25_000_000) % 2**32
        values = {
            82: 40,
            83: 1_000_000 + self.reads * 125_000,
            94: 0,
            197: self.pcie_tx,
            198: 4_000_000 * self.reads,
            74: 80_707_393_000 + self.reads * 10**9,
            269: 0,
            270: 0,
        }
        out = []
        for field in ids:
            field_id = field[0] if isinstance(field, tuple) else field
            if field_id in values:
                out.append(
                    SimpleNamespace(
                        fieldId=field_id,
                        nvmlReturn=0,
                        valueType=3,
                        value=SimpleNamespace(ullVal=values[field_id]),
                    )
                )
            else:
                out.append(
                    SimpleNamespace(
                        fieldId=field_id,
                        nvmlReturn=NVML_ERROR_NOT_SUPPORTED,
                        valueType=3,
                        value=SimpleNamespace(ullVal=0),
                    )
                )
        return out
