"""Background work of the coordinator: named loops that write node state, flush
liveness, sweep for unreachable nodes and rebuild the rollup."""
