"""Holding off Python's cyclic garbage collector for one stretch of bulk work.

A fleet registering allocates ~20 objects per row it writes (row dicts, views, alerts);
every ~25 % of growth of the heap makes the collector walk all of it, and with 10,000
nodes' inventories, trackers and snapshots alive those full passes were ~40 % of a
10,000-node registration (bench/registration_bench.py: 12.7 s with them, 7.6 s
without). Reference counting still frees everything that is not a cycle meanwhile, and
the collector resumes, with whatever cycles were left, once the stretch ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused(when: bool = True) -> Iterator[None]:
    """No cyclic collections inside the block (when `when`); nested blocks are fine."""
    if not when or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
