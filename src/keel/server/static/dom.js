// Building DOM nodes safely. Every piece of text goes in with textContent (or a Text
// node): run data is written by a model and is hostile, so no HTML string is ever parsed.

const SVG_NS = "http://www.w3.org/2000/svg";

// h("a", {href: "#/runs", class: "x", onclick: fn}, "text", child, [more]) -> Element.
// Attributes named on* become event listeners; false/null/undefined attributes are left
// out; strings and numbers among the children become Text nodes.
export function h(tag, attrs = {}, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

// The same for SVG elements.
export function s(tag, attrs = {}, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

function fill(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "style") {
      throw new Error("inline styles are refused by the page's CSP; use a class");
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
}

// Replace every child of `node` with `children`.
export function replace(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

// A status word as a badge: <span class="badge status-running">running</span>.
export function badge(status) {
  const word = String(status || "unknown");
  return h("span", { class: `badge status-${cssWord(word)}` }, word);
}

// A value safe to put in a class name (statuses are plain words; anything else is dropped).
export function cssWord(word) {
  return String(word).toLowerCase().replace(/[^a-z0-9_-]/g, "");
}

// A link inside the console: `#/runs/ID` with the id percent-encoded.
export function runLink(id, text) {
  return h("a", { href: `#/runs/${encodeURIComponent(id)}` }, text || id);
}

// "2024-05-01T10:00:00+00:00" -> local "2024-05-01 12:00:00"; anything else as given.
export function when(iso) {
  if (!iso) return "";
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) return String(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return (
    `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ` +
    `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}`
  );
}

// Text cut to `limit` characters, saying how much was left out.
export function clip(text, limit = 4000) {
  const str = typeof text === "string" ? text : JSON.stringify(text, null, 2);
  if (str === undefined) return "";
  if (str.length <= limit) return str;
  return `${str.slice(0, limit)}\n… (${str.length - limit} more characters)`;
}

// Say `message` to screen readers through the page's aria-live region.
export function announce(message) {
  const region = document.getElementById("announcer");
  if (!region) return;
  region.textContent = "";
  // A new text node after a tick makes every screen reader speak it, even when repeated.
  setTimeout(() => {
    region.textContent = message;
  }, 30);
}

const shown = new WeakMap();

// True when `node` already shows `value` (compared as JSON); else remembers it and returns
// false. Lets a refresh leave untouched (and keep the keyboard focus in) what did not change.
export function unchanged(node, value) {
  const key = JSON.stringify(value ?? null);
  if (shown.get(node) === key) return true;
  shown.set(node, key);
  return false;
}
