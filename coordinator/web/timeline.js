// A pool's reservation timeline: its live bookings on a window scaled to them, over a
// strip of the free whole GPUs per time bucket (capacity.timeline), idle and at-risk
// bookings marked.

import { LIVE, state } from "./api.js";
import { DAY, HOUR, MIN, at, dayHour, h, hhmm, local, plural, short, utc } from "./dom.js";

// The timeline's window: from the earliest start to the latest end of the bookings shown
// (now included), in at most 24 buckets of a round length, within capacity.timeline's
// limits (7 days, 336 buckets). Without bookings, the next 24 hours.
const STEPS = [5, 10, 15, 30, 60, 120, 180, 360, 720, 1440];
const MAX_SPAN = 7 * DAY;

export function timelineWindow(bookings, now) {
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

export function ganttCard(tl, bookings, now) {
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
