// One run's events as timeline entries. Every value is shown with textContent.

import { h, clip, cssWord, runLink, when } from "./dom.js";

// A model's call arguments arrive as JSON text; anything that does not parse stays text.
function parsed(args) {
  if (typeof args !== "string") return args;
  try {
    return JSON.parse(args);
  } catch {
    return args;
  }
}

// argv as one shell line, quoted as Python's shlex.join quotes it (what the API previews).
export function shellJoin(argv) {
  return argv
    .map((part) => {
      const word = String(part);
      if (word === "") return "''";
      if (/^[\w@%+=:,./-]+$/.test(word)) return word;
      return `'${word.replace(/'/g, `'"'"'`)}'`;
    })
    .join(" ");
}

// The words a person reads for a call: the command line, or the path it touches.
export function callSummary(tool, args) {
  args = parsed(args);
  if (!args || typeof args !== "object") return args === undefined ? "" : String(args);
  if (Array.isArray(args.argv)) return shellJoin(args.argv);
  if (typeof args.command === "string") return args.command;
  if (typeof args.path === "string") return args.path;
  if (typeof args.artifact === "string") return args.artifact;
  if (typeof args.question === "string") return args.question;
  return "";
}

// The diff a call's arguments imply: edit_file's old/new text, write_file's content,
// or a unified diff some tools carry. Returns text in unified-diff style, or null.
export function callDiff(tool, args) {
  args = parsed(args);
  if (!args || typeof args !== "object") return null;
  if (typeof args.diff === "string") return args.diff;
  if (typeof args.patch === "string") return args.patch;
  const path = typeof args.path === "string" ? args.path : "";
  if (typeof args.old_text === "string" && typeof args.new_text === "string") {
    return [
      `--- ${path}`,
      `+++ ${path}`,
      ...args.old_text.split("\n").map((line) => `-${line}`),
      ...args.new_text.split("\n").map((line) => `+${line}`),
    ].join("\n");
  }
  if (typeof args.content === "string" && tool === "write_file") {
    const lines = args.content.replace(/\n$/, "").split("\n");
    return [`+++ ${path} (whole file)`, ...lines.map((line) => `+${line}`)].join("\n");
  }
  return null;
}

// A diff shown line by line, additions and removals marked by class (and by their sign).
export function diffBlock(text, limitLines = 400) {
  const lines = String(text).split("\n");
  const shown = lines.slice(0, limitLines).map((line) => {
    let kind = "ctx";
    if (line.startsWith("+++") || line.startsWith("---")) kind = "file";
    else if (line.startsWith("+")) kind = "add";
    else if (line.startsWith("-")) kind = "del";
    else if (line.startsWith("@@")) kind = "hunk";
    return h("span", { class: `diff-${kind}` }, `${line}\n`);
  });
  if (lines.length > limitLines) shown.push(h("span", {}, `… ${lines.length - limitLines} more lines\n`));
  return h("pre", { class: "diff", tabindex: "0", "aria-label": "diff" }, shown);
}

function pre(text, label) {
  return h("pre", { class: "output", tabindex: "0", "aria-label": label || "text" }, clip(text));
}

function details(summary, ...body) {
  return h("details", {}, h("summary", {}, summary), ...body);
}

function kv(pairs) {
  const rows = pairs.filter(([, v]) => v !== undefined && v !== null && v !== "");
  if (!rows.length) return null;
  return h("dl", { class: "kv" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))]));
}

const ARTIFACT = /^art_[A-Za-z0-9]+$/;

// Renderers by event type: each returns [title, ...body nodes]. `ctx.openArtifact(id)`
// shows an artifact.
const RENDER = {
  run_created: (d) => ["Run created", kv([["goal", d.goal], ["workspace", d.workspace]])],
  status_changed: (d) => [
    `Status ${d.from ?? "?"} → ${d.to ?? "?"}`,
    d.reason ? h("p", {}, d.reason) : null,
  ],
  model_requested: (d) => [`Model asked (step ${d.step ?? "?"})`, kv([["model", d.model]])],
  model_responded: (d) => {
    const usage = d.usage || {};
    const calls = Array.isArray(d.tool_calls) ? d.tool_calls : [];
    return [
      `Model turn ${d.step ?? ""}${calls.length ? ` · ${calls.length} tool call(s)` : ""}`,
      d.content ? pre(d.content, "model output") : null,
      d.reasoning ? details("Reasoning", pre(d.reasoning, "model reasoning")) : null,
      calls.length
        ? h(
            "ul",
            { class: "calls" },
            calls.map((c) =>
              h("li", {}, h("code", {}, String(c.name)), " ", callSummary(c.name, c.arguments)),
            ),
          )
        : null,
      h(
        "p",
        { class: "muted" },
        `tokens in ${usage.input_tokens ?? 0}, out ${usage.output_tokens ?? 0}` +
          (d.cost ? ` · $${Number(d.cost).toFixed(4)}` : "") +
          (d.finish_reason ? ` · ${d.finish_reason}` : ""),
      ),
    ];
  },
  tool_started: (d) => [
    `Tool ${d.tool} started`,
    h("p", {}, h("code", {}, callSummary(d.tool, d.arguments))),
  ],
  tool_finished: (d, ctx) => {
    const changed = d.changed_files && typeof d.changed_files === "object" ? d.changed_files : {};
    const diff = typeof d.diff === "string" && !ARTIFACT.test(d.diff) ? d.diff : callDiff(d.tool, d.arguments);
    return [
      `Tool ${d.tool} finished`,
      h("p", {}, h("code", {}, callSummary(d.tool, d.arguments))),
      Object.keys(changed).length
        ? h("p", {}, "Changed: ", Object.keys(changed).join(", "))
        : null,
      diff ? details("Diff", diffBlock(diff)) : null,
      typeof d.diff === "string" && ARTIFACT.test(d.diff) ? artifactButton(d.diff, ctx) : null,
      d.output !== undefined && d.output !== "" ? details("Output", pre(d.output, "tool output")) : null,
    ];
  },
  tool_failed: (d) => [
    `Tool ${d.tool ?? ""} failed${d.error_kind ? `: ${d.error_kind}` : ""}`,
    h("p", {}, h("code", {}, callSummary(d.tool, d.arguments))),
    d.message ? pre(d.message, "error message") : null,
  ],
  approval_requested: (d) => [
    `Approval requested: ${d.tool ?? d.kind ?? ""}`,
    h("p", {}, h("code", {}, callSummary(d.tool, d.arguments))),
    kv([["risk", d.risk], ["digest", d.digest], ["rule", d.rule], ["why", d.reason]]),
  ],
  approval_granted: (d) => ["Approved", kv([["by", d.by], ["reason", d.reason], ["digest", d.digest]])],
  approval_denied: (d) => ["Denied", kv([["by", d.by], ["reason", d.reason], ["digest", d.digest]])],
  input_requested: (d) => ["Question", h("p", {}, d.question ?? "")],
  input_received: (d) => ["Answer", h("p", {}, d.answer ?? ""), kv([["by", d.by]])],
  verification_started: (d) => [
    "Verification started",
    Array.isArray(d.commands) ? h("ul", {}, d.commands.map((c) => h("li", {}, h("code", {}, String(c))))) : null,
  ],
  verification_passed: (d, ctx) => verification("Verification passed", d, ctx),
  verification_failed: (d, ctx) => verification("Verification failed", d, ctx),
  retry_scheduled: (d) => [
    `Retry ${d.attempt ?? ""} in ${d.wait_seconds ?? "?"} s`,
    d.error ? h("p", {}, String(d.error)) : null,
  ],
  budget_warning: (d) => [`Budget warning: ${d.dimension}`, h("p", {}, `${d.used} of ${d.limit}`)],
  budget_exhausted: (d) => [`Budget exhausted: ${d.dimension}`, h("p", {}, `${d.used} of ${d.limit}`)],
  todo_updated: (d) => [
    "Todos updated",
    Array.isArray(d.todos)
      ? h("ul", {}, d.todos.map((t) => h("li", {}, `[${t.status}] ${t.content}`)))
      : null,
  ],
  plan_written: (d) => ["Plan written", details("Plan", pre(d.content ?? "", "plan"))],
  note_added: (d) => ["Note", pre(d.text ?? "", "note")],
  subagent_spawned: (d) => [
    `Child run started${d.agent ? `: ${d.agent}` : ""}`,
    childOf(d) ? h("p", {}, runLink(childOf(d))) : null,
    kv([["task", d.task_id], ["background", d.background ? "yes" : ""]]),
  ],
  subagent_finished: (d, ctx) => [
    `Child run finished${d.status ? `: ${d.status}` : ""}`,
    childOf(d) ? h("p", {}, runLink(childOf(d)), d.agent ? ` ${d.agent}` : "") : null,
    d.summary || d.reason ? h("p", {}, String(d.summary || d.reason)) : null,
    typeof d.patch === "string" && ARTIFACT.test(d.patch) ? artifactButton(d.patch, ctx, "patch") : null,
  ],
  run_resumed: (d) => ["Run taken up", kv([["by", d.owner], ["host", d.host]])],
  process_started: (d) => ["Process started", kv([["call", d.call_id], ["host", d.host]])],
  mode_changed: (d) => [`Mode ${d.from ?? "?"} → ${d.to ?? "?"}`],
  context_compacted: () => ["Context compacted"],
  no_progress_detected: (d) => ["No progress detected", d.what ? h("p", {}, String(d.what)) : null],
  waiting_on_child: (d) => [
    "Waiting on a child run",
    childOf(d) ? h("p", {}, runLink(childOf(d))) : null,
    d.what ? h("p", {}, String(d.what)) : null,
  ],
  handed_off: (d) => [
    `Handed off${d.agent ? ` to ${d.agent}` : ""}`,
    d.run_id ? h("p", {}, runLink(d.run_id)) : null,
    d.note ? h("p", {}, String(d.note)) : null,
  ],
  message_received: (d) => ["Message", h("p", {}, d.text ?? ""), kv([["by", d.by]])],
  pause_requested: (d) => ["Pause requested", kv([["by", d.by], ["reason", d.reason]])],
  follow_up_created: (d) => [
    "Follow-up run",
    d.run_id ? h("p", {}, runLink(d.run_id)) : null,
    kv([["by", d.by]]),
  ],
  middleware_decided: (d) => [
    `Middleware ${d.middleware ?? "?"}: ${d.decision ?? "?"} at ${d.point ?? "?"}`,
    d.reason || d.note || d.error ? h("p", {}, String(d.reason || d.note || d.error)) : null,
    kv([["call", d.call_id]]),
  ],
};

function childOf(d) {
  return d.child_run_id || d.run_id || null;
}

function artifactButton(id, ctx, label) {
  return h(
    "button",
    { type: "button", class: "link", onclick: () => ctx.openArtifact(id) },
    label || `Open ${id}`,
  );
}

function verification(title, d, ctx) {
  const records = Array.isArray(d.records) ? d.records : [];
  return [
    title,
    records.length
      ? h(
          "ul",
          {},
          records.map((r) =>
            h(
              "li",
              {},
              `${r.passed ? "✓" : "✗"} `,
              h("code", {}, String(r.command)),
              ` exit ${r.exit_code}`,
              r.artifact ? [" ", artifactButton(r.artifact, ctx, "output")] : null,
            ),
          ),
        )
      : null,
    Array.isArray(d.gaps) && d.gaps.length
      ? h("ul", {}, d.gaps.map((g) => h("li", {}, String(g))))
      : null,
    typeof d.diff === "string" && ARTIFACT.test(d.diff) ? artifactButton(d.diff, ctx, "diff") : null,
    d.note ? h("p", { class: "muted" }, d.note) : null,
  ];
}

// The <li> for one event_json {run_id, seq, type, recorded_at, data}.
export function timelineEntry(event, ctx) {
  const data = event.data && typeof event.data === "object" ? event.data : {};
  const render = RENDER[event.type];
  let parts;
  try {
    parts = render ? render(data, ctx) : [event.type, details("Data", pre(data, "event data"))];
  } catch {
    parts = [event.type, details("Data", pre(data, "event data"))];
  }
  const [title, ...body] = parts;
  return h(
    "li",
    { class: `event type-${cssWord(event.type)}`, "data-seq": event.seq },
    h(
      "div",
      { class: "event-head" },
      h("span", { class: "seq" }, `#${event.seq}`),
      h("strong", {}, title),
      h("time", { datetime: event.recorded_at || "" }, when(event.recorded_at)),
    ),
    ...body,
  );
}
