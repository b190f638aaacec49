// gpufleet web console: plain ES modules, no build step, no requests beyond this origin.
// This one is the shell: signing in and out, routing #/… to its view, redrawing the
// live views, and the alert feed beside them.

import { ApiError, call, clearProblem, get, problem, say, shell, state, store } from "./api.js";
import { calendarView } from "./calendar.js";
import { chargebackView } from "./chargeback.js";
import { $, at, badge, h } from "./dom.js";
import { nodeView } from "./node.js";
import { fleetView, poolView } from "./pools.js";

// The views sign out and redraw through these (they cannot import this module).
shell.signOut = signOut;
shell.render = render;

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
      await chargebackView(fresh);
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
