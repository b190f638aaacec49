// Talking to the coordinator as the signed-in key: the tab's session (`state`; the key
// lives in sessionStorage, this tab only, and goes out as a Bearer header), the API's
// calls and their errors, what the views read as that key, and the page's notices.

import { $, DAY, h } from "./dom.js";

export const store = window.sessionStorage;
export const state = { key: store.getItem("gpufleet.key"), tenant: store.getItem("gpufleet.tenant"),
  operator: false, lastAlert: 0, timer: null, refresh: null, renders: 0, shown: null,
  // The bookings idle now (their open reservation.idle), by reservation id.
  idle: new Map() };
// What the shell does for the views, set by console.js (which imports the views, so
// they cannot import it): sign out when the key is refused, redraw after an action.
export const shell = { signOut: () => {}, render: async () => {} };
export const LIVE = ["scheduled", "active", "noticed"];

export function say(text) {
  $("#status").textContent = text;
}

// Anything that went wrong talking to the coordinator: an API error envelope, a seed-002
// answer (plain text or `{"error": "<word>"}`), or no answer at all (`code` NETWORK).
export class ApiError extends Error {
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
export function problem(err, context = "", kind = "load") {
  const panel = $("#problem");
  const code = err instanceof ApiError ? err.code : "ERROR";
  const title = TITLES[code] || code.replaceAll("_", " ").toLowerCase();
  panel.replaceChildren(h("strong", {}, context ? `${context}: ${title}` : title),
    h("span", {}, ` ${err.message}`));
  panel.dataset.kind = kind;
  panel.hidden = false;
}

export function clearProblem(kind = null) {
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

export async function call(method, body) {
  const [mod, name] = method.split(".");
  const resp = await send(`/api/compute/${mod}/${name}`, {
    method: "POST",
    headers: { "Authorization": `Bearer ${state.key}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!resp.ok) {
    const err = await failure(resp);
    if (resp.status === 401) shell.signOut(err);
    throw err;
  }
  return resp.json();
}

export async function get(path) {
  const resp = await send(path, { headers: { "Authorization": `Bearer ${state.key}` } });
  if (!resp.ok) throw await failure(resp);
  return resp.json();
}

// Who a read is made for: a tenant's key reads as its tenant; an operator's key reads
// pool-wide (tenantId left out where the API allows it) or as the pool's owner, who
// always sees it, and books and reads the calendar as the tenant it acts for.
export const asTenant = () => (state.operator ? {} : { tenantId: state.tenant });
export const asOwner = (pool) => ({ tenantId: state.operator ? pool.owner : state.tenant });

// The pools this key sees, with names, owners and capacity rows: the whole fleet for an
// operator, the tenant's visible pools otherwise.
export async function visiblePools() {
  const data = state.operator ? await call("capacity.fleet", {})
    : await call("capacity.summary", { tenantId: state.tenant });
  return data.pools;
}

export async function poolById(poolId) {
  const pool = (await visiblePools()).find((p) => p.poolId === poolId);
  if (!pool) throw new ApiError("NOT_FOUND", `No pool ${poolId} is visible to this key.`, 404);
  return pool;
}

// The bookings idle now, as this key may see them (the console feed's `idle`: its own
// tenant's only, every tenant's for an operator). Kept as it was if the feed is away.
export async function refreshIdle() {
  try {
    const data = await get(`/api/console/alerts?after=${Number.MAX_SAFE_INTEGER}`);
    state.idle = new Map((data.idle || []).map((i) => [i.reservationId, i]));
  } catch { /* the view's own calls say what is wrong */ }
}

// Live bookings (now or later) of a pool, as far ahead as a timeline reaches.
export async function liveBookings(poolId, now) {
  const res = await call("reservations.list", { ...asTenant(), poolId, state: LIVE,
    from: now, to: now + 7 * DAY, limit: 200 });
  return res.reservations.filter((r) => r.poolId === poolId && r.end > now);
}
