"""Operator tooling: the `gpufleet` command line, its HTTP client and tables, the demo,
the embedded nats-server it starts, and `gpufleet nats-auth`. Nothing here runs inside the
coordinator or the agent; it talks to them over HTTP or starts them as processes."""
