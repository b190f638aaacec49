"""One cumulative counter's recent samples, for burst rates (`agent.health`): what a
counter rose by over the last window, against a baseline at most that old.

The samples sit in two arrays (8 bytes a value, 8 a time) rather than a tuple per
sample (about 120 bytes each): at a 0.5 s poll a minute's window of the five burst
counters of eight GPUs is 4,800 samples, 0.5 MB of the agent's 30 MB as tuples, 77 KB
as arrays (issue 30 point 7, bench/agent_bench.py). Pure; a window is never changed,
`advance` returns the next one."""

from __future__ import annotations

from array import array

import msgspec


class CounterWindow(msgspec.Struct, frozen=True):
    """Samples oldest first: `values[i]` read at `times[i]` (monotonic seconds)."""

    values: array[int]
    times: array[float]

    @classmethod
    def empty(cls) -> CounterWindow:
        return cls(array("q"), array("d"))

    def __len__(self) -> int:
        return len(self.values)

    def advance(self, value: int, now: float, window_s: float) -> tuple[CounterWindow, int, float]:
        """The window once `value` is read at `now`, and the baseline (value, time) to
        rate that reading against: the newest sample at least `window_s` old, else the
        oldest one kept, else this reading itself. Samples above `value` are dropped (the
        counter went down: the GPU was reset, it starts over); of those older than the
        window only the newest is kept, as the next baseline."""
        cutoff = now - window_s
        values, times = array("q"), array("d")
        oldest: tuple[int, float] | None = None
        old: tuple[int, float] | None = None
        for v, at in zip(self.values, self.times, strict=True):
            if v > value:
                continue
            if oldest is None:
                oldest = (v, at)
            if at <= cutoff:
                old = (v, at)
            else:
                values.append(v)
                times.append(at)
        if old is not None:
            values.insert(0, old[0])
            times.insert(0, old[1])
        values.append(value)
        times.append(now)
        base = old or oldest or (value, now)
        return CounterWindow(values, times), base[0], base[1]
