// One node's page: its state, each GPU (health, holder, what runs on it, the next
// booking), its NICs and other devices, and maintenance for operators.

import { asTenant, call, clearProblem, liveBookings, poolById, problem, say, shell,
  state } from "./api.js";
import { $, at, badge, h, plural, put, scroller, short } from "./dom.js";

export async function nodeView(view, nodeId) {
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
      await shell.render(true);
    } catch (err) { say(""); problem(err, "Maintenance not changed", "action"); }
  });
  return h("section", { class: "card", "aria-labelledby": "maint-title" },
    h("h2", { id: "maint-title" }, "Maintenance (operators)"), form);
}
