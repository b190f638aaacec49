"""`gc_paused`: the cyclic collector is off inside the block (when asked), back on after
it, also when the block raises, and a nested block does not turn it on early."""

from __future__ import annotations

import gc

import pytest

from coordinator.runtime.gc_pause import gc_paused


def test_the_collector_is_off_inside_and_back_on_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block found it off and left it off
    assert gc.isenabled()
    with gc_paused(when=False):
        assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
