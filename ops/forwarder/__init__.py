"""The alert forwarder's parts: `conditions` (what an alert means to Alertmanager and
which conditions are firing), `payloads` (Alertmanager's API v2 and webhook bodies),
`targets` (one delivery state and bounded retry queue per target), `settings` and
`command` (its command line). It reads the stream through `ops.kit.alerts` and keeps
secrets out of its logs with `ops.kit.redact`; `daemon` wires them."""
