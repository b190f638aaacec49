// Chargeback page (issue 35): GPU memory reserved by interval reservations against what
// was used, per 15-minute interval of a UTC day, from GET /api/capacity/consumption.
// A tenant sees its own reserved-against-used chart; an operator also sees the fleet's
// unused commitment and on-demand use (every tenant, unattributed use included).
// Plain SVG drawn here (no library, nothing fetched from elsewhere); colours by class.

import { clearProblem, get, problem, state } from "./api.js";
import { dayWindow, h, put, utcDay } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const QUARTER = 15 * 60_000;
const MAX_PAGE = 3360; // the API's largest page: 35 days of quarters
// The stacked parts of a quarter's bar, bottom up: covered + unused = reserved.
export const PARTS = [
  ["coveredGb", "c-covered", "reserved and used"],
  ["unusedGb", "c-unused", "reserved, not used"],
  ["onDemandGb", "c-ondemand", "used on demand (above the reservation)"],
];

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// Every row of the window, following the pages.
export async function readConsumption(params) {
  const rows = [];
  let cursor = null;
  do {
    const q = new URLSearchParams({ ...params, limit: String(MAX_PAGE) });
    if (cursor) q.set("cursor", cursor);
    const page = await get(`/api/capacity/consumption?${q}`);
    rows.push(...page.intervals);
    cursor = page.nextCursor;
  } while (cursor);
  return rows;
}

// One entry per quarter of [from, to): the rows of that quarter summed (tenants, pools).
export function byQuarter(rows, from, to) {
  const start = Date.parse(from);
  const n = Math.round((Date.parse(to) - start) / QUARTER);
  const out = Array.from({ length: n }, (_, k) => ({ at: start + k * QUARTER,
    reservedGb: 0, usedGb: 0, coveredGb: 0, unusedGb: 0, onDemandGb: 0 }));
  for (const r of rows) {
    const k = Math.round((Date.parse(r.startsAt) - start) / QUARTER);
    if (k < 0 || k >= n) continue;
    for (const f of ["reservedGb", "usedGb", "coveredGb", "unusedGb", "onDemandGb"]) out[k][f] += r[f];
  }
  return out;
}

const round = (x) => Math.round(x * 100) / 100;

// A stacked bar per quarter with a legend and a text summary (the figure's caption).
export function chart(id, title, quarters) {
  const W = 960, H = 240, left = 44, bottom = 22, top = 8;
  const peak = Math.max(1, ...quarters.map((q) => q.coveredGb + q.unusedGb + q.onDemandGb));
  const scale = (H - top - bottom) / peak;
  const bw = (W - left) / Math.max(1, quarters.length);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
    "aria-labelledby": `${id}-title` });
  svg.append(s("title", { id: `${id}-svg-title` }, title));
  for (const frac of [0, 0.5, 1]) {
    const y = H - bottom - frac * peak * scale;
    svg.append(s("line", { x1: left, x2: W, y1: y, y2: y, class: "c-grid" }),
      s("text", { x: left - 4, y: y + 4, class: "c-axis", "text-anchor": "end" }, round(frac * peak)));
  }
  quarters.forEach((q, k) => {
    let y = H - bottom;
    const x = left + k * bw;
    for (const [field, cls, what] of PARTS) {
      const hgt = q[field] * scale;
      if (hgt <= 0) continue;
      y -= hgt;
      svg.append(s("rect", { x: x + 0.5, y, width: Math.max(1, bw - 1), height: hgt, class: cls },
        s("title", {}, `${new Date(q.at).toISOString().slice(11, 16)} UTC: ${round(q[field])} GB ${what}`)));
    }
    if (k % 8 === 0) {
      svg.append(s("text", { x, y: H - 6, class: "c-axis" }, new Date(q.at).toISOString().slice(11, 16)));
    }
  });
  const sum = (f) => round(quarters.reduce((a, q) => a + q[f], 0) / 4);
  const legend = h("ul", { class: "legend" }, PARTS.map(([field, cls, what]) =>
    h("li", {}, h("span", { class: `swatch ${cls}`, "aria-hidden": "true" }), `${what}: `,
      h("strong", { "data-total": field }, `${sum(field)} GB-h`))));
  return h("figure", { class: "chargeback", id },
    h("figcaption", { id: `${id}-title` }, title), svg, legend);
}

// The page: a UTC day, the tenant's chart, and for an operator the fleet's.
export async function chargebackView(view) {
  const dayInput = h("input", { id: "cb-day", type: "date", value: utcDay(), required: true });
  const form = h("form", { class: "inline-form", id: "cb-form" },
    h("div", {}, h("label", { for: "cb-day" }, "Day (UTC)"), dayInput),
    h("button", { type: "submit" }, "Show"));
  const out = h("div", { id: "cb-out" });
  const show = async () => {
    const { from, to } = dayWindow(dayInput.value);
    try {
      const mine = await readConsumption({ from, to, tenantId: state.tenant });
      const charts = [chart("cb-tenant",
        `Tenant ${state.tenant}: GPU memory reserved against used, per 15 minutes of ${dayInput.value} (GB)`,
        byQuarter(mine, from, to))];
      if (state.operator) {
        const fleet = await readConsumption({ from, to });
        charts.push(chart("cb-fleet",
          `Fleet: unused commitment and on-demand use, every tenant, per 15 minutes of ${dayInput.value} (GB)`,
          byQuarter(fleet, from, to)));
      }
      clearProblem();
      out.replaceChildren(...charts);
    } catch (err) {
      out.replaceChildren();
      problem(err, "Chargeback", "action");
    }
  };
  form.addEventListener("submit", (ev) => { ev.preventDefault(); show(); });
  put(view, h("h1", {}, "Chargeback"),
    h("p", { class: "muted" }, "Interval reservations commit GPU memory per 15 minutes; use fills them, and use above them is on demand. ",
      "Totals are GB-hours. The FOCUS export (gpufleet usage export) bills the same figures."),
    h("section", { class: "card" }, form, out));
  await show();
}
