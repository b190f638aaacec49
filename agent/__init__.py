"""The per-host agent: NVML and sysfs inventory, health, heartbeats on NATS."""
