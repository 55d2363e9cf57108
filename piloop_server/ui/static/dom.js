// Building the page's elements: text always goes in as text, never as HTML.

export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

// rows: arrays of cells (a Node or text); rowAttrs(i) gives each <tr>'s attributes
export function table(headers, rows, rowAttrs = () => ({})) {
  if (!rows.length) return el("p", { class: "muted" }, "none");
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r, i) => el("tr", rowAttrs(i), r.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c)))))),
  );
}

export function td(attrs, ...children) {
  return el("td", attrs, ...children);
}

export function replace(node, child) {
  node.replaceChildren(child);
}

export function ago(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 60) return `${seconds.toFixed(1)}s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ago`;
  return `${Math.floor(seconds / 3600)}h ago`;
}

export function when(ms) {
  return ms ? new Date(ms).toLocaleString() : "-";
}

export function stateCell(state) {
  return td({ class: `state state-${state}` }, state);
}

export function section(title, id) {
  return [el("h2", {}, title), el("div", { id })];
}

const drawnFrom = new WeakMap();

// Draw node's content again only when its data changed: a button is not replaced under the user's click.
export function draw(node, data, build) {
  const key = JSON.stringify(data);
  if (drawnFrom.get(node) === key) return;
  drawnFrom.set(node, key);
  node.replaceChildren(build());
}
