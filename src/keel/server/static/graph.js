// The task graph as a DAG: layers by longest path from a task with no blockers, nodes
// ordered in each layer by their blockers' mean position (fewer crossings), SVG drawn
// with classes only (the CSP allows no inline style).

import { h, s, badge, cssWord } from "./dom.js";

export const TASK_STATUSES = ["pending", "in_progress", "completed", "failed", "cancelled"];

const NODE_W = 180;
const NODE_H = 56;
const GAP_X = 70;
const GAP_Y = 22;
const PAD = 16;

// {nodes, edges} -> {layers: [[node]], position: Map(id -> {x, y, layer})}.
// A cycle (which the store refuses, but a page must not hang on) is cut where found.
export function layout(graph) {
  const nodes = Array.isArray(graph.nodes) ? graph.nodes : [];
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const blockers = new Map(nodes.map((n) => [n.id, []]));
  for (const edge of Array.isArray(graph.edges) ? graph.edges : []) {
    if (byId.has(edge.from) && byId.has(edge.to)) blockers.get(edge.to).push(edge.from);
  }
  const layerOf = new Map();
  const visiting = new Set();
  function depth(id) {
    if (layerOf.has(id)) return layerOf.get(id);
    if (visiting.has(id)) return 0; // a cycle: cut here
    visiting.add(id);
    let d = 0;
    for (const b of blockers.get(id)) d = Math.max(d, depth(b) + 1);
    visiting.delete(id);
    layerOf.set(id, d);
    return d;
  }
  for (const n of nodes) depth(n.id);
  const layers = [];
  for (const n of nodes) {
    const d = layerOf.get(n.id);
    (layers[d] ||= []).push(n);
  }
  const position = new Map();
  layers.forEach((layer, d) => {
    if (d > 0) {
      const mean = (n) => {
        const ys = blockers.get(n.id).map((b) => position.get(b)?.row ?? 0);
        return ys.length ? ys.reduce((a, b) => a + b, 0) / ys.length : 0;
      };
      layer.sort((a, b) => mean(a) - mean(b) || String(a.id).localeCompare(String(b.id)));
    }
    layer.forEach((n, row) => {
      position.set(n.id, {
        layer: d,
        row,
        x: PAD + d * (NODE_W + GAP_X),
        y: PAD + row * (NODE_H + GAP_Y),
      });
    });
  });
  return { layers, position, blockers };
}

function short(text, max) {
  const str = String(text ?? "");
  return str.length > max ? `${str.slice(0, max - 1)}…` : str;
}

// The <svg> drawing of `graph` ({nodes, edges} from GET /tasks/graph).
export function drawGraph(graph) {
  const { layers, position, blockers } = layout(graph);
  const width = PAD * 2 + Math.max(1, layers.length) * (NODE_W + GAP_X) - GAP_X;
  const rows = Math.max(1, ...layers.map((l) => l.length));
  const height = PAD * 2 + rows * (NODE_H + GAP_Y) - GAP_Y;
  const svg = s("svg", {
    class: "dag",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `Task graph: ${position.size} tasks in ${layers.length} layers`,
  });
  svg.appendChild(
    s(
      "defs",
      {},
      s(
        "marker",
        { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
        s("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow-head" }),
      ),
    ),
  );
  const edges = s("g", { class: "edges" });
  for (const [to, froms] of blockers) {
    const b = position.get(to);
    for (const from of froms) {
      const a = position.get(from);
      if (!a || !b) continue;
      const x1 = a.x + NODE_W;
      const y1 = a.y + NODE_H / 2;
      const x2 = b.x;
      const y2 = b.y + NODE_H / 2;
      const mid = (x1 + x2) / 2;
      edges.appendChild(
        s("path", {
          class: "edge",
          d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`,
          "marker-end": "url(#arrow)",
          "data-from": from,
          "data-to": to,
        }),
      );
    }
  }
  svg.appendChild(edges);
  const nodes = s("g", { class: "nodes" });
  for (const layer of layers) {
    for (const n of layer || []) {
      const p = position.get(n.id);
      const status = cssWord(n.status);
      nodes.appendChild(
        s(
          "g",
          { class: `node status-${status}`, "data-id": n.id, "data-status": status, transform: `translate(${p.x},${p.y})` },
          s("title", {}, `${n.subject} (${n.id}): ${n.status}${n.owner ? `, owner ${n.owner}` : ""}`),
          s("rect", { width: NODE_W, height: NODE_H, rx: 8, ry: 8 }),
          s("text", { x: 10, y: 22, class: "node-subject" }, short(n.subject, 24)),
          s("text", { x: 10, y: 42, class: "node-meta" }, short(`${n.id} · ${n.status}`, 28)),
        ),
      );
    }
  }
  svg.appendChild(nodes);
  return svg;
}

// The colour key: one swatch per status.
export function legend() {
  return h(
    "ul",
    { class: "legend", "aria-label": "Colours by status" },
    TASK_STATUSES.map((status) =>
      h("li", {}, h("span", { class: `swatch status-${status}`, "aria-hidden": "true" }), status),
    ),
  );
}

// The same graph as a table: readable by a screen reader and on a narrow screen.
export function graphTable(graph) {
  const nodes = Array.isArray(graph.nodes) ? graph.nodes : [];
  const subjects = new Map(nodes.map((n) => [n.id, n.subject]));
  const blockedBy = new Map(nodes.map((n) => [n.id, []]));
  for (const e of Array.isArray(graph.edges) ? graph.edges : []) blockedBy.get(e.to)?.push(e.from);
  return h(
    "table",
    { class: "tasks" },
    h("caption", {}, "Tasks"),
    h("thead", {}, h("tr", {}, ["Task", "Subject", "Status", "Owner", "Blocked by"].map((c) => h("th", { scope: "col" }, c)))),
    h(
      "tbody",
      {},
      nodes.map((n) =>
        h(
          "tr",
          {},
          h("td", {}, h("code", {}, n.id)),
          h("td", {}, n.subject),
          h("td", {}, badge(n.status)),
          h("td", {}, n.owner || ""),
          h("td", {}, blockedBy.get(n.id).map((b) => `${b} (${subjects.get(b) ?? ""})`).join(", ")),
        ),
      ),
    ),
  );
}
