"""What several tools share: the API client (`client`, sync; `async_client`), the CLI
session and its options and output (`session`, `options`, `output`), the alert stream's
durable consumer (`alerts`) and log redaction (`redact`), the embedded nats-server
(`embedded_nats`) and API keys (`keys`). Running a daemon until signalled is process
plumbing, `procs.signals`."""
