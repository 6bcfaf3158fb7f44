// Log in: the token is checked against GET /v1/me, then kept in local storage.

import { ApiError, api, tokenStore } from "../api.js";
import { el, errorBox } from "../dom.js";

export async function render({ root, params }) {
  const input = el("input", {
    id: "token", type: "password", name: "token", autocomplete: "current-password",
    placeholder: "accum_…", required: true, autofocus: true,
  });
  const message = el("div", { class: "message" });
  if (params.get("expired")) message.append(errorBox("The saved token was refused; enter a valid one."));
  const form = el(
    "form",
    { class: "card login", onsubmit: (event) => submit(event, input, message) },
    el("h1", {}, "accum"),
    el("label", { for: "token" }, "API token"),
    input,
    el("p", { class: "hint" }, "Create one with ", el("code", {}, "accum token create NAME"),
      "; ", el("code", {}, "accum up"), " prints a local one. It is kept in this browser only."),
    el("button", { type: "submit", class: "primary" }, "Log in"),
    message,
  );
  root.append(form);
}

async function submit(event, input, message) {
  event.preventDefault();
  const token = input.value.trim();
  message.replaceChildren();
  try {
    await api("v1/me", { token });
  } catch (error) {
    const text = error instanceof ApiError && error.status === 401 ? `Token refused: ${error.message}` : error;
    message.append(errorBox(text));
    return;
  }
  tokenStore.set(token);
  location.hash = "#/jobs";
}
