"""Slurm jobs on this host's GPUs, from a job-mapping directory -> ``gpu_workload_info``.

The directory has dcgm-exporter's ``--hpc-job-mapping-dir`` layout (NVIDIA/dcgm-exporter,
internal/pkg/transformation/hpc.go): one regular file per GPU, named by the GPU's index
(``0``, ``1``, ...), holding the id of each job running on it, one per line; a Slurm
prolog writes the file and the epilog removes it.  Other names (MIG UUIDs, dot files)
and folders are skipped, as dcgm-exporter skips them.  The directory is read on every
collection (a few small files), so a job that ends leaves the series at once.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path

from hbmwatch import log
from hbmwatch.collector.attribution import METRIC
from hbmwatch.collector.translate import Collected
from hbmwatch.records import SeriesKey

logger = log.get("hbmwatch.collector.slurm")

#: A job id longer than this is no Slurm job id (a stray file): skipped.
MAX_JOB_ID = 64
#: At most this many job ids per GPU file (GPU sharing); the rest are counted as capped.
MAX_JOBS_PER_GPU = 64


class SlurmJobMapping:
    """A local source: one ``gpu_workload_info{host, gpu, job} 1`` per job on each GPU."""

    kind = "slurm"

    def __init__(
        self,
        directory: str | Path,
        static_labels: Mapping[str, str] | None = None,
        *,
        host: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.static = dict(static_labels or {})
        self.host = self.static.get("host") or host or socket.gethostname()
        self._failing = False

    def collect(self, ts_ms: int) -> Collected:
        out = Collected()
        try:
            entries = sorted(self.directory.iterdir(), key=lambda p: p.name)
        except OSError as exc:
            self._fail(f"cannot read the job-mapping directory {self.directory}: {exc}")
            return out
        self._failing = False
        for path in entries:
            if path.name.isascii() and path.name.isdigit() and path.is_file():
                self._read(out, path, ts_ms)
        return out

    def _read(self, out: Collected, path: Path, ts_ms: int) -> None:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return  # the epilog removed it between listing and reading: the job ended
        jobs = list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
        place = {
            "cluster": self.static.get("cluster", ""),
            "rack": self.static.get("rack", ""),
            "host": self.host,
            "gpu": str(int(path.name)),
        }
        for i, job in enumerate(jobs):
            if i >= MAX_JOBS_PER_GPU:
                out.drop("label_cap", len(jobs) - i, why=f"{path}: over {MAX_JOBS_PER_GPU} jobs")
                break
            if len(job) > MAX_JOB_ID or not job.isprintable():
                out.drop("malformed", why=f"{path}: not a job id: {job[:40]!r}")
                continue
            out.add(SeriesKey(METRIC, {**place, "job": job}), ts_ms, 1.0)

    def _fail(self, why: str) -> None:
        if not self._failing:
            logger.warning("slurm job mapping unreadable", error=why)
        self._failing = True
