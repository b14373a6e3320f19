"""Which process owns what: ``i/N`` shards chosen by a stable hash, as Prometheus' ``hashmod``.

Collector processes share targets by the hash of the target's URL; detector processes share
GPUs and workloads by the hash of their cluster and rack.  The hash is Prometheus' relabel
``hashmod`` (the low 8 bytes of the MD5 of the value, big-endian, modulo N), so a user who
already shards Prometheus by ``__address__`` can reason about ours the same way.  Nothing is
stored: a process started with another N re-balances at once, and every process sharing a
fleet must be started with the same N.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' ``hashmod`` relabel action (model/relabel/relabel.go).

    >>> hashmod("http://10.0.0.1:9400/metrics", 4) in range(4)
    True
    >>> hashmod("foo", 1)
    0
    """
    digest = hashlib.md5(value.encode()).digest()
    return int.from_bytes(digest[8:], "big") % modulus


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``total`` (0-based), written ``index/total``."""

    index: int = 0
    total: int = 1

    def __post_init__(self) -> None:
        if self.total < 1 or not 0 <= self.index < self.total:
            raise ValueError(f"shard {self.index}/{self.total}: need 0 <= i < N and N >= 1")

    @classmethod
    def parse(cls, text: str | None) -> Shard:
        """``"1/4"`` is shard 1 of 4; None or "" is the whole (``0/1``).

        >>> Shard.parse("1/4")
        Shard(index=1, total=4)
        >>> Shard.parse("4/4")
        Traceback (most recent call last):
        ...
        ValueError: shard 4/4: need 0 <= i < N and N >= 1
        """
        if not text:
            return cls()
        match = _SHARD.match(text)
        if match is None:
            raise ValueError(f"shard {text!r} is not of the form i/N (0-based: 0/2, 1/2)")
        return cls(int(match.group(1)), int(match.group(2)))

    @property
    def whole(self) -> bool:
        return self.total == 1

    def owns(self, key: str) -> bool:
        """Whether the thing identified by ``key`` is this shard's."""
        return self.whole or hashmod(key, self.total) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.total}"
