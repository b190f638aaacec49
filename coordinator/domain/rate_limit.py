"""Per-key token buckets, bounded in memory (pure; `now` in seconds is passed).

Ingest keeps one bucket per node id, so a flood on one node's subjects is dropped
there and degrades only that node. Memory is bounded whatever the keys: a bucket that
has refilled is no different from no bucket at all, so such buckets are pruned when
the table is full; if it is still full (a flood of distinct ids), new keys are refused
until it drains — existing nodes keep their buckets and are unaffected.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass(slots=True)
class RateLimiter:
    rate: float  # tokens per second
    burst: int
    max_keys: int = 100_000
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    # A prune that freed nothing is not retried before this (a flood of new keys must
    # not make every message scan the table).
    _next_prune: float = 0.0

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, key: str, now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                if now < self._next_prune:
                    return False
                self.prune(now)
                if len(self._buckets) >= self.max_keys:
                    self._next_prune = now + 1.0
                    return False
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        elif now > bucket.at:
            # Inline min/max: this runs for every message ingested.
            tokens = bucket.tokens + (now - bucket.at) * self.rate
            bucket.tokens = tokens if tokens < self.burst else float(self.burst)
            bucket.at = now
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def prune(self, now: float) -> None:
        """Forget every bucket that would be full by now."""
        full = [
            key
            for key, b in self._buckets.items()
            if b.tokens + max(0.0, now - b.at) * self.rate >= self.burst
        ]
        for key in full:
            del self._buckets[key]
