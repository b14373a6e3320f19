"""Retired (bad) memory pages through the ``amdsmi`` library.

``amdsmi_get_gpu_bad_page_info`` lists the pages the driver retired after uncorrectable
errors, each ``{"value", "page_address", "page_size", "status"}`` with ``status`` one of
``AmdSmiMemoryPageStatus`` RESERVED, PENDING (retired at the next reset) or UNRESERVABLE;
older libraries answer the string "No bad pages found." instead of an empty list.  A library
without the call, or a GPU that refuses it, is skipped and not asked again.
"""

from __future__ import annotations

from typing import Any

from hbmwatch.collector.translate import Collected
from hbmwatch.records import SeriesKey


def read_bad_pages(
    lib: Any, handle: Any, labels: dict[str, str], out: Collected, ts_ms: int, skip: set[str]
) -> None:
    """``gpu_retired_pages{severity="uncorrectable"}`` and ``gpu_retired_pages_pending``;
    ``skip`` holds the GPUs (by ``gpu`` label) that refused the call."""
    call = getattr(lib, "amdsmi_get_gpu_bad_page_info", None)
    gpu = labels.get("gpu", "")
    if call is None or gpu in skip:
        return
    try:
        pages = call(handle)
    except Exception as exc:  # the library's own exception types depend on its build
        skip.add(gpu)
        out.drop("unsupported", why=f"bad pages: {type(exc).__name__}: {exc}")
        return
    if isinstance(pages, str):  # "No bad pages found." (older libraries)
        pages = []
    if not isinstance(pages, list | tuple):
        out.drop("malformed", why=f"bad pages: {type(pages).__name__}")
        return
    pending = sum(1 for page in pages if "PENDING" in _status(page))
    retired = SeriesKey("gpu_retired_pages", {**labels, "severity": "uncorrectable"})
    out.add(retired, ts_ms, float(len(pages) - pending))
    out.add(SeriesKey("gpu_retired_pages_pending", labels), ts_ms, 1.0 if pending else 0.0)


def _status(page: Any) -> str:
    status = page.get("status", "") if isinstance(page, dict) else ""
    return str(getattr(status, "name", status)).upper()
