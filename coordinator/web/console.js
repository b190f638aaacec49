// gpufleet web console: a plain ES module, no build step, no requests beyond this origin.
// The API key lives in sessionStorage (this tab only) and goes out as a Bearer header.

const $ = (sel, root = document) => root.querySelector(sel);
const store = window.sessionStorage;
const state = { key: store.getItem("gpufleet.key"), tenant: store.getItem("gpufleet.tenant"),
  lastAlert: 0, timer: null, refresh: null, renders: 0 };
const STATES = ["allocated", "reserved", "available", "provisioning", "unhealthy",
  "maintenance", "unreachable"];
const LIVE = new Set(["scheduled", "active", "noticed"]);

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

function say(text, error = false) {
  const s = $("#status");
  s.textContent = text;
  s.classList.toggle("error", error);
}

class ApiError extends Error {}

async function call(method, body) {
  const [mod, name] = method.split(".");
  const resp = await fetch(`/api/compute/${mod}/${name}`, {
    method: "POST",
    headers: { "Authorization": `Bearer ${state.key}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    if (resp.status === 401) signOut("Your key was not accepted; sign in again.");
    throw new ApiError(data.error ? `${data.error.code}: ${data.error.message}` : `HTTP ${resp.status}`);
  }
  return data;
}

async function get(path) {
  const resp = await fetch(path, { headers: { "Authorization": `Bearer ${state.key}` } });
  if (!resp.ok) throw new ApiError(`${resp.status}: ${(await resp.text()).trim()}`);
  return resp.json();
}

const time = (ms) => new Date(ms).toLocaleString([], { dateStyle: "short", timeStyle: "short" });
const hhmm = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
const badge = (word, cls = word) => h("span", { class: `badge ${cls}` }, word);
const short = (id) => (id.length > 14 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id);

function parts(row) {
  const allocated = Math.min(row.allocated, row.allocatable);
  const reserved = Math.min(row.reserved, row.allocatable - allocated);
  return { allocated, reserved, available: row.allocatable - allocated - reserved,
    provisioning: row.provisioning, unhealthy: row.unhealthy, maintenance: row.maintenance,
    unreachable: row.unreachable };
}

function stateBar(row, label) {
  const p = parts(row);
  const total = Math.max(1, row.total);
  const text = STATES.filter((s) => p[s]).map((s) => `${p[s]} ${s}`).join(", ") || "none";
  return h("div", {},
    h("div", { class: "bar", role: "img", "aria-label": `${label}: ${text} of ${row.total}` },
      STATES.filter((s) => p[s]).map((s) =>
        h("span", { class: `s-${s}`, style: `width:${(100 * p[s]) / total}%`, title: `${s}: ${p[s]}` }))),
    h("ul", { class: "legend" }, STATES.filter((s) => p[s]).map((s) =>
      h("li", {}, h("i", { class: `s-${s}`, "aria-hidden": "true" }), `${s} ${p[s]}`))));
}

// ---- views ---------------------------------------------------------------------------

async function fleetView(view) {
  const data = await call("capacity.summary", { tenantId: state.tenant });
  view.append(h("h1", {}, `Fleet of ${state.tenant}`));
  if (!data.pools.length) view.append(h("p", { class: "muted" }, "No pools visible to this tenant."));
  const grid = h("div", { class: "grid" });
  for (const pool of data.pools) {
    const gpu = pool.capacity.find((r) => r.resource === "gpu");
    const node = pool.capacity.find((r) => r.resource === "node");
    grid.append(h("section", { class: "card pool-card", "aria-labelledby": `p-${pool.poolId}` },
      h("h2", { id: `p-${pool.poolId}` }, h("a", { href: `#/pool/${pool.poolId}` }, pool.name)),
      h("p", { class: "muted" }, `${pool.poolId} · ${pool.gpuModel || "any GPU"} · owner ${pool.owner}`,
        pool.archived ? " · archived" : ""),
      gpu ? [h("h3", {}, `GPUs (${gpu.total})`), stateBar(gpu, "GPUs")] : h("p", {}, "No GPUs yet."),
      node ? h("p", {}, `${node.total} nodes, ${node.allocatable} allocatable`) : null));
  }
  view.append(grid);
}

async function poolView(view, poolId) {
  const [cap, nodes, timeline, res] = await Promise.all([
    call("capacity.byPool", { tenantId: state.tenant, poolId }),
    call("nodes.list", { tenantId: state.tenant, poolId, limit: 500 }),
    call("capacity.timeline", { tenantId: state.tenant, poolId }),
    call("reservations.list", { tenantId: state.tenant, poolId, limit: 200 }),
  ]);
  view.append(h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Fleet"), " › ", poolId),
    h("h1", {}, `Pool ${poolId}`));
  const gpu = cap.rows.find((r) => r.resource === "gpu");
  const capCard = h("section", { class: "card", "aria-labelledby": "cap-title" },
    h("h2", { id: "cap-title" }, "Capacity"), gpu ? stateBar(gpu, "GPUs") : null,
    h("table", {}, h("caption", { class: "muted" }, "Units per resource and bucket"),
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "resource"),
        ["total", "allocated", "reserved", "available", "unhealthy", "maintenance", "unreachable"]
          .map((c) => h("th", { scope: "col", class: "num" }, c)))),
      h("tbody", {}, cap.rows.map((r) => h("tr", {}, h("th", { scope: "row" }, r.resource),
        ["total", "allocated", "reserved", "available", "unhealthy", "maintenance", "unreachable"]
          .map((c) => h("td", { class: "num" }, r[c])))))));
  const nodeCard = h("section", { class: "card", "aria-labelledby": "nodes-title" },
    h("h2", { id: "nodes-title" }, `Nodes (${nodes.nodes.length})`),
    h("table", {}, h("thead", {}, h("tr", {}, ["node", "hostname", "status", "health", "last seen"]
      .map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, nodes.nodes.map((n) => h("tr", {},
        h("th", { scope: "row" }, h("a", { href: `#/node/${encodeURIComponent(n.nodeId)}` }, n.nodeId)),
        h("td", {}, n.hostname), h("td", {}, badge(n.status)),
        h("td", {}, badge(n.state.health.value)), h("td", {}, time(n.lastSeen)))))));
  view.append(capCard, ganttCard(timeline, res.reservations.filter((r) => r.poolId === poolId)),
    bookCard(poolId), nodeCard);
}

function ganttCard(tl, reservations) {
  const span = tl.to - tl.from;
  const pos = (t) => `${(100 * (Math.min(Math.max(t, tl.from), tl.to) - tl.from)) / span}%`;
  const shown = reservations.filter((r) => r.end > tl.from && r.start < tl.to && LIVE.has(r.state));
  const ticks = [];
  for (let t = tl.from; t <= tl.to; t += 3 * 3600_000) ticks.push(h("span", { style: `left:${pos(t)}` }, hhmm(t)));
  const now = Date.now();
  const card = h("section", { class: "card", "aria-labelledby": "tl-title" },
    h("h2", { id: "tl-title" }, "Reservation timeline"),
    h("p", { class: "muted" }, `${time(tl.from)} to ${time(tl.to)}, ${tl.allocatable} allocatable GPUs; `,
      "the strip shows free whole GPUs per ", `${tl.stepMinutes} min.`),
    h("div", { class: "gantt", id: "gantt" },
      h("div", { class: "axis", "aria-hidden": "true" }, ticks),
      h("div", { class: "free", role: "list", "aria-label": "Free GPUs per time bucket" },
        tl.buckets.map((b) => h("span", { role: "listitem", class: b.free ? "" : "full",
          "aria-label": `${hhmm(b.start)}: ${b.free} free, ${b.booked} booked`, title: `${hhmm(b.start)}: ${b.free} free` },
          b.free))),
      shown.length ? null : h("p", { class: "muted" }, "No reservations in this window."),
      shown.map((r) => {
        const gpus = r.atoms.filter((a) => a.class === "gpu").length;
        const label = `${r.reservationId}: ${gpus} GPU${gpus === 1 ? "" : "s"}, ${r.state}, ${hhmm(r.start)}–${hhmm(r.end)}`;
        return h("div", { class: "rowwrap" },
          h("span", { class: "rowlabel", title: r.reservationId }, short(r.reservationId)),
          h("div", { class: "row" },
            h("div", { class: `booking ${r.state}${r.spot ? " spot" : ""}`, "data-reservation": r.reservationId,
              role: "img", "aria-label": label, title: label,
              style: `left:${pos(r.start)};width:calc(${pos(r.end)} - ${pos(r.start)})` },
              `${gpus} GPU · ${r.state}`),
            now > tl.from && now < tl.to ? h("span", { class: "now", style: `left:${pos(now)}`, "aria-hidden": "true" }) : null));
      })));
  return card;
}

function bookCard(poolId) {
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
    const startIn = Number($("#book-start").value);
    const body = { tenantId: state.tenant, poolId, devices: [{ class: "gpu", count: Number($("#book-gpus").value) }],
      duration: `${Number($("#book-hours").value)}h`, idempotencyKey: `console-${crypto.randomUUID()}` };
    if (startIn > 0) body.start = Date.now() + startIn * 60_000;
    try {
      const r = await call("reservations.create", body);
      say(`Booked ${r.reservationId} (${r.atoms.length} atoms, ${r.state}).`);
      await render(true);
    } catch (err) { say(`Not booked: ${err.message}`, true); }
  });
  return h("section", { class: "card", "aria-labelledby": "book-title" },
    h("h2", { id: "book-title" }, "Book GPUs in this pool"), form);
}

async function nodeView(view, nodeId) {
  const node = await call("nodes.get", { tenantId: state.tenant, nodeId });
  const res = await call("reservations.list", { tenantId: state.tenant, poolId: node.poolId, limit: 200 });
  const holders = new Map();
  for (const r of res.reservations.filter((x) => x.state === "active" || x.state === "noticed")) {
    for (const a of r.atoms) holders.set(a.atomId, r);
  }
  view.append(h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Fleet"), " › ",
    h("a", { href: `#/pool/${node.poolId}` }, node.poolId), " › ", node.nodeId),
    h("h1", {}, `Node ${node.nodeId} `, badge(node.status)));
  const s = node.state;
  view.append(h("section", { class: "card", "aria-labelledby": "state-title" },
    h("h2", { id: "state-title" }, "State"),
    h("table", {}, h("tbody", {},
      h("tr", {}, h("th", { scope: "row" }, "hostname"), h("td", {}, node.hostname)),
      h("tr", {}, h("th", { scope: "row" }, "reachable"), h("td", {}, badge(s.reachable.value ? "reachable" : "unreachable", s.reachable.value ? "ok" : "bad"), ` since ${time(s.reachable.since)}`)),
      h("tr", {}, h("th", { scope: "row" }, "health"), h("td", {}, badge(s.health.value), " ", s.health.reasons.join("; "))),
      h("tr", {}, h("th", { scope: "row" }, "maintenance"), h("td", {}, s.maintenance.value ? [badge("maintenance"), ` ${s.maintenance.reason} (by ${s.maintenance.by})`] : "no")),
      h("tr", {}, h("th", { scope: "row" }, "last seen"), h("td", {}, time(node.lastSeen))),
      h("tr", {}, h("th", { scope: "row" }, "resources"), h("td", {}, `${node.resources.vcpu} vCPU, ${node.resources.memoryGiB} GiB`))))),
  maintenanceCard(node));
  const out = !["ready", "degraded"].includes(node.status);
  const gpus = node.atoms.filter((a) => a.class === "gpu")
    .sort((a, b) => (a.attrs.gpuIndex ?? 0) - (b.attrs.gpuIndex ?? 0));
  const devices = h("div", { class: "devices", id: "devices" }, gpus.map((a) => {
    const health = a.health;
    const bucket = out ? node.status : (health === "unhealthy" || health === "unmonitored") ? "unhealthy" : "allocatable";
    const holder = holders.get(a.atomId);
    const atRisk = holder && bucket !== "allocatable";
    const name = a.attrs.gpuIndex !== undefined ? `GPU ${a.attrs.gpuIndex}` : a.deviceId;
    return h("article", { class: `device ${health}`, "data-device": a.deviceId, "aria-label": `${name}: ${health}` },
      h("h3", {}, name, " ", badge(health), atRisk ? [" ", badge("at risk", "risk")] : null),
      h("dl", {},
        h("dt", {}, "UUID"), h("dd", {}, a.deviceId),
        h("dt", {}, "model"), h("dd", {}, a.attrs.model || "—"),
        h("dt", {}, "bucket"), h("dd", {}, badge(bucket)),
        h("dt", {}, "holder"), h("dd", {}, holder ? badge(`${short(holder.reservationId)} (${holder.tenantId})`, "held") : "free"),
        a.healthReasons.length ? [h("dt", {}, "reasons"), h("dd", {}, a.healthReasons.join("; "))] : null));
  }));
  const others = node.atoms.filter((a) => a.class !== "gpu" && a.class !== "node");
  view.append(h("section", { class: "card", "aria-labelledby": "dev-title" },
    h("h2", { id: "dev-title" }, `GPUs (${gpus.length})`), devices),
  others.length ? h("section", { class: "card", "aria-labelledby": "oth-title" },
    h("h2", { id: "oth-title" }, "Other devices"),
    h("table", {}, h("thead", {}, h("tr", {}, ["atom", "class", "health", "holder"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, others.map((a) => h("tr", {}, h("td", {}, a.atomId), h("td", {}, a.class), h("td", {}, badge(a.health)),
        h("td", {}, holders.get(a.atomId)?.reservationId || "free")))))) : null);
}

function maintenanceCard(node) {
  const on = node.state.maintenance.value;
  const form = h("form", { class: "inline-form", id: "maint-form" },
    on ? null : h("div", { style: "flex:1" }, h("label", { for: "maint-reason" }, "Reason"),
      h("input", { id: "maint-reason", required: true, maxlength: "1024", placeholder: "e.g. replace PSU" })),
    h("button", { type: "submit", class: on ? "secondary" : "" }, on ? "End maintenance" : "Start maintenance"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await call("nodes.setMaintenance", { nodeId: node.nodeId, maintenance: !on, reason: on ? "" : $("#maint-reason").value });
      say(on ? `Maintenance ended on ${node.nodeId}.` : `${node.nodeId} is in maintenance.`);
      await render(true);
    } catch (err) { say(`Maintenance not changed: ${err.message}`, true); }
  });
  return h("section", { class: "card", "aria-labelledby": "maint-title" },
    h("h2", { id: "maint-title" }, "Maintenance (operators)"), form);
}

async function calendarView(view) {
  const pools = await call("pools.list", { tenantId: state.tenant });
  const list = pools.pools || [];
  const day = new Date().toISOString().slice(0, 10);
  const poolSel = h("select", { id: "cal-pool" }, list.map((p) => h("option", { value: p.poolId }, `${p.name} (${p.poolId})`)));
  const dayInput = h("input", { id: "cal-day", type: "date", value: day, required: true });
  const form = h("form", { class: "inline-form", id: "cal-form" },
    h("div", {}, h("label", { for: "cal-pool" }, "Pool"), poolSel),
    h("div", {}, h("label", { for: "cal-day" }, "Day (UTC)"), dayInput),
    h("button", { type: "submit" }, "Show"));
  const out = h("div", { id: "cal-out" });
  const show = async () => {
    const from = `${dayInput.value}T00:00:00Z`;
    const to = new Date(Date.parse(from) + 86400_000).toISOString().replace(".000Z", "Z");
    const q = new URLSearchParams({ from, to, poolId: poolSel.value });
    try {
      const cal = await get(`/api/capacity/calendar?${q}`);
      out.replaceChildren(h("table", { class: "cal" },
        h("caption", { class: "muted" }, `Quarter-hours of ${dayInput.value} (UTC): your limit, reserved and reservable GB`),
        h("thead", {}, h("tr", {}, ["starts", "limit GB", "reserved GB", "reservable GB"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, cal.intervals.map((iv) => h("tr", {}, h("th", { scope: "row" }, iv.startsAt.slice(11, 16)),
          h("td", { class: "num" }, iv.reservationLimitGb), h("td", { class: "num" }, iv.reservedGb),
          h("td", { class: "num" }, iv.reservableGb))))));
    } catch (err) { out.replaceChildren(h("p", { class: "status error" }, err.message)); }
  };
  form.addEventListener("submit", (ev) => { ev.preventDefault(); show(); });
  view.append(h("h1", {}, "Interval calendar"), h("section", { class: "card" }, form, out));
  if (list.length) await show();
}

// ---- shell ---------------------------------------------------------------------------

async function render(force = false) {
  // After an action the user's input is done with: redraw everything and focus the page.
  if (force && document.activeElement) { document.activeElement.blur(); $("#main").focus(); }
  const view = $("#view");
  const [, kind, arg] = (location.hash || "#/").split("/");
  const fresh = h("div");
  const ticket = ++state.renders;
  try {
    if (kind === "pool") await poolView(fresh, decodeURIComponent(arg));
    else if (kind === "node") await nodeView(fresh, decodeURIComponent(arg));
    else if (kind === "calendar") await calendarView(fresh);
    else await fleetView(fresh);
  } catch (err) {
    if (err instanceof ApiError) { say(err.message, true); return; }
    throw err;
  }
  if (ticket !== state.renders) return; // a later navigation or refresh owns the view
  // Keep what the user is typing: only the data parts are replaced on a refresh.
  const active = document.activeElement;
  if (!force && active && view.contains(active) && active.matches("input, select")) {
    for (const id of ["devices", "gantt"]) {
      const now = $(`#${id}`, fresh), old = $(`#${id}`, view);
      if (now && old) old.replaceWith(now);
    }
    return;
  }
  // Unchanged data leaves the page alone (no flicker, focus and selection kept).
  if (!force && fresh.innerHTML === view.innerHTML) return;
  view.replaceChildren(...fresh.childNodes);
}

async function pollAlerts() {
  try {
    const data = await get(`/api/console/alerts?after=${state.lastAlert}`);
    const list = $("#alert-list");
    for (const a of data.alerts) {
      state.lastAlert = Math.max(state.lastAlert, a.seq);
      const bad = /unhealthy|unreachable|atRisk|missing|unmonitored/.test(a.kind);
      list.prepend(h("li", { "data-kind": a.kind },
        h("time", { datetime: new Date(a.at).toISOString() }, time(a.at)),
        badge(a.kind, bad ? "bad" : "info"), " ",
        h("a", { href: `#/node/${encodeURIComponent(a.nodeId)}` }, a.nodeId),
        a.deviceId ? ` · ${a.deviceId}` : "", a.reason ? ` — ${a.reason}` : ""));
      while (list.children.length > 50) list.lastChild.remove();
    }
    $("#alerts-empty").hidden = list.children.length > 0;
  } catch { /* the next poll tries again */ }
}

function signedIn() {
  $("#signin").hidden = true;
  $("#view").hidden = false;
  $("#nav").hidden = false;
  $("#alerts").hidden = false;
  $("#who").textContent = `tenant ${state.tenant}`;
  render();
  pollAlerts();
  state.timer = setInterval(pollAlerts, 2000);
  // Live views redraw every 3 s; the calendar only when asked (it is a form).
  state.refresh = setInterval(() => {
    if (!document.hidden && !location.hash.startsWith("#/calendar")) render();
  }, 3000);
}

function signOut(message = "") {
  store.removeItem("gpufleet.key");
  store.removeItem("gpufleet.tenant");
  state.key = state.tenant = null;
  clearInterval(state.timer);
  clearInterval(state.refresh);
  $("#signin").hidden = false;
  $("#view").hidden = true;
  $("#nav").hidden = true;
  $("#alerts").hidden = true;
  say(message, Boolean(message));
  $("#key").focus();
}

$("#signin-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  state.key = $("#key").value.trim();
  state.tenant = $("#tenant").value.trim();
  try {
    await call("capacity.summary", { tenantId: state.tenant });
  } catch (err) {
    say(`Sign-in failed: ${err.message}`, true);
    return;
  }
  store.setItem("gpufleet.key", state.key);
  store.setItem("gpufleet.tenant", state.tenant);
  $("#key").value = "";
  say("");
  signedIn();
  $("#main").focus();
});
$("#signout").addEventListener("click", () => signOut());
window.addEventListener("hashchange", () => { say(""); render().then(() => $("#main").focus()); });
if (state.key && state.tenant) signedIn();
