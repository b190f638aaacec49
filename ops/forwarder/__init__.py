"""The alert forwarder's parts: `conditions` (what an alert means to Alertmanager and
which conditions are firing), `payloads` (Alertmanager's API v2 and webhook bodies),
`targets` (one delivery state and bounded retry queue per target), `source` (the
JetStream consumer, kept alive and recreated) and `redact` (no secret in a log line).
`ops.alert_forwarder` wires them and owns the command line."""
