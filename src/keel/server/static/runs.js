// The runs list: newest first, refreshed every two seconds, status changes announced.

import { call } from "./api.js";
import { h, replace, badge, runLink, when, clip, announce, unchanged } from "./dom.js";

const POLL_MS = 2000;
const STATUSES = ["", "queued", "running", "waiting", "paused", "verifying", "completed", "failed", "blocked", "cancelled"];

export function runsPage(main) {
  let timer = null;
  let stopped = false;
  let cursors = [null]; // cursor of each page shown so far; the last is the current page
  const known = new Map(); // run id -> status last shown
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const body = h("tbody", {});
  const status = h(
    "select",
    { id: "status-filter", name: "status", onchange: () => restart(true) },
    STATUSES.map((s) => h("option", { value: s }, s || "any status")),
  );
  const newer = h("button", { type: "button", onclick: () => page(-1), disabled: true }, "Newer");
  const older = h("button", { type: "button", onclick: () => page(1), disabled: true }, "Older");
  const updated = h("p", { class: "muted", id: "runs-updated" });
  let nextCursor = null;

  replace(
    main,
    h("h1", { tabindex: "-1" }, "Runs"),
    h(
      "div",
      { class: "toolbar" },
      h("label", { for: "status-filter" }, "Status "),
      status,
      updated,
    ),
    error,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "runs", "aria-describedby": "runs-updated" },
        h("caption", { class: "visually-hidden" }, "Runs, newest first"),
        h(
          "thead",
          {},
          h("tr", {}, ["Run", "Goal", "Status", "Reason", "Updated", "Creator"].map((c) => h("th", { scope: "col" }, c))),
        ),
        body,
      ),
    ),
    h("nav", { class: "pager", "aria-label": "Pages of runs" }, newer, older),
  );

  function page(step) {
    if (step > 0 && nextCursor) cursors.push(nextCursor);
    if (step < 0 && cursors.length > 1) cursors.pop();
    restart(false);
  }

  function restart(resetPages) {
    if (resetPages) cursors = [null];
    clearTimeout(timer);
    load();
  }

  async function load() {
    const params = new URLSearchParams({ limit: "50" });
    if (status.value) params.set("status", status.value);
    const cursor = cursors[cursors.length - 1];
    if (cursor) params.set("cursor", cursor);
    try {
      const result = await call(`/runs?${params}`);
      if (stopped) return;
      error.hidden = true;
      render(result.runs || []);
      nextCursor = result.next_cursor || null;
      older.disabled = !nextCursor;
      newer.disabled = cursors.length <= 1;
      updated.textContent = `Updated ${when(new Date().toISOString())}`;
    } catch (e) {
      if (stopped) return;
      error.textContent = `Could not load the runs: ${e.message}`;
      error.hidden = false;
    }
    if (!stopped) timer = setTimeout(load, POLL_MS);
  }

  function render(runs) {
    if (unchanged(body, runs)) return;
    const focused = document.activeElement?.closest?.("tr[data-run]")?.dataset.run;
    const changes = [];
    if (!runs.length) {
      replace(body, h("tr", {}, h("td", { colspan: 6 }, "No runs yet.")));
    } else {
      replace(
        body,
        runs.map((run) => {
          const before = known.get(run.id);
          if (before && before !== run.status) changes.push(`Run ${run.id} is now ${run.status}`);
          known.set(run.id, run.status);
          return h(
            "tr",
            { "data-run": run.id, "data-status": run.status },
            h("td", {}, runLink(run.id)),
            h("td", { class: "goal" }, clip(run.goal || "", 160)),
            h("td", {}, badge(run.status)),
            h("td", {}, clip(run.reason || "", 120)),
            h("td", {}, when(run.updated_at)),
            h("td", {}, run.creator || ""),
          );
        }),
      );
    }
    if (focused) {
      // Keep the keyboard where it was: on the same run's link in the new rows.
      for (const row of body.querySelectorAll("tr[data-run]")) {
        if (row.dataset.run === focused) row.querySelector("a")?.focus();
      }
    }
    if (changes.length) announce(changes.slice(0, 3).join(". "));
  }

  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
