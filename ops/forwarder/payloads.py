"""The bodies the targets get: Alertmanager's API v2 alert list, and for webhooks
Alertmanager's own webhook payload (version 4), so a receiver written for
Alertmanager's `webhook_config` reads the forwarder's unchanged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ops.forwarder.conditions import AmAlert, rfc3339

RECEIVER = "gpufleet"
# What Alertmanager writes as the `endsAt` of a firing alert in a webhook payload.
ZERO_TIME = "0001-01-01T00:00:00Z"

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's fingerprint of a label set (Prometheus' FNV-1a 64 over the sorted
    names and values, each followed by 0xff), as it appears in its API and webhooks."""
    h = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode():
                h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ _SEPARATOR) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def _common(dicts: Sequence[Mapping[str, str]]) -> dict[str, str]:
    first = dicts[0] if dicts else {}
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}


def webhook_payload(alerts: Sequence[AmAlert], status: str, external_url: str) -> dict[str, Any]:
    """One notification about `alerts` (all of one gpufleet alert), grouped by
    alertname as Alertmanager's default route would."""
    labels = [a.labels for a in alerts]
    names = {a.labels.get("alertname", "") for a in alerts}
    group = {"alertname": names.pop()} if len(names) == 1 else {}
    group_key = "{}:{" + ",".join(f'{k}="{v}"' for k, v in sorted(group.items())) + "}"
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": RECEIVER,
        "groupLabels": group,
        "commonLabels": _common(labels),
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "alerts": [
            {
                "status": status,
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "startsAt": rfc3339(a.starts_ms),
                "endsAt": ZERO_TIME if status == "firing" else rfc3339(a.ends_ms or a.starts_ms),
                "generatorURL": external_url,
                "fingerprint": fingerprint(a.labels),
            }
            for a in alerts
        ],
    }
