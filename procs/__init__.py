"""Process plumbing every gpufleet daemon and command shares, declared once: settings
from a model (`settings/`), reaching NATS (`nats`), running until signalled with
systemd's readiness protocol and logging set up (`signals`, `systemd`), and throttled
warnings (`log_throttle`). `shared/` stays the wire contract; this is how a process
runs."""
