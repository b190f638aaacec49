// The interval calendar: a tenant's limit, reserved and reservable GB per quarter-hour
// of a UTC day in one pool (GET /api/capacity/calendar).

import { call, clearProblem, get, problem, state } from "./api.js";
import { dayWindow, h, put, utcDay } from "./dom.js";

export async function calendarView(view) {
  const pools = await call("pools.list", { tenantId: state.tenant });
  const list = pools.pools || [];
  const poolSel = h("select", { id: "cal-pool" }, list.map((p) => h("option", { value: p.poolId }, p.name)));
  const dayInput = h("input", { id: "cal-day", type: "date", value: utcDay(), required: true });
  const form = h("form", { class: "inline-form", id: "cal-form" },
    h("div", {}, h("label", { for: "cal-pool" }, "Pool"), poolSel),
    h("div", {}, h("label", { for: "cal-day" }, "Day (UTC)"), dayInput),
    h("button", { type: "submit" }, "Show"));
  const out = h("div", { id: "cal-out" });
  const show = async () => {
    const { from, to } = dayWindow(dayInput.value);
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
