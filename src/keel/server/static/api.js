// Talking to the Keel API: the token, JSON calls, artifact downloads and the SSE stream.
//
// The token lives in sessionStorage (this tab only; gone when the tab closes) and is
// sent as `Authorization: Bearer` on every request. No cookie is ever set, so another
// site cannot make the browser send a credential (no CSRF). A 401 from any call forgets
// the token and sends the person back to the sign-in page.

const TOKEN_KEY = "keel.token";

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
    this.detail = detail;
  }
}

let onUnauthorized = () => {};

// Called with the server's words when a request is refused with 401.
export function whenUnauthorized(callback) {
  onUnauthorized = callback;
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function signIn(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra = {}) {
  const result = { Accept: "application/json", ...extra };
  const value = token();
  if (value) result.Authorization = `Bearer ${value}`;
  return result;
}

// The error a failed response carries: problem+json's detail, else its text.
async function failure(response) {
  let detail = `${response.status} ${response.statusText}`.trim();
  try {
    const text = await response.text();
    try {
      const body = JSON.parse(text);
      if (body && typeof body.detail === "string") detail = body.detail;
      else if (body && body.detail !== undefined) detail = JSON.stringify(body.detail);
      else if (body && typeof body.title === "string") detail = body.title;
    } catch {
      if (text) detail = text.slice(0, 500);
    }
  } catch {
    // the body could not be read: keep the status line
  }
  return new ApiError(response.status, detail);
}

async function checked(response, { quiet401 = false } = {}) {
  if (response.ok) return response;
  const error = await failure(response);
  if (response.status === 401 && !quiet401) {
    signOut();
    onUnauthorized(error.detail);
  }
  throw error;
}

// GET/POST a JSON API route; resolves to the parsed body.
// `quiet401`: a 401 is thrown to the caller without leaving the page (sign-in uses it).
export async function call(path, { method = "GET", body, quiet401 = false, signal } = {}) {
  const init = { method, headers: headers(), signal, credentials: "omit", cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await checked(await fetch(path, init), { quiet401 });
  if (response.status === 204) return null;
  return response.json();
}

// The artifact's bytes as a Blob (the caller decides to show or to save it).
export async function artifact(runId, artifactId) {
  const path = `/runs/${encodeURIComponent(runId)}/artifacts/${encodeURIComponent(artifactId)}`;
  const response = await checked(
    await fetch(path, { headers: headers({ Accept: "*/*" }), credentials: "omit" }),
  );
  return response.blob();
}

// Save `blob` as a file named `name` (a same-origin blob: URL, typed as plain bytes so the
// browser never renders it as a page of this origin).
export function saveBlob(blob, name) {
  const url = URL.createObjectURL(new Blob([blob], { type: "application/octet-stream" }));
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// --- Server-sent events over fetch -----------------------------------------------------
// EventSource cannot send an Authorization header, so the stream is read with fetch()
// and a ReadableStream, and parsed here by the rules of the SSE format.

export class SseParser {
  constructor() {
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.data = [];
    this.event = "";
    this.id = null;
  }

  // Feed decoded text; returns the complete events it finished: {id, event, data}.
  feed(text) {
    this.buffer += text;
    const out = [];
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (!match) break;
      // A lone "\r" at the end may be the first half of "\r\n": wait for more.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      const done = this.line(line);
      if (done) out.push(done);
    }
    return out;
  }

  // The stream ended: a final "\r" held back (it might have begun a "\r\n") ends its line.
  // A message without its blank line is dropped, as the SSE rules say.
  finish() {
    const out = this.buffer.endsWith("\r") ? this.feed("\n") : [];
    this.buffer = "";
    this.reset();
    return out;
  }

  line(line) {
    if (line === "") {
      // An empty line ends a message; one without data is not dispatched (SSE rules).
      const done = { id: this.id, event: this.event || "message", data: this.data.join("\n") };
      const any = this.data.length > 0;
      this.reset();
      return any ? done : null;
    }
    if (line.startsWith(":")) return null; // a comment: keep-alive
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
    return null;
  }
}

// Follow a run's events: calls onEvent(event_json) for each, in order, exactly once.
// Reconnects after a dropped connection with Last-Event-ID = the last seq seen, so no
// event is missed or repeated. When the server closes the stream, `shouldResume(lastSeq)`
// (async) says whether to reconnect (the run is not over) or to end; stop() ends it too.
export function followEvents(runId, { after = 0, onEvent, shouldResume, onState }) {
  let lastSeq = after;
  let stopped = false;
  let controller = null;
  let retryMs = 500;
  const path = `/runs/${encodeURIComponent(runId)}/events/stream`;

  async function connect() {
    while (!stopped) {
      controller = new AbortController();
      try {
        onState?.("connecting");
        const response = await checked(
          await fetch(path, {
            headers: headers({ Accept: "text/event-stream", "Last-Event-ID": String(lastSeq) }),
            credentials: "omit",
            cache: "no-store",
            signal: controller.signal,
          }),
        );
        onState?.("live");
        retryMs = 500;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        const parser = new SseParser();
        for (;;) {
          const { value, done } = await reader.read();
          for (const message of done ? parser.finish() : parser.feed(value)) {
            let event;
            try {
              event = JSON.parse(message.data);
            } catch {
              continue; // not an event record
            }
            const seq = Number(event.seq ?? message.id);
            if (!Number.isFinite(seq) || seq <= lastSeq) continue; // never twice
            lastSeq = seq;
            onEvent(event);
          }
          if (done) break;
        }
        // The server closed the stream: after the run's final event, or because this
        // client fell behind (then it resumes after the last event it has).
        if (stopped) return;
        if (!(await shouldResume(lastSeq))) {
          onState?.("ended");
          return;
        }
        onState?.("reconnecting");
        await new Promise((resolve) => setTimeout(resolve, 300));
      } catch (error) {
        if (stopped) return;
        if (error instanceof ApiError && error.status !== 503 && error.status < 500) {
          onState?.("error", error.detail);
          return; // 401 (signed out), 404 (no such run): reconnecting cannot help
        }
        onState?.("reconnecting");
        await new Promise((resolve) => setTimeout(resolve, retryMs));
        retryMs = Math.min(retryMs * 2, 2000);
      }
    }
  }

  connect();
  return {
    stop() {
      stopped = true;
      controller?.abort();
    },
    get lastSeq() {
      return lastSeq;
    },
  };
}
