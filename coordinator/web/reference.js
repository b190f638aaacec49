// The interactive API reference: renders /api/openapi.json (no external assets).
const $ = (s) => document.querySelector(s);
const doc = await (await fetch("/api/openapi.json")).json();
const schemas = doc.components.schemas;
$("#ref-key").value = sessionStorage.getItem("gpufleet.key") || "";
$("#title").textContent = `${doc.info.title} ${doc.info.version}`;

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const k of kids.flat()) if (k != null) e.append(k instanceof Node ? k : String(k));
  return e;
}

function deref(s) {
  return s && s.$ref ? schemas[s.$ref.split("/").pop()] || {} : s || {};
}

function typeOf(s) {
  s = s || {};
  if (s.$ref) return s.$ref.split("/").pop();
  if (s.anyOf) return s.anyOf.map(typeOf).join(" | ");
  if (s.oneOf) return s.oneOf.map(typeOf).join(" | ");
  if (s.type === "array") return `${typeOf(s.items)}[]`;
  if (s.enum) return s.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (s.const !== undefined) return JSON.stringify(s.const);
  return s.type || "any";
}

function fields(schema, depth = 0, seen = new Set()) {
  const s = deref(schema);
  const props = s.properties || {};
  if (!Object.keys(props).length || depth > 3) return null;
  const required = new Set(s.required || []);
  return el("ul", { class: "fields" }, Object.entries(props).map(([name, p]) => {
    const inner = deref(p.items || (p.anyOf || []).find((x) => x.$ref) || p);
    const key = (p.$ref || p.items?.$ref || "");
    const nested = key && !seen.has(key) ? fields(inner, depth + 1, new Set([...seen, key])) : null;
    return el("li", {}, el("code", {}, name), required.has(name) ? " (required) " : " ",
      el("span", { class: "muted" }, typeOf(p)), p.description ? ` — ${p.description}` : "", nested);
  }));
}

for (const [path, ops] of Object.entries(doc.paths)) {
  for (const [verb, op] of Object.entries(ops)) {
    const id = `op-${op.operationId.replace(/\W/g, "-")}`;
    $("#toc").append(el("li", {}, el("a", { href: `#${id}` }, op.operationId)));
    const req = op.requestBody?.content?.["application/json"];
    const ok = op.responses?.["200"]?.content?.["application/json"];
    const x = op["x-gpufleet"] || {};
    const body = el("textarea", { id: `${id}-body`, rows: "6", cols: "60", "aria-label": `Request body of ${op.operationId}` });
    body.value = JSON.stringify(req?.example || req?.examples?.default?.value || {}, null, 2);
    const out = el("pre", { id: `${id}-out`, "aria-live": "polite" });
    const button = el("button", { type: "button" }, `Try ${op.operationId}`);
    button.addEventListener("click", async () => {
      const key = $("#ref-key").value;
      let url = path;
      const init = { method: verb.toUpperCase(), headers: { Authorization: `Bearer ${key}` } };
      if (verb === "get") {
        const q = new URLSearchParams(JSON.parse(body.value || "{}"));
        url += `?${q}`;
      } else { init.body = body.value; init.headers["Content-Type"] = "application/json"; }
      const resp = await fetch(url, init);
      out.textContent = `${resp.status}\n${await resp.text()}`;
    });
    $("#ops").append(el("section", { class: "card", id, "aria-labelledby": `${id}-h` },
      el("h2", { id: `${id}-h` }, el("code", {}, `${verb.toUpperCase()} ${path}`), ` ${op.operationId}`),
      el("p", {}, op.summary || ""),
      el("p", { class: "muted" }, `${x.kind || ""} · needs ${x.permission || "?"} @ ${x.scope || "?"} · ${x.status || ""}`),
      (op.parameters || []).length ? [el("h3", {}, "Parameters"), el("ul", {}, op.parameters.map((p) =>
        el("li", {}, el("code", {}, p.name), ` in ${p.in}`, p.required ? " (required)" : "", p.description ? ` — ${p.description}` : "")))] : null,
      req?.schema ? [el("h3", {}, "Request body"), fields(req.schema)] : null,
      ok?.schema ? [el("h3", {}, "Response 200"), fields(ok.schema) || el("p", {}, typeOf(ok.schema))] : null,
      el("details", {}, el("summary", {}, "Try it"), body, button, out)));
  }
}
