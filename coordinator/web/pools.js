// The fleet's pools and one pool's page: capacity bars by state, what use the cards
// count, the pool's timeline and nodes, and booking GPUs in it.

import { asOwner, asTenant, call, clearProblem, liveBookings, poolById, problem, refreshIdle,
  say, shell, state, visiblePools } from "./api.js";
import { $, MIN, at, badge, h, plural, put, scroller } from "./dom.js";
import { ganttCard, timelineWindow } from "./timeline.js";

const STATES = ["allocated", "reserved", "unbooked", "available", "provisioning", "unhealthy",
  "maintenance", "unreachable"];
// How a bar's part is named where its key would not say it.
const STATE_NAMES = { unbooked: "busy without a booking" };
const stateName = (s) => STATE_NAMES[s] || s;
// Allocatable GPUs running a process no booking covers: free in the rows, placed last.
const unbookedBusy = (pool) => pool.unbookedBusy ? h("p", { class: "hint unbooked-busy" },
  `${plural(pool.unbookedBusy, "allocatable GPU")} in unbooked use (a process no booking covers): offered last`)
  : null;

// A GPU in unbooked use is bookable (the API counts it available) but not free: the
// bar shows it apart, as busy without a booking.
function parts(row, busy = 0) {
  const allocated = Math.min(row.allocated, row.allocatable);
  const reserved = Math.min(row.reserved, row.allocatable - allocated);
  const unbooked = Math.min(busy, row.allocatable - allocated - reserved);
  return { allocated, reserved, unbooked, available: row.allocatable - allocated - reserved - unbooked,
    provisioning: row.provisioning, unhealthy: row.unhealthy, maintenance: row.maintenance,
    unreachable: row.unreachable };
}

function stateBar(row, label, busy = 0) {
  const p = parts(row, busy);
  const total = Math.max(1, row.total);
  const text = STATES.filter((s) => p[s]).map((s) => `${p[s]} ${stateName(s)}`).join(", ") || "none";
  return h("div", {},
    h("div", { class: "bar", role: "img", "aria-label": `${label}: ${text} of ${row.total}` },
      STATES.filter((s) => p[s]).map((s) =>
        h("span", { class: `s-${s}`, style: `width:${(100 * p[s]) / total}%`, title: `${stateName(s)}: ${p[s]}` }))),
    h("ul", { class: "legend" }, STATES.filter((s) => p[s]).map((s) =>
      h("li", {}, h("i", { class: `s-${s}`, "aria-hidden": "true" }), `${stateName(s)} ${p[s]}`))));
}

// What a pool's card counts beside its bar: idle bookings and GPUs busy without one.
function useCounts(pool) {
  const idle = [...state.idle.values()].filter((i) => i.poolId === pool.poolId).length;
  const busy = pool.unbookedBusy || 0;
  return h("ul", { class: "counts" },
    h("li", { class: idle ? "count warn" : "count", "data-count": "idle" },
      h("strong", {}, String(idle)), ` idle ${idle === 1 ? "booking" : "bookings"}`),
    h("li", { class: busy ? "count bad" : "count", "data-count": "unbooked-busy" },
      h("strong", {}, String(busy)), ` ${busy === 1 ? "GPU" : "GPUs"} busy without a booking`));
}

export async function fleetView(view) {
  const [pools] = await Promise.all([visiblePools(), refreshIdle()]);
  if (state.operator) {
    put(view, h("h1", {}, "Whole fleet"), h("p", { class: "muted" },
      `Every tenant's pools (an operator's key). Bookings and the calendar act for tenant ${state.tenant}.`));
  } else {
    put(view, h("h1", {}, `Pools of ${state.tenant}`));
  }
  if (!pools.length) put(view, h("p", { class: "muted" }, "No pools visible to this key."));
  const grid = h("div", { class: "grid" });
  for (const pool of pools) {
    const gpu = pool.capacity.find((r) => r.resource === "gpu");
    const node = pool.capacity.find((r) => r.resource === "node");
    grid.append(h("section", { class: "card pool-card", "aria-labelledby": `p-${pool.poolId}` },
      h("h2", { id: `p-${pool.poolId}` }, h("a", { href: `#/pool/${pool.poolId}` }, pool.name)),
      h("p", { class: "muted small" }, `${pool.gpuModel || "any GPU"} · owner ${pool.owner}`,
        pool.archived ? " · archived" : "", h("br"), h("span", { class: "id" }, pool.poolId)),
      gpu ? [h("h3", {}, `GPUs (${gpu.total})`), stateBar(gpu, "GPUs", pool.unbookedBusy)] : h("p", {}, "No GPUs yet."),
      useCounts(pool), unbookedBusy(pool),
      node ? h("p", {}, `${plural(node.total, "node")}, ${node.allocatable} allocatable`) : null));
  }
  put(view, grid);
}

export async function poolView(view, poolId) {
  const now = Date.now();
  const [pool, nodes, bookings] = await Promise.all([
    poolById(poolId),
    call("nodes.list", { ...asTenant(), poolId, limit: 500 }),
    liveBookings(poolId, now),
    refreshIdle(),
  ]);
  const win = timelineWindow(bookings, now);
  const timeline = await call("capacity.timeline", { ...asOwner(pool), poolId,
    from: win.from, to: win.to, stepMinutes: win.stepMinutes });
  put(view, h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Fleet"), " › ", pool.name),
    h("h1", { title: pool.poolId }, `Pool ${pool.name}`),
    h("p", { class: "muted small" }, `${pool.gpuModel || "any GPU"} · owner ${pool.owner} · `,
      h("span", { class: "id" }, pool.poolId)));
  const rows = pool.capacity;
  const gpu = rows.find((r) => r.resource === "gpu");
  const cols = ["total", "allocated", "reserved", "busy unbooked", "available", "unhealthy", "maintenance", "unreachable"];
  // The gpu row's GPUs in unbooked use, out of its available (as the bar shows them).
  const busy = (r) => (r.resource === "gpu" ? parts(r, pool.unbookedBusy).unbooked : 0);
  const cell = (r, c) => (c === "busy unbooked" ? (r.resource === "gpu" ? busy(r) : "—")
    : c === "available" ? r.available - busy(r) : r[c]);
  const capCard = h("section", { class: "card", "aria-labelledby": "cap-title" },
    h("h2", { id: "cap-title" }, "Capacity"), gpu ? stateBar(gpu, "GPUs", pool.unbookedBusy) : null,
    useCounts(pool), unbookedBusy(pool),
    scroller(h("table", {}, h("caption", { class: "muted" }, "Units per resource and bucket"),
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "resource"),
        cols.map((c) => h("th", { scope: "col", class: "num" }, c)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, h("th", { scope: "row" }, r.resource),
        cols.map((c) => h("td", { class: "num" }, cell(r, c)))))))));
  const nodeCard = h("section", { class: "card", "aria-labelledby": "nodes-title" },
    h("h2", { id: "nodes-title" }, `Nodes (${nodes.nodes.length})`),
    scroller(h("table", {}, h("thead", {}, h("tr", {}, ["node", "hostname", "status", "health", "last seen"]
      .map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, nodes.nodes.map((n) => h("tr", {},
        h("th", { scope: "row" }, h("a", { href: `#/node/${encodeURIComponent(n.nodeId)}` }, n.nodeId)),
        h("td", {}, n.hostname), h("td", {}, badge(n.status)),
        h("td", {}, badge(n.state.health.value)), h("td", {}, at(n.lastSeen))))))));
  put(view, capCard, ganttCard(timeline, bookings, now), bookCard(pool), nodeCard);
}

function bookCard(pool) {
  const form = h("form", { class: "inline-form", id: "book-form" },
    h("div", {}, h("label", { for: "book-gpus" }, "GPUs"),
      h("input", { id: "book-gpus", type: "number", min: "1", max: "64", value: "1", required: true })),
    h("div", {}, h("label", { for: "book-hours" }, "Hours"),
      h("input", { id: "book-hours", type: "number", min: "1", max: "168", value: "2", required: true })),
    h("div", {}, h("label", { for: "book-start" }, "Starts in (minutes)"),
      h("input", { id: "book-start", type: "number", min: "0", max: "10080", value: "0", required: true })),
    h("button", { type: "submit" }, "Book"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearProblem();
    const startIn = Number($("#book-start").value);
    const body = { tenantId: state.tenant, poolId: pool.poolId, devices: [{ class: "gpu", count: Number($("#book-gpus").value) }],
      duration: `${Number($("#book-hours").value)}h`, idempotencyKey: `console-${crypto.randomUUID()}` };
    if (startIn > 0) body.start = Date.now() + startIn * MIN;
    try {
      const r = await call("reservations.create", body);
      say(`Booked ${r.reservationId} (${r.atoms.length} atoms, ${r.state}).`);
      await shell.render(true);
    } catch (err) { say(""); problem(err, `Not booked as ${state.tenant}`, "action"); }
  });
  return h("section", { class: "card", "aria-labelledby": "book-title" },
    h("h2", { id: "book-title" }, "Book GPUs in this pool"),
    h("p", { class: "muted" }, `As tenant ${state.tenant}.`), form);
}
