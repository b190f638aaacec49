"""`gpufleet`: the operator and tenant command line.

`gpufleet demo` runs a whole fleet locally; the other commands call a running
coordinator's API with a key (`--url`/`GPUFLEET_URL`, `--key`/`GPUFLEET_KEY`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ops import alert_forwarder, nats_auth
from ops.client import ApiClient, ApiError
from ops.demo import DemoSettings, run_demo
from ops.table import render_summary
from shared.ids import CROCKFORD


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufleet", description=__doc__)
    p.add_argument("--url", help="coordinator URL (env GPUFLEET_URL)")
    p.add_argument("--key", help="API key (env GPUFLEET_KEY)")
    sub = p.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run nats-server, a coordinator and simulated agents")
    demo.add_argument("--state-dir")
    demo.add_argument("--port", type=int, default=0)
    demo.add_argument("--interval", type=float, default=2.0, help="agent heartbeat seconds")
    demo.add_argument("--agents", type=int, default=4, choices=range(1, 5))
    demo.add_argument("--duration", type=float, help="stop after this many seconds")

    sub.add_parser("new-key", help="print a fresh key for --bootstrap-operator-key")

    call = sub.add_parser("call", help="call any API method: gpufleet call capacity.summary JSON")
    call.add_argument("method")
    call.add_argument("body", nargs="?", default="{}")

    summary = sub.add_parser("summary", help="capacity summary of a tenant as a table")
    summary.add_argument("tenant_id")

    tenant = sub.add_parser("tenant-create", help="create a tenant (operator)")
    tenant.add_argument("tenant_id")
    tenant.add_argument("--name")

    key = sub.add_parser("key-create", help="create an API key (operator)")
    key.add_argument("tenant_id")
    key.add_argument("--role", action="append", choices=("tenant", "operator"))
    key.add_argument("--label", default="")

    pool = sub.add_parser("pool-create", help="create a pool (operator)")
    pool.add_argument("tenant_id", help="owner")
    pool.add_argument("name")
    pool.add_argument("--gpu-model")

    offer = sub.add_parser("pool-offer", help="offer a pool to another tenant (owner)")
    offer.add_argument("owner", help="the owning tenant")
    offer.add_argument("pool_id")
    offer.add_argument("offer_to", help="the tenant to offer it to")

    maint = sub.add_parser("maintenance", help="put a node in or out of maintenance (operator)")
    maint.add_argument("node_id")
    maint.add_argument("--off", action="store_true", help="end maintenance")
    maint.add_argument("--reason", default="")

    auth = sub.add_parser(
        "nats-auth", help="NATS server config and per-agent credentials for a fleet (offline)"
    )
    nats_auth.add_arguments(auth)

    # The alert bridge (ops/alert_forwarder.py; also the `gpufleet-alerts` script).
    alerts = sub.add_parser("alerts", help="forward the alert stream to Alertmanager/webhooks")
    alert_forwarder.add_arguments(alerts)
    return p


def new_key() -> str:
    key_id = "".join(secrets.choice(CROCKFORD) for _ in range(16))
    return f"gpf_{key_id}_{secrets.token_urlsafe(32)}"


def _client(args: argparse.Namespace, env: Mapping[str, str]) -> ApiClient:
    url = args.url or env.get("GPUFLEET_URL") or "http://127.0.0.1:8080"
    key = args.key or env.get("GPUFLEET_KEY")
    if not key:
        raise SystemExit("gpufleet: an API key is needed (--key or GPUFLEET_KEY)")
    return ApiClient(url, key)


def _request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if args.command == "call":
        try:
            body = json.loads(args.body)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"gpufleet: body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise SystemExit("gpufleet: body must be a JSON object")
        return args.method, body
    if args.command == "summary":
        return "capacity.summary", {"tenantId": args.tenant_id}
    if args.command == "tenant-create":
        body = {"tenantId": args.tenant_id} | ({"name": args.name} if args.name else {})
        return "tenants.create", body
    if args.command == "key-create":
        return "apiKeys.create", {
            "tenantId": args.tenant_id,
            "roles": args.role or ["tenant"],
            "label": args.label,
        }
    if args.command == "pool-create":
        body = {"tenantId": args.tenant_id, "name": args.name}
        return "pools.create", body | ({"gpuModel": args.gpu_model} if args.gpu_model else {})
    if args.command == "pool-offer":
        return "pools.offer", {
            "tenantId": args.owner,
            "poolId": args.pool_id,
            "offerTo": args.offer_to,
        }
    if args.command == "maintenance":
        return "nodes.setMaintenance", {
            "nodeId": args.node_id,
            "maintenance": not args.off,
            "reason": args.reason,
        }
    raise AssertionError(args.command)


def run(argv: Sequence[str] | None, env: Mapping[str, str]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return run_demo(
            DemoSettings(
                state_dir=args.state_dir,
                port=args.port,
                interval_s=args.interval,
                duration_s=args.duration,
                agents=args.agents,
            )
        )
    if args.command == "new-key":
        print(new_key())
        return 0
    if args.command == "nats-auth":
        return nats_auth.command(args)
    if args.command == "alerts":
        return alert_forwarder.command(args, env)
    method, body = _request(args)
    try:
        result = _client(args, env).call(method, body)
    except ApiError as exc:
        error = {"code": exc.code, "message": exc.message, "details": exc.details}
        print(json.dumps({"error": error}, indent=2), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpufleet: cannot reach the coordinator: {exc}", file=sys.stderr)
        return 1
    print(render_summary(result) if args.command == "summary" else json.dumps(result, indent=2))
    return 0


def main() -> int:
    return run(sys.argv[1:], os.environ)


if __name__ == "__main__":
    sys.exit(main())
