// One run: its state (budget, todos, plan, children, evidence), what it waits for, the
// verbs a person may use on it, and its event timeline, live over SSE.

import { call, artifact, saveBlob, followEvents } from "./api.js";
import { h, replace, badge, runLink, when, clip, announce, unchanged } from "./dom.js";
import { timelineEntry, callSummary, callDiff, diffBlock } from "./timeline.js";

const TERMINAL = new Set(["completed", "failed", "blocked", "cancelled"]);
const POLL_MS = 3000;
const PREVIEW_BYTES = 200000;
const BUDGET_DIMENSIONS = [
  ["steps", "max_steps", "Steps"],
  ["tool_calls", "max_tool_calls", "Tool calls"],
  ["tokens", "max_tokens", "Tokens"],
  ["cost", "max_cost", "Cost (USD)"],
  ["wall_seconds", "max_wall_seconds", "Seconds"],
];

export function runPage(main, runId) {
  let stopped = false;
  let view = null;
  let stream = null;
  let timer = null;
  let refreshSoon = null;
  let pendingKey = null;

  const path = `/runs/${encodeURIComponent(runId)}`;
  const title = h("h1", { tabindex: "-1" }, "Run ", h("code", {}, runId));
  const head = h("div", { class: "run-head" });
  const notice = h("p", { class: "error", role: "alert", hidden: true });
  const done = h("p", { class: "ok", role: "status", hidden: true });
  const pending = h("div", { id: "pending" });
  const controls = h("section", { class: "panel controls", "aria-labelledby": "controls-h" });
  const budget = h("section", { class: "panel", "aria-labelledby": "budget-h" });
  const todos = h("section", { class: "panel", "aria-labelledby": "todos-h" });
  const plan = h("section", { class: "panel", "aria-labelledby": "plan-h" });
  const children = h("section", { class: "panel", "aria-labelledby": "children-h" });
  const evidence = h("section", { class: "panel", "aria-labelledby": "evidence-h" });
  const viewer = h("section", { class: "panel viewer", hidden: true, "aria-label": "Artifact" });
  const streamState = h("span", { class: "muted", id: "stream-state" }, "connecting");
  const timeline = h("ol", { class: "timeline", "aria-label": "Events" });
  const ctx = { openArtifact };

  // --- the verbs -----------------------------------------------------------------------
  const pauseButton = h("button", { type: "button", onclick: () => act("pause", {}, "Pause requested") }, "Pause");
  const resumeButton = h("button", { type: "button", onclick: () => act("resume", {}, "Resumed") }, "Resume");
  const cancelButton = h("button", { type: "button", class: "danger", onclick: () => cancelDialog.showModal() }, "Cancel run…");
  const messageText = h("textarea", { id: "message-text", name: "text", rows: 2, required: true });
  const messageForm = h(
    "form",
    { class: "message", onsubmit: sendMessage },
    h("label", { for: "message-text" }, "Message to the run"),
    messageText,
    h("button", { type: "submit" }, "Send message"),
  );
  const cancelReason = h("textarea", { id: "cancel-reason", name: "reason", rows: 2, required: true });
  const cancelDialog = h(
    "dialog",
    { "aria-labelledby": "cancel-h" },
    h(
      "form",
      { method: "dialog", onsubmit: confirmCancel },
      h("h2", { id: "cancel-h" }, "Cancel this run?"),
      h("p", {}, "The run stops for good; its children are cancelled too."),
      h("label", { for: "cancel-reason" }, "Reason"),
      cancelReason,
      h(
        "div",
        { class: "buttons" },
        h("button", { type: "submit", class: "danger", value: "cancel" }, "Cancel the run"),
        h("button", { type: "button", onclick: () => cancelDialog.close() }, "Keep it"),
      ),
    ),
  );
  replace(
    controls,
    h("h2", { id: "controls-h" }, "Steer"),
    h("div", { class: "buttons" }, pauseButton, resumeButton, cancelButton),
    messageForm,
  );

  replace(
    main,
    h("p", {}, h("a", { href: "#/runs" }, "← All runs")),
    title,
    head,
    notice,
    done,
    pending,
    h(
      "div",
      { class: "run-grid" },
      h(
        "section",
        { class: "panel timeline-panel", "aria-labelledby": "timeline-h" },
        h("h2", { id: "timeline-h" }, "Timeline ", streamState),
        timeline,
      ),
      h("div", { class: "side" }, controls, budget, todos, plan, children, evidence, viewer),
    ),
    cancelDialog,
  );

  function say(message, ok = true) {
    notice.hidden = ok;
    done.hidden = !ok;
    (ok ? done : notice).textContent = message;
    (ok ? notice : done).textContent = "";
    announce(message);
  }

  async function act(verb, body, success) {
    try {
      const result = await call(`${path}/${verb}`, { method: "POST", body });
      say(success);
      if (result && result.id) show(result);
      else if (result && result.run) show(result.run);
      scheduleRefresh(0);
      return result;
    } catch (e) {
      say(`${success.split(" ")[0]} failed: ${e.message}`, false);
      return null;
    }
  }

  async function sendMessage(event) {
    event.preventDefault();
    const text = messageText.value.trim();
    if (!text) {
      say("Write a message first.", false);
      messageText.focus();
      return;
    }
    const result = await act("messages", { text }, "Message sent");
    if (!result) return;
    messageText.value = "";
    if (result.follow_up && result.follow_up.id) {
      replace(done, "Message sent: the run had ended, so a follow-up run was started: ", runLink(result.follow_up.id));
    }
  }

  async function confirmCancel(event) {
    event.preventDefault();
    const reason = cancelReason.value.trim();
    if (!reason) {
      cancelReason.focus();
      return;
    }
    cancelDialog.close();
    if (await act("cancel", { reason }, "Run cancelled")) cancelReason.value = "";
  }

  // --- what the run waits for ----------------------------------------------------------
  function renderPending(p) {
    const key = p ? `${p.kind}:${p.call_id}:${p.digest ?? ""}:${p.question ?? ""}` : null;
    if (key === pendingKey) return; // keep what the person is typing
    pendingKey = key;
    if (!p) {
      replace(pending);
      return;
    }
    if (p.kind === "question") {
      const answer = h("textarea", { id: "answer-text", name: "text", rows: 3, required: true });
      replace(
        pending,
        h(
          "section",
          { class: "card question", "aria-labelledby": "question-h" },
          h("h2", { id: "question-h" }, "The run asks a question"),
          h("p", { class: "question-text" }, p.question ?? ""),
          h(
            "form",
            {
              onsubmit: async (event) => {
                event.preventDefault();
                const text = answer.value.trim();
                if (!text) return answer.focus();
                await act("answer", { text }, "Answer sent");
              },
            },
            h("label", { for: "answer-text" }, "Your answer"),
            answer,
            h("button", { type: "submit" }, "Send answer"),
          ),
        ),
      );
      return;
    }
    const preview = p.preview || {};
    const diff = preview.diff ?? callDiff(p.tool, p.arguments);
    const command = preview.command ?? (Array.isArray(p.arguments?.argv) ? callSummary(p.tool, p.arguments) : null);
    const target = preview.path ?? (typeof p.arguments?.path === "string" ? p.arguments.path : null);
    const reason = h("textarea", { id: "deny-reason", name: "reason", rows: 2, required: true });
    replace(
      pending,
      h(
        "section",
        { class: "card approval", "aria-labelledby": "approval-h" },
        h("h2", { id: "approval-h" }, p.kind === "plan" ? "The plan waits for approval" : "Approval needed"),
        h(
          "dl",
          { class: "kv" },
          h("dt", {}, "Tool"),
          h("dd", {}, h("code", { class: "pending-tool" }, p.tool ?? p.kind ?? "")),
          command !== null && command !== undefined
            ? [h("dt", {}, "Command"), h("dd", {}, h("code", { class: "pending-command" }, command))]
            : null,
          target ? [h("dt", {}, "Path"), h("dd", {}, h("code", { class: "pending-path" }, target))] : null,
          p.risk ? [h("dt", {}, "Risk"), h("dd", {}, p.risk)] : null,
          p.expires_at ? [h("dt", {}, "Expires"), h("dd", {}, when(p.expires_at))] : null,
          h("dt", {}, "Digest"),
          h("dd", {}, h("code", { class: "digest" }, p.digest ?? "")),
        ),
        diff ? [h("h3", {}, "Change"), diffBlock(diff)] : null,
        h(
          "details",
          {},
          h("summary", {}, "Exact arguments"),
          h("pre", { class: "output", tabindex: "0" }, clip(JSON.stringify(p.arguments ?? {}, null, 2), 20000)),
        ),
        h(
          "div",
          { class: "buttons" },
          h(
            "button",
            {
              type: "button",
              class: "primary",
              onclick: () => act("approve", { digest: p.digest }, "Approved"),
            },
            "Approve",
          ),
        ),
        h(
          "form",
          {
            class: "deny",
            onsubmit: async (event) => {
              event.preventDefault();
              const text = reason.value.trim();
              if (!text) return reason.focus();
              await act("deny", { reason: text }, "Denied");
            },
          },
          h("label", { for: "deny-reason" }, "Reason to deny"),
          reason,
          h("button", { type: "submit", class: "danger" }, "Deny"),
        ),
      ),
    );
  }

  // --- the state panels ----------------------------------------------------------------
  function show(v) {
    const before = view?.status;
    view = v;
    if (before && before !== v.status) announce(`Run ${v.id} is now ${v.status}`);
    renderHead(v);
    renderPending(v.pending);
    const terminal = TERMINAL.has(v.status);
    pauseButton.disabled = !(v.status === "running" || v.status === "verifying");
    resumeButton.disabled = v.status !== "paused";
    cancelButton.disabled = terminal;
    renderBudget(v);
    renderTodos(v.todos);
    plan.classList.toggle("empty", !v.plan);
    if (!unchanged(plan, v.plan)) replace(
      plan,
      h("h2", { id: "plan-h" }, "Plan"),
      v.plan ? h("pre", { class: "output", tabindex: "0" }, clip(v.plan, 20000)) : h("p", { class: "muted" }, "No plan."),
    );
    renderChildren(v.children);
    renderEvidence(v);
  }

  function renderHead(v) {
    if (unchanged(head, { ...v, pending: null, usage: null, last_seq: null })) return;
    replace(
      head,
      h("p", { class: "goal" }, v.goal ?? ""),
      h(
        "p",
        { class: "status-line" },
        badge(v.status),
        v.reason ? h("span", { class: "reason" }, ` ${v.reason}`) : null,
      ),
      h(
        "dl",
        { class: "kv meta" },
        [
          ["Model", v.model],
          ["Mode", v.mode],
          ["Workspace", v.workspace],
          ["Creator", v.creator],
          ["Updated", when(v.updated_at)],
        ]
          .filter(([, value]) => value)
          .map(([k, value]) => [h("dt", {}, k), h("dd", {}, String(value))]),
        v.parent_id ? [h("dt", {}, "Parent"), h("dd", {}, runLink(v.parent_id))] : null,
        v.follows ? [h("dt", {}, "Follows"), h("dd", {}, runLink(v.follows))] : null,
        v.task_id ? [h("dt", {}, "Task"), h("dd", {}, h("a", { href: "#/tasks" }, v.task_id))] : null,
      ),
    );
  }

  function renderBudget(v) {
    if (unchanged(budget, [v.budget, v.usage])) return;
    const limits = v.budget || {};
    const usage = v.usage || {};
    const rows = BUDGET_DIMENSIONS.map(([used, limit, label]) => {
      const max = limits[limit] ?? (limit === "max_wall_seconds" ? limits.timeout_s : undefined);
      const value = Number(usage[used] ?? 0);
      if (max === null || max === undefined) {
        return value ? h("li", {}, `${label}: ${format(value)} (no limit)`) : null;
      }
      const id = `budget-${used}`;
      return h(
        "li",
        {},
        h("label", { for: id }, `${label}: ${format(value)} of ${format(max)}`),
        h("meter", { id, min: 0, max: Number(max), value: Math.min(value, Number(max)), high: Number(max) * 0.8, optimum: 0 }),
      );
    });
    replace(budget, h("h2", { id: "budget-h" }, "Budget"), h("ul", { class: "budget" }, rows));
  }

  function renderTodos(list) {
    if (unchanged(todos, list)) return;
    const items = Array.isArray(list) ? list : [];
    todos.classList.toggle("empty", !items.length);
    replace(
      todos,
      h("h2", { id: "todos-h" }, "Todos"),
      items.length
        ? h(
            "ul",
            { class: "todos" },
            items.map((t) => h("li", { class: `todo todo-${t.status}` }, h("span", { class: "todo-status" }, `[${t.status}]`), " ", t.content)),
          )
        : h("p", { class: "muted" }, "No todos."),
    );
  }

  function childList(nodes) {
    return h(
      "ul",
      { class: "children" },
      nodes.map((c) =>
        h(
          "li",
          {},
          runLink(c.id),
          " ",
          badge(c.status),
          c.agent ? ` ${c.agent}` : "",
          Array.isArray(c.children) && c.children.length ? childList(c.children) : null,
        ),
      ),
    );
  }

  function renderChildren(list) {
    if (unchanged(children, list)) return;
    const items = Array.isArray(list) ? list : [];
    children.classList.toggle("empty", !items.length);
    replace(
      children,
      h("h2", { id: "children-h" }, "Child runs"),
      items.length ? childList(items) : h("p", { class: "muted" }, "No child runs."),
    );
  }

  function evidenceItems(v) {
    const ev = v.evidence;
    if (ev && typeof ev === "object" && !Array.isArray(ev)) {
      // by verifier name: {"unit_tests": "artifact:art_…", "code_diff": …}
      return Object.entries(ev).map(([name, ref]) => {
        const text = String(ref);
        const id = text.startsWith("artifact:") ? text.slice("artifact:".length) : null;
        return { id, label: name };
      });
    }
    const raw = Array.isArray(ev) ? ev : [];
    return raw.map((item) => {
      if (typeof item === "string") {
        const id = item.startsWith("artifact:") ? item.slice("artifact:".length) : null;
        return { id, label: id || item };
      }
      const id = item?.id ?? item?.artifact_id ?? item?.artifact ?? null;
      return { id, label: item?.name ?? item?.command ?? id ?? JSON.stringify(item) };
    });
  }

  function renderEvidence(v) {
    if (unchanged(evidence, v.evidence)) return;
    const items = evidenceItems(v);
    evidence.classList.toggle("empty", !items.length);
    replace(
      evidence,
      h("h2", { id: "evidence-h" }, "Evidence"),
      items.length
        ? h(
            "ul",
            { class: "evidence" },
            items.map((e) =>
              h(
                "li",
                {},
                h("code", {}, e.label),
                e.id
                  ? [
                      " ",
                      h("button", { type: "button", class: "link", onclick: () => openArtifact(e.id) }, "Open"),
                      " ",
                      h("button", { type: "button", class: "link", onclick: () => downloadArtifact(e.id) }, "Download"),
                    ]
                  : null,
              ),
            ),
          )
        : h("p", { class: "muted" }, "No evidence yet."),
    );
  }

  async function openArtifact(id) {
    try {
      const blob = await artifact(runId, id);
      const text = await blob.slice(0, PREVIEW_BYTES).text();
      const more = blob.size > PREVIEW_BYTES ? `\n… (${blob.size - PREVIEW_BYTES} more bytes: download it)` : "";
      replace(
        viewer,
        h("h2", { tabindex: "-1", id: "viewer-h" }, "Artifact ", h("code", {}, id)),
        h(
          "div",
          { class: "buttons" },
          h("button", { type: "button", onclick: () => saveBlob(blob, `${id}.txt`) }, "Download"),
          h("button", { type: "button", onclick: () => { viewer.hidden = true; } }, "Close"),
        ),
        h("pre", { class: "output artifact", tabindex: "0" }, text + more),
      );
      viewer.hidden = false;
      viewer.querySelector("h2").focus();
    } catch (e) {
      say(`Could not open ${id}: ${e.message}`, false);
    }
  }

  async function downloadArtifact(id) {
    try {
      saveBlob(await artifact(runId, id), `${id}.txt`);
      say(`Downloaded ${id}`);
    } catch (e) {
      say(`Could not download ${id}: ${e.message}`, false);
    }
  }

  // --- keeping up ----------------------------------------------------------------------
  async function refresh() {
    try {
      const v = await call(path);
      if (stopped) return;
      show(v);
      if (!v.children?.length) return;
      try {
        const tree = await call(`${path}/tree`);
        if (!stopped && Array.isArray(tree?.children)) renderChildren(tree.children);
      } catch {
        // the tree route is optional: the direct children are shown already
      }
    } catch (e) {
      if (!stopped) say(`Could not load the run: ${e.message}`, false);
    }
  }

  function scheduleRefresh(delay = 150) {
    clearTimeout(refreshSoon);
    refreshSoon = setTimeout(refresh, delay);
  }

  function poll() {
    timer = setTimeout(async () => {
      if (stopped) return;
      if (!view || !TERMINAL.has(view.status)) await refresh();
      poll();
    }, POLL_MS);
  }

  function startStream() {
    stream = followEvents(runId, {
      after: 0,
      onEvent(event) {
        timeline.appendChild(timelineEntry(event, ctx));
        scheduleRefresh();
      },
      async shouldResume() {
        await refresh();
        return !stopped && Boolean(view) && !TERMINAL.has(view.status);
      },
      onState(state, detail) {
        streamState.textContent = detail ? `${state}: ${detail}` : state;
        streamState.dataset.state = state;
      },
    });
  }

  refresh().then(() => {
    if (stopped) return;
    startStream();
    poll();
  });
  return () => {
    stopped = true;
    stream?.stop();
    clearTimeout(timer);
    clearTimeout(refreshSoon);
  };
}

function format(n) {
  const value = Number(n);
  if (!Number.isFinite(value)) return String(n);
  return Number.isInteger(value) ? String(value) : value.toFixed(value < 10 ? 4 : 1);
}
