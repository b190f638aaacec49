// The console's page kit: building elements (the page's CSP allows no inline styles),
// writing times in UTC with the viewer's local time on hover, and short words for ids
// and counts. Every view module builds its page with these.

export const $ = (sel, root = document) => root.querySelector(sel);
export const MIN = 60_000, HOUR = 60 * MIN, DAY = 24 * HOUR;

export function h(tag, attrs = {}, ...children) {
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

// Times are written in UTC (what the API, the CLI and the logs say); each <time> has the
// viewer's local time as its title, shown on hover.
const pad = (n) => String(n).padStart(2, "0");
const WEEKDAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
export const hhmm = (ms) => { const d = new Date(ms); return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}`; };
export const dayHour = (ms) => `${WEEKDAYS[new Date(ms).getUTCDay()]} ${hhmm(ms)}`;
export const utc = (ms) => `${new Date(ms).toISOString().slice(0, 10)} ${hhmm(ms)} UTC`;
export const local = (ms) => new Date(ms).toLocaleString([], { year: "numeric", month: "short", day: "numeric",
  hour: "2-digit", minute: "2-digit", timeZoneName: "short" });
export const at = (ms, text = utc(ms)) => h("time", { datetime: new Date(ms).toISOString(), title: `local time: ${local(ms)}` }, text);
export const badge = (word, cls = word) => h("span", { class: `badge ${cls}` }, word);
export const short = (id) => (id.length > 14 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id);
export const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
// A UTC day (a date input's YYYY-MM-DD; today's by default) and its [from, to) as the API
// takes them.
export const utcDay = () => new Date().toISOString().slice(0, 10);
export const dayWindow = (day) => {
  const from = `${day}T00:00:00Z`;
  return { from, to: new Date(Date.parse(from) + DAY).toISOString().replace(".000Z", "Z") };
};
// Element.append would write a left-out (null) part as the text "null".
export const put = (parent, ...kids) => parent.append(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false));
// Tables may be wider than a phone: they scroll inside their card, never the page.
export const scroller = (table) => h("div", { class: "scroll" }, table);
