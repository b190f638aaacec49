"""Process plumbing of a coordinator: logs, metrics, the GC pause, the heap's generations."""
