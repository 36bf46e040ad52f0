// The task graph page: GET /tasks/graph drawn as a DAG coloured by status, with a legend
// and the same tasks as a table; refreshed every few seconds.

import { call } from "./api.js";
import { h, replace } from "./dom.js";
import { drawGraph, legend, graphTable } from "./graph.js";

const POLL_MS = 3000;

export function tasksPage(main) {
  let stopped = false;
  let timer = null;
  let last = "";
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const summary = h("p", { class: "muted", role: "status" });
  const drawing = h("div", { class: "dag-wrap", tabindex: "0", role: "group", "aria-label": "Task graph drawing (scrolls)" });
  const table = h("div", { class: "table-wrap" });
  replace(
    main,
    h("h1", { tabindex: "-1" }, "Task graph"),
    h("p", {}, "Each arrow goes from a blocker to the task it blocks; tasks are placed in columns by their longest chain of blockers."),
    legend(),
    summary,
    error,
    drawing,
    table,
  );

  async function load() {
    try {
      const graph = await call("/tasks/graph");
      if (stopped) return;
      error.hidden = true;
      const text = JSON.stringify(graph);
      if (text !== last) {
        last = text;
        const nodes = Array.isArray(graph.nodes) ? graph.nodes : [];
        const counts = {};
        for (const n of nodes) counts[n.status] = (counts[n.status] || 0) + 1;
        summary.textContent = nodes.length
          ? `${nodes.length} tasks: ${Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ")}`
          : "No tasks yet.";
        replace(drawing, nodes.length ? drawGraph(graph) : null);
        replace(table, nodes.length ? graphTable(graph) : null);
      }
    } catch (e) {
      if (stopped) return;
      error.textContent = `Could not load the task graph: ${e.message}`;
      error.hidden = false;
    }
    if (!stopped) timer = setTimeout(load, POLL_MS);
  }

  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
