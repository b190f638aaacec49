// gpufleet web console: a plain ES module, no build step, no requests beyond this origin.
// The API key lives in sessionStorage (this tab only) and goes out as a Bearer header.

import { chargebackView } from "./chargeback.js";

const $ = (sel, root = document) => root.querySelector(sel);
const store = window.sessionStorage;
const state = { key: store.getItem("gpufleet.key"), tenant: store.getItem("gpufleet.tenant"),
  operator: false, lastAlert: 0, timer: null, refresh: null, renders: 0, shown: null,
  // The bookings idle now (their open reservation.idle), by reservation id.
  idle: new Map() };
const STATES = ["allocated", "reserved", "unbooked", "available", "provisioning", "unhealthy",
  "maintenance", "unreachable"];
// How a bar's part is named where its key would not say it.
const STATE_NAMES = { unbooked: "busy without a booking" };
const stateName = (s) => STATE_NAMES[s] || s;
const LIVE = ["scheduled", "active", "noticed"];
const MIN = 60_000, HOUR = 60 * MIN, DAY = 24 * HOUR;

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    // Through the CSSOM: the page's CSP allows no inline style attributes.
    else if (k === "style") {
      for (const decl of v.split(";")) {
        const at = decl.indexOf(":");
        if (at > 0) el.style.setProperty(decl.slice(0, at).trim(), decl.slice(at + 1).trim());
      }
    }
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

function say(text) {
  $("#status").textContent = text;
}

// Anything that went wrong talking to the coordinator: an API error envelope, a seed-002
// answer (plain text or `{"error": "<word>"}`), or no answer at all (`code` NETWORK).
class ApiError extends Error {
  constructor(code, message, status = 0) {
    super(message);
    this.code = code;
    this.status = status;
  }
}

const TITLES = { NETWORK: "Coordinator unreachable", NOT_FOUND: "Not found",
  PERMISSION_DENIED: "Not allowed", UNAUTHENTICATED: "Key not accepted",
  INVALID_INPUT: "Invalid input", CAPACITY_NOT_AVAILABLE: "Does not fit",
  QUOTA_EXCEEDED: "Over quota", IDEMPOTENCY_KEY_CONFLICT: "Conflicting retry",
  UNAVAILABLE: "Coordinator busy", INTERNAL: "Coordinator error" };

// Problems are of two kinds: a view that could not load (cleared by the next load that
// works, so a lost connection disappears by itself) and an action refused (kept until
// the next action or navigation, so it is read before a refresh could wipe it).
function problem(err, context = "", kind = "load") {
  const panel = $("#problem");
  const code = err instanceof ApiError ? err.code : "ERROR";
  const title = TITLES[code] || code.replaceAll("_", " ").toLowerCase();
  panel.replaceChildren(h("strong", {}, context ? `${context}: ${title}` : title),
    h("span", {}, ` ${err.message}`));
  panel.dataset.kind = kind;
  panel.hidden = false;
}

function clearProblem(kind = null) {
  const panel = $("#problem");
  if (kind && panel.dataset.kind !== kind) return;
  panel.hidden = true;
  panel.replaceChildren();
}

function fieldErrors(details) {
  const fields = (details && details.fields) || [];
  return fields.map((f) => `${f.path}: ${f.message}`).join("; ");
}

async function send(url, init) {
  try {
    return await fetch(url, init);
  } catch (err) {
    throw new ApiError("NETWORK", `Could not reach the coordinator (${err.message}); retrying.`);
  }
}

async function failure(resp) {
  const text = await resp.text().catch(() => "");
  let data = null;
  try { data = JSON.parse(text); } catch { /* a plain text answer (seed 002) */ }
  const err = data && data.error;
  if (err && typeof err === "object") {
    const extra = fieldErrors(err.details);
    return new ApiError(err.code, extra ? `${err.message} (${extra})` : err.message, resp.status);
  }
  if (typeof err === "string") {
    return new ApiError(err.toUpperCase(), data.message || err.replaceAll("_", " "), resp.status);
  }
  const code = { 400: "INVALID_INPUT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
    404: "NOT_FOUND", 503: "UNAVAILABLE" }[resp.status] || "INTERNAL";
  return new ApiError(code, text.trim() || `HTTP ${resp.status}`, resp.status);
}

async function call(method, body) {
  const [mod, name] = method.split(".");
  const resp = await send(`/api/compute/${mod}/${name}`, {
    method: "POST",
    headers: { "Authorization": `Bearer ${state.key}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!resp.ok) {
    const err = await failure(resp);
    if (resp.status === 401) signOut(err);
    throw err;
  }
  return resp.json();
}

async function get(path) {
  const resp = await send(path, { headers: { "Authorization": `Bearer ${state.key}` } });
  if (!resp.ok) throw await failure(resp);
  return resp.json();
}

// Who a read is made for: a tenant's key reads as its tenant; an operator's key reads
// pool-wide (tenantId left out where the API allows it) or as the pool's owner, who
// always sees it, and books and reads the calendar as the tenant it acts for.
const asTenant = () => (state.operator ? {} : { tenantId: state.tenant });
const asOwner = (pool) => ({ tenantId: state.operator ? pool.owner : state.tenant });

// The pools this key sees, with names, owners and capacity rows: the whole fleet for an
// operator, the tenant's visible pools otherwise.
async function visiblePools() {
  const data = state.operator ? await call("capacity.fleet", {})
    : await call("capacity.summary", { tenantId: state.tenant });
  return data.pools;
}

async function poolById(poolId) {
  const pool = (await visiblePools()).find((p) => p.poolId === poolId);
  if (!pool) throw new ApiError("NOT_FOUND", `No pool ${poolId} is visible to this key.`, 404);
  return pool;
}

// Times are written in UTC (what the API, the CLI and the logs say); each <time> has the
// viewer's local time as its title, shown on hover.
const pad = (n) => String(n).padStart(2, "0");
const WEEKDAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const hhmm = (ms) => { const d = new Date(ms); return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}`; };
const dayHour = (ms) => `${WEEKDAYS[new Date(ms).getUTCDay()]} ${hhmm(ms)}`;
const utc = (ms) => `${new Date(ms).toISOString().slice(0, 10)} ${hhmm(ms)} UTC`;
const local = (ms) => new Date(ms).toLocaleString([], { year: "numeric", month: "short", day: "numeric",
  hour: "2-digit", minute: "2-digit", timeZoneName: "short" });
const at = (ms, text = utc(ms)) => h("time", { datetime: new Date(ms).toISOString(), title: `local time: ${local(ms)}` }, text);
const badge = (word, cls = word) => h("span", { class: `badge ${cls}` }, word);
const short = (id) => (id.length > 14 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id);
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
// Allocatable GPUs running a process no booking covers: free in the rows, placed last.
const unbookedBusy = (pool) => pool.unbookedBusy ? h("p", { class: "hint unbooked-busy" },
  `${plural(pool.unbookedBusy, "allocatable GPU")} in unbooked use (a process no booking covers): offered last`)
  : null;
// Element.append would write a left-out (null) part as the text "null".
const put = (parent, ...kids) => parent.append(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false));
// Tables may be wider than a phone: they scroll inside their card, never the page.
const scroller = (table) => h("div", { class: "scroll" }, table);

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

// The bookings idle now, as this key may see them (the console feed's `idle`: its own
// tenant's only, every tenant's for an operator). Kept as it was if the feed is away.
async function refreshIdle() {
  try {
    const data = await get(`/api/console/alerts?after=${Number.MAX_SAFE_INTEGER}`);
    state.idle = new Map((data.idle || []).map((i) => [i.reservationId, i]));
  } catch { /* the view's own calls say what is wrong */ }
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

// ---- views ---------------------------------------------------------------------------

async function fleetView(view) {
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

// Live bookings (now or later) of a pool, as far ahead as a timeline reaches.
async function liveBookings(poolId, now) {
  const res = await call("reservations.list", { ...asTenant(), poolId, state: LIVE,
    from: now, to: now + 7 * DAY, limit: 200 });
  return res.reservations.filter((r) => r.poolId === poolId && r.end > now);
}

async function poolView(view, poolId) {
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

// The timeline's window: from the earliest start to the latest end of the bookings shown
// (now included), in at most 24 buckets of a round length, within capacity.timeline's
// limits (7 days, 336 buckets). Without bookings, the next 24 hours.
const STEPS = [5, 10, 15, 30, 60, 120, 180, 360, 720, 1440];
const MAX_SPAN = 7 * DAY;

function timelineWindow(bookings, now) {
  if (!bookings.length) {
    const from = now - (now % HOUR);
    return { from, to: from + DAY, stepMinutes: 60 };
  }
  let from = Math.min(now, ...bookings.map((r) => r.start));
  let to = Math.max(now + 15 * MIN, ...bookings.map((r) => r.end));
  // Too long a story: keep the present and what comes after it.
  if (to - from > MAX_SPAN) from = Math.max(from, now - HOUR);
  to = Math.min(to, from + MAX_SPAN);
  const stepMinutes = STEPS.find((m) => (to - from) / (m * MIN) <= 24) || 1440;
  const step = stepMinutes * MIN;
  from -= from % step;
  to = Math.min(from + MAX_SPAN, to + ((step - (to % step)) % step));
  return { from, to, stepMinutes };
}

function ganttCard(tl, bookings, now) {
  const span = tl.to - tl.from;
  const pos = (t) => `${(100 * (Math.min(Math.max(t, tl.from), tl.to) - tl.from)) / span}%`;
  const shown = bookings.filter((r) => r.end > tl.from && r.start < tl.to)
    .sort((a, b) => a.start - b.start || (a.reservationId < b.reservationId ? -1 : 1));
  const label = span > DAY ? dayHour : hhmm;
  // At most 5 ticks, on bucket edges; a phone shows every other one (`minor` hidden), so
  // they neither crowd nor overlap. The last one is set right of its mark, inside the box.
  const every = Math.ceil(tl.buckets.length / 5);
  const marks = tl.buckets.filter((_, i) => i % every === 0);
  const ticks = marks.map((b, i) => h("span", { class: [i % 2 ? "minor" : "", i && i === marks.length - 1 ? "last" : ""].join(" ").trim() || null,
    style: `left:${pos(b.start)}` }, label(b.start)));
  const rowOf = (r) => {
    const gpus = r.atoms.filter((a) => a.class === "gpu").length;
    const idle = LIVE.includes(r.state) && r.start <= now ? state.idle.get(r.reservationId) : undefined;
    const risk = r.atRisk;
    // An idle booking reads idle, not active: it holds GPUs nothing uses.
    const what = `${plural(gpus, "GPU")} · ${idle ? "idle" : r.state}${risk ? " · at risk" : ""}`;
    const whose = state.operator ? ` · ${r.tenantId}` : "";
    const text = `${r.reservationId}: ${what}, ${utc(r.start)} to ${utc(r.end)}${whose}`
      + (idle ? `; idle since ${utc(idle.idleSince)}` : "") + (risk ? `; at risk (${risk.reason}) since ${utc(risk.since)}` : "");
    const cls = ["booking", r.state, r.spot ? "spot" : "", idle ? "idle" : "", risk ? "at-risk" : ""].filter(Boolean).join(" ");
    return h("div", { class: "rowwrap" },
      h("div", { class: "rowlabel" },
        h("span", { class: "rid", title: r.reservationId }, short(r.reservationId)), " ",
        h("span", { class: "what" }, what), " ",
        idle ? h("span", { class: "badge idle mark", "data-mark": "idle" }, "idle since ", at(idle.idleSince, label(idle.idleSince))) : null, " ",
        risk ? h("span", { class: "badge risk mark", "data-mark": "at-risk", title: `since ${utc(risk.since)}` }, `at risk: ${risk.reason}`) : null,
        h("span", { class: "muted when" }, at(r.start, label(r.start)), "–", at(r.end, label(r.end)), whose)),
      h("div", { class: "row" },
        h("div", { class: cls, "data-reservation": r.reservationId, "data-idle": idle ? "true" : null,
          "data-at-risk": risk ? "true" : null, role: "img", "aria-label": text, title: text,
          style: `left:${pos(r.start)};width:calc(${pos(r.end)} - ${pos(r.start)})` }, h("span", { class: "what" }, what)),
        now > tl.from && now < tl.to ? h("span", { class: "now", style: `left:${pos(now)}`, "aria-hidden": "true" }) : null));
  };
  return h("section", { class: "card", "aria-labelledby": "tl-title" },
    h("h2", { id: "tl-title" }, "Reservation timeline"),
    h("p", { class: "muted" }, at(tl.from), " to ", at(tl.to), ` (times in UTC, local time on hover), ${tl.allocatable} allocatable GPUs; `,
      `the strip shows free whole GPUs per ${tl.stepMinutes >= 60 ? plural(tl.stepMinutes / 60, "hour") : `${tl.stepMinutes} min`}.`),
    h("div", { class: "gantt", id: "gantt" },
      h("div", { class: "axis", "aria-hidden": "true" }, ticks),
      h("div", { class: "free", role: "list", "aria-label": "Free GPUs per time bucket" },
        tl.buckets.map((b) => h("span", { role: "listitem", class: b.free ? "" : "full",
          "aria-label": `${label(b.start)} UTC: ${b.free} free, ${b.booked} booked`, title: `${label(b.start)} UTC (local ${local(b.start)}): ${b.free} free` },
          b.free))),
      shown.length ? null : h("p", { class: "muted" }, "No reservations in this window."),
      shown.map(rowOf)));
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
      await render(true);
    } catch (err) { say(""); problem(err, `Not booked as ${state.tenant}`, "action"); }
  });
  return h("section", { class: "card", "aria-labelledby": "book-title" },
    h("h2", { id: "book-title" }, "Book GPUs in this pool"),
    h("p", { class: "muted" }, `As tenant ${state.tenant}.`), form);
}

async function nodeView(view, nodeId) {
  const now = Date.now();
  const node = await call("nodes.get", { ...asTenant(), nodeId });
  const [pool, bookings] = await Promise.all([poolById(node.poolId), liveBookings(node.poolId, now)]);
  // The next booking of each atom that starts later (the holder now is the node's own word).
  const next = new Map();
  for (const r of bookings.filter((x) => x.start > now)) {
    for (const a of r.atoms) {
      if (!next.has(a.atomId) || next.get(a.atomId).start > r.start) next.set(a.atomId, r);
    }
  }
  put(view, h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Fleet"), " › ",
    h("a", { href: `#/pool/${node.poolId}`, title: node.poolId }, pool.name), " › ", node.nodeId),
    h("h1", {}, `Node ${node.nodeId} `, badge(node.status)));
  const s = node.state;
  put(view, h("section", { class: "card", "aria-labelledby": "state-title" },
    h("h2", { id: "state-title" }, "State"),
    h("table", {}, h("tbody", {},
      h("tr", {}, h("th", { scope: "row" }, "hostname"), h("td", {}, node.hostname)),
      h("tr", {}, h("th", { scope: "row" }, "reachable"), h("td", {}, badge(s.reachable.value ? "reachable" : "unreachable", s.reachable.value ? "ok" : "bad"), " since ", at(s.reachable.since))),
      h("tr", {}, h("th", { scope: "row" }, "health"), h("td", {}, badge(s.health.value), " ", s.health.reasons.join("; "))),
      h("tr", {}, h("th", { scope: "row" }, "maintenance"), h("td", {}, s.maintenance.value ? [badge("maintenance"), ` ${s.maintenance.reason} (by ${s.maintenance.by})`] : "no")),
      h("tr", {}, h("th", { scope: "row" }, "last seen"), h("td", {}, at(node.lastSeen))),
      h("tr", {}, h("th", { scope: "row" }, "resources"), h("td", {}, `${node.resources.vcpu} vCPU, ${node.resources.memoryGiB} GiB`))))),
  state.operator ? maintenanceCard(node) : null);
  const gpus = node.atoms.filter((a) => a.class === "gpu")
    .sort((a, b) => (a.attrs.gpuIndex ?? 0) - (b.attrs.gpuIndex ?? 0));
  const devices = h("div", { class: "devices", id: "devices" }, gpus.map((a) => {
    const held = a.heldBy;
    const later = next.get(a.atomId);
    const atRisk = held && a.bucket !== "allocatable";
    const name = a.attrs.gpuIndex !== undefined ? `GPU ${a.attrs.gpuIndex}` : a.deviceId;
    return h("article", { class: `device ${a.health}`, "data-device": a.deviceId, "aria-label": `${name}: ${a.health}` },
      h("h3", {}, name, " ", badge(a.health), atRisk ? [" ", badge("at risk", "risk")] : null),
      h("dl", {},
        h("dt", {}, "UUID"), h("dd", {}, a.deviceId),
        h("dt", {}, "model"), h("dd", {}, a.attrs.model || "—"),
        h("dt", {}, "bucket"), h("dd", {}, badge(a.bucket)),
        h("dt", {}, "holder"), h("dd", {}, holderBadge(held)),
        a.use ? [h("dt", {}, "use"), h("dd", { class: "use" }, useText(a.use))] : null,
        a.use && a.use.users.length ? [h("dt", {}, "users"), h("dd", { class: "users" }, usersOf(a.use, held))] : null,
        later ? [h("dt", {}, "next"), h("dd", {}, h("span", { class: "badge next" }, `${short(later.reservationId)} (${later.tenantId}) from `, at(later.start)))] : null,
        a.healthReasons.length ? [h("dt", {}, "reasons"), h("dd", {}, a.healthReasons.join("; "))] : null));
  }));
  put(view, h("section", { class: "card", "aria-labelledby": "dev-title" },
    h("h2", { id: "dev-title" }, `GPUs (${gpus.length})`), devices),
  nicCard(node.atoms.filter((a) => a.class === "nic.vf"), next),
  otherCard(node.atoms.filter((a) => !["gpu", "nic.vf", "node"].includes(a.class)), next));
}

// What runs on a GPU (issue 24): utilization, memory, how many processes.
function useText(use) {
  const util = use.smUtil === null ? "utilization unknown" : `${use.smUtil}% SM`;
  const mem = use.memoryUsedMib === null ? "" : `, ${use.memoryUsedMib} MiB`;
  return `${util}${mem}, ${use.processes} process${use.processes === 1 ? "" : "es"}`;
}

// Each process's owner, marked against the holder: its own reservation, another one,
// or none holding the GPU.
function usersOf(use, held) {
  return use.users.flatMap((u) => {
    const mine = held && !held.other && u.ownerKind === "reservation" && u.owner === held.reservationId;
    const kind = !held ? "bad" : (u.ownerKind === "reservation" && !mine ? "bad" : "info");
    return [badge(`${u.ownerKind} ${u.ownerName || short(u.owner || "?")} (pid ${u.pid})`, kind), " "];
  });
}

function holderBadge(held) {
  if (!held) return "free";
  if (held.other) return badge("another tenant", "held");
  return badge(`${short(held.reservationId)} (${held.tenantId})`, "held");
}

const deviceName = (a) => String(a.attrs.name || a.attrs.nic || a.deviceId || a.atomId);
const byName = (x, y) => deviceName(x).localeCompare(deviceName(y), undefined, { numeric: true });

// One row per NIC: its VFs (or the whole NIC without SR-IOV) summed by health and holder.
function nicCard(vfs, next) {
  if (!vfs.length) return null;
  const byNic = new Map();
  for (const a of vfs) {
    if (!byNic.has(a.deviceId)) byNic.set(a.deviceId, []);
    byNic.get(a.deviceId).push(a);
  }
  const rows = [...byNic.values()].sort((x, y) => byName(x[0], y[0]));
  const counts = (atoms, key) => {
    const c = new Map();
    for (const a of atoms) c.set(key(a), (c.get(key(a)) || 0) + 1);
    return [...c].map(([k, n]) => `${n} ${k}`).join(", ");
  };
  return h("section", { class: "card", "aria-labelledby": "nic-title" },
    h("h2", { id: "nic-title" }, `NICs (${rows.length}, ${plural(vfs.length, "bookable function")})`),
    scroller(h("table", { id: "nics" }, h("thead", {}, h("tr", {}, ["NIC", "functions", "health", "holders"]
      .map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows.map((atoms) => {
      const a = atoms[0];
      const sriov = atoms.some((x) => x.attrs.sriov);
      const speed = a.attrs.speedMbps ? ` · ${a.attrs.speedMbps / 1000} Gb/s` : "";
      const held = atoms.filter((x) => x.heldBy).length;
      const later = atoms.filter((x) => !x.heldBy && next.has(x.atomId)).length;
      return h("tr", { "data-nic": a.deviceId },
        h("th", { scope: "row" }, a.attrs.nic || a.deviceId,
          h("span", { class: "muted small" }, ` ${a.attrs.model || ""}${speed}`)),
        h("td", {}, sriov ? plural(atoms.length, "VF") : "whole NIC"),
        h("td", {}, counts(atoms, (x) => x.health)),
        h("td", {}, [held ? `${held} held` : "", later ? `${later} booked later` : ""].filter(Boolean).join(", ") || "free"));
    })))));
}

function otherCard(atoms, next) {
  if (!atoms.length) return null;
  atoms.sort(byName);
  return h("section", { class: "card", "aria-labelledby": "oth-title" },
    h("h2", { id: "oth-title" }, "Other devices"),
    scroller(h("table", {}, h("thead", {}, h("tr", {}, ["device", "class", "health", "holder"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, atoms.map((a) => {
        const later = next.get(a.atomId);
        return h("tr", {}, h("td", { title: a.atomId }, deviceName(a)), h("td", {}, a.class),
          h("td", {}, badge(a.health)),
          h("td", {}, holderBadge(a.heldBy), later ? [" ", h("span", { class: "badge next" }, `next ${short(later.reservationId)} from `, at(later.start))] : null));
      })))));
}

function maintenanceCard(node) {
  const on = node.state.maintenance.value;
  const form = h("form", { class: "inline-form", id: "maint-form" },
    on ? null : h("div", { class: "grow" }, h("label", { for: "maint-reason" }, "Reason"),
      h("input", { id: "maint-reason", required: true, maxlength: "1024", placeholder: "e.g. replace PSU" })),
    h("button", { type: "submit", class: on ? "secondary" : "" }, on ? "End maintenance" : "Start maintenance"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearProblem();
    try {
      await call("nodes.setMaintenance", { nodeId: node.nodeId, maintenance: !on, reason: on ? "" : $("#maint-reason").value });
      say(on ? `Maintenance ended on ${node.nodeId}.` : `${node.nodeId} is in maintenance.`);
      await render(true);
    } catch (err) { say(""); problem(err, "Maintenance not changed", "action"); }
  });
  return h("section", { class: "card", "aria-labelledby": "maint-title" },
    h("h2", { id: "maint-title" }, "Maintenance (operators)"), form);
}

async function calendarView(view) {
  const pools = await call("pools.list", { tenantId: state.tenant });
  const list = pools.pools || [];
  const day = new Date().toISOString().slice(0, 10);
  const poolSel = h("select", { id: "cal-pool" }, list.map((p) => h("option", { value: p.poolId }, p.name)));
  const dayInput = h("input", { id: "cal-day", type: "date", value: day, required: true });
  const form = h("form", { class: "inline-form", id: "cal-form" },
    h("div", {}, h("label", { for: "cal-pool" }, "Pool"), poolSel),
    h("div", {}, h("label", { for: "cal-day" }, "Day (UTC)"), dayInput),
    h("button", { type: "submit" }, "Show"));
  const out = h("div", { id: "cal-out" });
  const show = async () => {
    const from = `${dayInput.value}T00:00:00Z`;
    const to = new Date(Date.parse(from) + DAY).toISOString().replace(".000Z", "Z");
    const q = new URLSearchParams({ from, to, poolId: poolSel.value, tenantId: state.tenant });
    try {
      const cal = await get(`/api/capacity/calendar?${q}`);
      clearProblem();
      out.replaceChildren(h("table", { class: "cal" },
        h("caption", { class: "muted" }, `Quarter-hours of ${dayInput.value} (UTC) for tenant ${state.tenant}: limit, reserved and reservable GB`),
        h("thead", {}, h("tr", {}, ["starts", "limit GB", "reserved GB", "reservable GB"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, cal.intervals.map((iv) => h("tr", {}, h("th", { scope: "row" }, iv.startsAt.slice(11, 16)),
          h("td", { class: "num" }, iv.reservationLimitGb), h("td", { class: "num" }, iv.reservedGb),
          h("td", { class: "num" }, iv.reservableGb))))));
    } catch (err) {
      out.replaceChildren();
      problem(err, "Calendar", "action");
    }
  };
  form.addEventListener("submit", (ev) => { ev.preventDefault(); show(); });
  put(view, h("h1", {}, "Interval calendar"),
    list.length ? null : h("p", { class: "muted" }, `Tenant ${state.tenant} sees no pools.`),
    h("section", { class: "card" }, form, out));
  if (list.length) await show();
}

// ---- shell ---------------------------------------------------------------------------

async function render(force = false) {
  // After an action the user's input is done with: redraw everything and focus the page.
  if (force && document.activeElement) { document.activeElement.blur(); $("#main").focus(); }
  const view = $("#view");
  const route = location.hash || "#/";
  const [, kind, arg] = route.split("/");
  const fresh = h("div");
  const ticket = ++state.renders;
  try {
    if (kind === "pool") await poolView(fresh, decodeURIComponent(arg));
    else if (kind === "node") await nodeView(fresh, decodeURIComponent(arg));
    else if (kind === "calendar") await calendarView(fresh);
    else if (kind === "chargeback") {
      await chargebackView(fresh, { h, get, put, state, problem, clearProblem });
    }
    else await fleetView(fresh);
  } catch (err) {
    if (ticket !== state.renders || !state.key) return;
    if (!(err instanceof ApiError)) throw err;
    problem(err);
    // A page that never loaded shows nothing stale of another one; a refresh that
    // failed keeps what it last showed beneath the problem.
    if (state.shown !== route) { view.replaceChildren(); state.shown = route; }
    return;
  }
  if (ticket !== state.renders) return; // a later navigation or refresh owns the view
  clearProblem("load");
  const same = state.shown === route;
  state.shown = route;
  // Keep what the user is typing: only the data parts are replaced on a refresh.
  const active = document.activeElement;
  if (!force && same && active && view.contains(active) && active.matches("input, select")) {
    for (const id of ["devices", "gantt", "nics"]) {
      const now = $(`#${id}`, fresh), old = $(`#${id}`, view);
      if (now && old) old.replaceWith(now);
    }
    return;
  }
  // Unchanged data leaves the page alone (no flicker, focus and selection kept).
  if (!force && same && fresh.innerHTML === view.innerHTML) return;
  view.replaceChildren(...fresh.childNodes);
}

async function pollAlerts() {
  try {
    const data = await get(`/api/console/alerts?after=${state.lastAlert}`);
    if (data.idle) state.idle = new Map(data.idle.map((i) => [i.reservationId, i]));
    const list = $("#alert-list");
    for (const a of data.alerts) {
      state.lastAlert = Math.max(state.lastAlert, a.seq);
      // A use condition's end (`...Ended`) is good news, not bad.
      const bad = /unhealthy|unreachable|atRisk|missing|unmonitored|unbookedUse$|foreignUse$/.test(a.kind);
      list.prepend(h("li", { "data-kind": a.kind },
        at(a.at),
        badge(a.kind, bad ? "bad" : "info"), " ",
        h("a", { href: `#/node/${encodeURIComponent(a.nodeId)}` }, a.nodeId),
        a.deviceId ? ` · ${a.deviceId}` : "", a.reason ? ` — ${a.reason}` : ""));
      while (list.children.length > 50) list.lastChild.remove();
    }
    $("#alerts-empty").hidden = list.children.length > 0;
  } catch { /* the next poll tries again; a lost connection shows with the view */ }
}

// The key says what it is: an operator's sees the whole fleet, a tenant's its tenant's.
async function isOperator() {
  return (await call("apiKeys.self", {})).operator === true;
}

async function signedIn() {
  try {
    state.operator = await isOperator();
  } catch (err) {
    problem(err, "Sign-in");
    state.operator = false;
  }
  $("#signin").hidden = true;
  $("#view").hidden = false;
  $("#nav").hidden = false;
  $("#alerts").hidden = false;
  $("#who").textContent = state.operator ? `operator key, acting for ${state.tenant}` : `tenant ${state.tenant}`;
  render();
  pollAlerts();
  state.timer = setInterval(pollAlerts, 2000);
  // Live views redraw every 3 s; the calendar and chargeback only when asked (forms).
  state.refresh = setInterval(() => {
    if (!document.hidden && !/^#\/(calendar|chargeback)/.test(location.hash)) render();
  }, 3000);
}

function signOut(err = null) {
  store.removeItem("gpufleet.key");
  store.removeItem("gpufleet.tenant");
  state.key = state.tenant = state.shown = null;
  state.operator = false;
  // The next key sees only what it may: nothing the last key was shown stays.
  state.idle = new Map();
  state.lastAlert = 0;
  $("#alert-list").replaceChildren();
  // The next key starts at the fleet (no hashchange: nothing renders signed out).
  history.replaceState(null, "", "#/");
  clearInterval(state.timer);
  clearInterval(state.refresh);
  $("#signin").hidden = false;
  $("#view").hidden = true;
  $("#view").replaceChildren();
  $("#nav").hidden = true;
  $("#alerts").hidden = true;
  say("");
  if (err) problem(err, "Signed out", "action"); else clearProblem();
  $("#key").focus();
}

$("#signin-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  clearProblem();
  state.key = $("#key").value.trim();
  state.tenant = $("#tenant").value.trim();
  try {
    await call("capacity.summary", { tenantId: state.tenant });
  } catch (err) {
    state.key = state.tenant = null;
    problem(err, "Sign-in failed", "action");
    return;
  }
  store.setItem("gpufleet.key", state.key);
  store.setItem("gpufleet.tenant", state.tenant);
  $("#key").value = "";
  say("");
  await signedIn();
  $("#main").focus();
});
$("#signout").addEventListener("click", () => signOut());
window.addEventListener("hashchange", () => {
  if (!state.key) return;
  say("");
  clearProblem();
  render().then(() => $("#main").focus());
});
if (state.key && state.tenant) signedIn();
