"""JetStream stream names: the coordinator creates the alert stream, the alert
forwarder, the Slurm bridge, `gpufleet alerts watch` and `gpufleet nats-auth` name it."""

from __future__ import annotations


def stream_name(prefix: str) -> str:
    """One stream per subject prefix, so deployments sharing a NATS server stay apart."""
    return "".join(c if c.isalnum() else "_" for c in prefix).upper() + "_ALERTS"
