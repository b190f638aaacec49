"""A simulated GPU host, for hosts and tests without a GPU: NVML from a host profile,
injected faults, a fake sysfs tree. Production modules reach it only when asked to
simulate (`--simulate`)."""
