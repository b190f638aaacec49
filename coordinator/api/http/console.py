"""The web console and the interactive API reference: static assets shipped in the
package (`coordinator/web/`, plain ES modules, no build step, nothing fetched from
elsewhere) and the alert feed the console polls."""

from __future__ import annotations

from pathlib import Path

import msgspec
from aiohttp import web

from coordinator.api.http.auth import authenticate, bearer_key
from coordinator.api.http.context import Services
from coordinator.api.http.render import shown_by
from coordinator.domain.disclosure import alert_seen
from shared.wire import Alert

WEB = Path(__file__).resolve().parents[2] / "web"
# Only this origin: the page can neither load nor send anything elsewhere.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def _page(name: str) -> web.Response:
    return web.Response(
        body=(WEB / name).read_bytes(),
        content_type="text/html",
        charset="utf-8",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )


def add_console_routes(app: web.Application, services: Services) -> None:
    async def console(_: web.Request) -> web.Response:
        return _page("index.html")

    async def reference(_: web.Request) -> web.Response:
        return _page("reference.html")

    async def alerts(request: web.Request) -> web.Response:
        """Alerts seen since `after` (a sequence number from the previous answer); a
        tenant's key sees its visible pools' alerts (who acted only as `operator`), of
        other tenants' reservations and use nothing, an operator's all of them. `idle`:
        the reservations idle now (their open `reservation.idle`), under the same rule."""
        key = bearer_key(request.headers.get("Authorization"), request.headers.get("X-API-Key"))
        principal = await authenticate(services.ledger, key)
        try:
            after = max(0, int(request.query.get("after", "0")))
        except ValueError:
            after = 0
        viewer = None if principal.reads_every_tenant else principal.tenant_id
        visible: set[str] | None = None
        if viewer is not None:
            visible = {p.pool_id for p in await services.ledger.pools.list_visible(viewer)}

        def seen(alert: Alert) -> Alert | None:
            if visible is not None and alert.pool_id not in visible:
                return None
            # Another tenant's reservations and use are not shown (`domain.disclosure`).
            return alert_seen(alert, viewer)

        fed = [(i.seq, a) for i in services.feed.after(after) if (a := seen(i.alert)) is not None]
        idle = [a for a in services.feed.idle.open() if seen(a) is not None]
        operator = principal.is_operator
        return web.json_response(
            {
                "last": services.feed.last_seq,
                "alerts": [
                    {"seq": seq}
                    | msgspec.to_builtins(alert)
                    # Who acted, as `maintenance.by` shows it: a tenant sees "operator".
                    | {"by": shown_by(alert.by, operator)}
                    for seq, alert in fed
                ],
                "idle": [
                    {
                        "reservationId": a.reservation_id,
                        "poolId": a.pool_id,
                        "idleSince": a.details.get("idleSince", a.since),
                    }
                    for a in idle
                ],
            }
        )

    app.router.add_get("/", console)
    app.router.add_get("/api/docs", reference)
    app.router.add_get("/api/console/alerts", alerts)
    app.router.add_static("/console/", WEB, show_index=False, follow_symlinks=False)
