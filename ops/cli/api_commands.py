"""`gpufleet api METHOD --flags` (one command per API method, its flags generated from
the method's input schema in `ops/cli/openapi.json`) and `gpufleet call METHOD JSON` (a raw
body, the answer printed as is)."""

from __future__ import annotations

import json
import secrets
from typing import Any

import click

from ops.cli.answers import show_answer
from ops.cli.api_spec import MethodSpec, methods
from ops.cli.flags import BadValue, body_from, missing, option
from ops.kit.client import method_path
from ops.kit.options import output_options, pass_session
from ops.kit.session import Session

__all__ = ["ApiGroup", "api_group", "call_cmd"]


class ApiGroup(click.Group):
    """`gpufleet api METHOD --flags`: one command per API method, made on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(methods())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        spec = methods().get(name)
        return None if spec is None else _method_command(spec)


def _method_command(spec: MethodSpec) -> click.Command:
    def callback(**given: Any) -> None:
        session = click.get_current_context().ensure_object(Session)
        base = _json_arg(given.pop("json_body", None) or "{}")
        body = body_from(spec, given, base)
        if spec.param("tenantId") is not None and "tenantId" not in body:
            who = session.tenant(None, required=False)
            if who is not None:
                body["tenantId"] = who
        if isinstance(body.get("poolId"), str):  # a pool's name, as the tables show it
            body["poolId"] = session.pool_id(body.get("tenantId"), body["poolId"])
        if isinstance(body.get("projectId"), str) and spec.name != "projects.create":
            body["projectId"] = session.project_id(body.get("tenantId"), body["projectId"])
        if spec.kind == "read" and spec.param("idempotencyKey") and "idempotencyKey" not in body:
            # A read (capacity.preview) books nothing, yet its input is create's, key
            # included: a fresh key spares the user inventing one.
            body["idempotencyKey"] = f"cli-{secrets.token_hex(8)}"
        absent = missing(spec, body)
        if absent:
            raise click.UsageError(f"{spec.name} needs {', '.join(absent)}")
        show_answer(session, spec.name, body, session.call(spec.name, body))

    params: list[click.Parameter] = [option(p) for p in spec.params]
    params.append(
        click.Option(
            ["--json", "json_body"], metavar="JSON|@FILE",
            help="a body to start from (flags override its fields)",
        )
    )  # fmt: skip
    cmd = click.Command(
        spec.name,
        params=params,
        callback=callback,
        help=f"{spec.summary}\n\n{spec.kind}, {spec.permission} @ {spec.scope}."
        + (" tenantId defaults to the key's own tenant." if spec.param("tenantId") else ""),
        short_help=spec.summary,
    )
    return output_options(cmd)  # type: ignore[no-any-return]


def _json_arg(text: str) -> dict[str, Any]:
    if text.startswith("@"):
        try:
            with open(text[1:]) as f:
                text = f.read()
        except OSError as exc:
            raise BadValue(f"cannot read {text[1:]}: {exc.strerror}") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadValue(f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadValue("body must be a JSON object")
    return body


@click.group("api", cls=ApiGroup)
def api_group() -> None:
    """Every API method, with flags from its input (e.g. `gpufleet api capacity.timeline
    --pool-id pool_… --from -1d`). `gpufleet api METHOD -h` lists them."""


@click.command("call")
@click.argument("method", required=False)
@click.argument("body", required=False, default="{}")
@output_options
@pass_session
def call_cmd(session: Session, method: str | None, body: str) -> None:
    """Call a method with a raw JSON body and print its answer as is (or as a table with
    `-o table`); no METHOD: list the methods."""
    if method is None:
        for spec in methods().values():
            click.echo(f"{spec.name:<24} {spec.kind:<5} {spec.summary}")
        return
    try:
        method_path(method)
    except ValueError:
        close = [m for m in methods() if m.startswith(method)] or list(methods())
        raise click.UsageError(
            f"{method!r} is not a method; try {', '.join(close[:6])} (gpufleet call lists them)"
        ) from None
    answer = session.call(method, _json_arg(body))
    if session.fmt in ("table", "wide", "csv"):  # asked for: else the answer as is
        from ops.cli.generic import generic_view

        session.show(generic_view(answer, session.local))
    else:
        click.echo(json.dumps(answer, indent=2))
