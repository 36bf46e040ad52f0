// The Keel console: hash routes (#/signin, #/runs, #/runs/ID, #/tasks), so the server
// needs no route but / and /static. Nothing here holds data; it all comes from the API
// with the token typed in at sign-in.

import { call, token, signIn, signOut, whenUnauthorized, ApiError } from "./api.js";
import { h, replace, announce } from "./dom.js";
import { runsPage } from "./runs.js";
import { runPage } from "./run.js";
import { tasksPage } from "./tasks.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const signOutButton = document.getElementById("sign-out");
let leave = null; // the current page's cleanup
let signInMessage = "";

whenUnauthorized((detail) => {
  signInMessage = `The server refused the token (${detail}). Sign in again.`;
  go("#/signin");
});

document.getElementById("skip").addEventListener("click", () => main.focus());

signOutButton.addEventListener("click", () => {
  signOut();
  signInMessage = "Signed out: the token was removed from this tab.";
  go("#/signin");
});

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function signInPage() {
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    "aria-describedby": "token-help",
  });
  const error = h("p", { class: "error", role: "alert", id: "signin-error", hidden: !signInMessage }, signInMessage);
  signInMessage = "";
  const button = h("button", { type: "submit", class: "primary" }, "Sign in");
  const form = h(
    "form",
    {
      class: "signin",
      onsubmit: async (event) => {
        event.preventDefault();
        const value = input.value.trim();
        if (!value) {
          error.textContent = "Type a token first.";
          error.hidden = false;
          input.focus();
          return;
        }
        button.disabled = true;
        signIn(value);
        try {
          await call("/runs?limit=1", { quiet401: true });
          input.value = "";
          announce("Signed in");
          go("#/runs");
        } catch (e) {
          signOut();
          error.textContent =
            e instanceof ApiError && e.status === 401
              ? `That token was refused: ${e.detail}`
              : `Could not sign in: ${e.message}`;
          error.hidden = false;
          input.focus();
          input.select();
        } finally {
          button.disabled = false;
        }
      },
    },
    h("label", { for: "token" }, "API token"),
    input,
    h(
      "p",
      { id: "token-help", class: "muted" },
      "Create one with “keel token create NAME”. It is kept in this tab only (sessionStorage) and sent with each request; closing the tab or signing out forgets it.",
    ),
    button,
  );
  replace(main, h("h1", { tabindex: "-1" }, "Sign in to Keel"), error, form);
  input.focus();
  return null;
}

function route() {
  leave?.();
  leave = null;
  const hash = location.hash || "#/runs";
  const signedIn = Boolean(token());
  nav.hidden = !signedIn;
  signOutButton.hidden = !signedIn;
  if (!signedIn || hash === "#/signin") {
    if (signedIn && hash === "#/signin") {
      go("#/runs");
      return;
    }
    if (hash !== "#/signin") {
      history.replaceState(null, "", "#/signin");
    }
    document.title = "Sign in · Keel";
    leave = signInPage();
    return;
  }
  for (const link of nav.querySelectorAll("a")) {
    const active = hash === link.getAttribute("href") || hash.startsWith(`${link.getAttribute("href")}/`);
    if (active) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const runMatch = /^#\/runs\/([^/]+)$/.exec(hash);
  if (runMatch) {
    const id = decodeURIComponent(runMatch[1]);
    document.title = `Run ${id} · Keel`;
    leave = runPage(main, id);
  } else if (hash === "#/tasks") {
    document.title = "Task graph · Keel";
    leave = tasksPage(main);
  } else {
    if (hash !== "#/runs") history.replaceState(null, "", "#/runs");
    document.title = "Runs · Keel";
    leave = runsPage(main);
  }
  main.querySelector("h1")?.focus();
}

window.addEventListener("hashchange", route);
route();
