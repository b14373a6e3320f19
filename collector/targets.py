"""Scrape targets: from the settings, and from a target file re-read when it changes.

A target file is JSON (a list) or TOML (``[[targets]]``) of entries like the settings':

```json
[{"kind": "dme", "url": "http://10.0.0.7:5000/metrics",
  "labels": {"cluster": "c1", "rack": "r12", "host": "node7"}}]
```

(the simulator's ``/targets`` answer is such a list).  A file that fails to parse keeps the
previous targets and says why in the log; the collector never stops over it.

With ``collector.shard = "i/N"`` a collector keeps only the targets whose URL hashes to
shard i (``hbmwatch.sharding``, Prometheus' ``hashmod``).  The filter runs on every
``current()``, so a re-read target file re-balances too, and nothing is remembered: a
restart with another N re-balances at once.

With ``[[collector.kubernetes.exporters]]`` the exporter pods found on the API server join
them (``collector/kubernetes.py``): listed once when the engine starts (``start``), then
every ``refresh_seconds`` (``watch``); an API error keeps the last pods.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from hbmwatch import log
from hbmwatch.settings import CollectorSettings, TargetSettings
from hbmwatch.sharding import Shard
from hbmwatch.validation import ConfigError

if TYPE_CHECKING:
    from hbmwatch.collector.kubernetes import KubernetesDiscovery

logger = log.get("hbmwatch.collector")
_TARGETS = TypeAdapter(list[TargetSettings])


@dataclass(frozen=True)
class Target:
    kind: str
    url: str
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    interval_seconds: float = 1.0
    timeout_seconds: float = 0.0  # 0: default_timeout(interval_seconds)
    mapping: str | None = None
    #: kind = prometheus: whose series to read back, and the label naming the host.
    sources: tuple[str, ...] = field(default=(), hash=False, compare=False)
    host_label: str | None = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        if self.timeout_seconds <= 0:
            object.__setattr__(self, "timeout_seconds", default_timeout(self.interval_seconds))

    @property
    def id(self) -> str:
        return f"{self.kind} {self.url}"


#: The shortest default deadline.  A 1 s scrape cut at 0.8 s turned a page that came 1 s
#: late on a starved 2-core collector host into a down target (every host down, its faults
#: unseen, in a 20-minute `hbmwatch up`); a late page is a late scrape, its skipped ticks counted.
DEFAULT_TIMEOUT_FLOOR_S = 5.0


def default_timeout(interval_s: float) -> float:
    """0.8 x the interval, at least 5 s and at most Prometheus' default of 10 s."""
    return min(max(0.8 * interval_s, DEFAULT_TIMEOUT_FLOOR_S), 10.0)


def resolve(entry: TargetSettings, defaults: CollectorSettings) -> Target:
    interval = entry.interval_seconds or defaults.interval_seconds
    timeout = entry.timeout_seconds or defaults.timeout_seconds or default_timeout(interval)
    if entry.kind == "mapped" and not entry.mapping:
        raise ConfigError(f"target {entry.url}: kind mapped needs a mapping file", field="mapping")
    sources = tuple(entry.sources or ())
    return Target(
        entry.kind,
        entry.url,
        dict(entry.labels),
        interval,
        timeout,
        entry.mapping,
        sources,
        entry.host_label,
    )


def read_config_text(path: Path, field: str) -> str:
    """A config file's text as UTF-8; an unreadable or undecodable file is a ConfigError.

    A stray Latin-1 byte (an editor saving ``é`` as 0xE9) used to raise UnicodeDecodeError
    past every handler and stop the collector; now the caller keeps what it had.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}", field=field) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line})",
            field=field,
        ) from None


def parse_target_file(path: Path) -> list[TargetSettings]:
    text = read_config_text(path, "target_file")
    try:
        data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot parse: {exc}", field="target_file") from None
    except RecursionError:
        raise ConfigError(f"{path}: cannot parse: nested too deeply", field="target_file") from None
    if isinstance(data, dict):
        data = data.get("targets", [])
    try:
        return _TARGETS.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise ConfigError(f"{path}: targets{where}: {first['msg']}", field="target_file") from None


class TargetSet:
    """The current targets: configured ones plus the file's, reloaded on change, less those
    of other shards."""

    def __init__(self, settings: CollectorSettings, extra: list[Target] | None = None) -> None:
        self.settings = settings
        self.shard = Shard.parse(settings.shard)
        #: Targets before the shard's filter, at the last ``current()``.
        self.total = 0
        self._static = [resolve(t, settings) for t in settings.targets] + list(extra or [])
        self._file = Path(settings.target_file) if settings.target_file else None
        self._file_stamp: tuple[float, int] | None = None
        self._from_file: list[Target] = []
        self.last_error: str | None = None
        self.discovery: KubernetesDiscovery | None = None
        if settings.kubernetes.exporters:
            from hbmwatch.collector.kubernetes import KubernetesDiscovery  # imports this module

            self.discovery = KubernetesDiscovery(settings.kubernetes, settings)

    def current(self) -> list[Target]:
        if self._file is not None:
            self._reload()
        seen: dict[str, Target] = {}
        found = self.discovery.targets if self.discovery is not None else []
        for target in self._static + self._from_file + found:
            seen.setdefault(target.id, target)
        self.total = len(seen)
        return [t for t in seen.values() if self.shard.owns(t.url)]

    def _reload(self) -> None:
        assert self._file is not None
        try:
            stat = self._file.stat()
        except OSError as exc:  # missing, or a folder on its path we may not enter
            why = "is missing" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc}"
            error = f"target file {self._file} {why}; keeping the last targets"
            if error != self.last_error:
                self.last_error = error
                logger.warning(error)
            return
        stamp = (stat.st_mtime, stat.st_size)
        if stamp == self._file_stamp:
            return
        self._file_stamp = stamp
        try:
            self._from_file = [resolve(t, self.settings) for t in parse_target_file(self._file)]
            self.last_error = None
            owned = sum(self.shard.owns(t.url) for t in self._from_file)
            logger.info(
                "target file loaded",
                path=str(self._file),
                targets=len(self._from_file),
                shard=str(self.shard),
                owned=owned,
            )
        except ConfigError as exc:
            self.last_error = str(exc)
            logger.error("target file not loaded; keeping the last targets", error=str(exc))

    async def start(self) -> None:
        """The first listing of discovered targets, before the first round."""
        if self.discovery is not None:
            await self.discovery.refresh()

    async def watch(self, stop: asyncio.Event) -> None:
        """Keep discovered targets fresh until ``stop`` (returns at once without discovery)."""
        if self.discovery is not None:
            await self.discovery.run(stop)

    async def aclose(self) -> None:
        if self.discovery is not None:
            await self.discovery.aclose()
