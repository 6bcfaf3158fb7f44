// Your API tokens: prefixes only (a token is shown once, when it is made), revoke one.
// Revoking the token this browser uses logs it out. Admins see everyone's and make new ones
// (for themselves or any owner): a leaked owner token cannot mint more.

import { api, tokenStore } from "../api.js";
import { clear, el, errorBox } from "../dom.js";
import { age, dateTime } from "../format.js";

const PREFIX_LENGTH = 12;

export async function render({ root, signal, me }) {
  const problem = el("div");
  const shown = el("div", { id: "new-token" });
  const body = el("tbody");
  const head = el("tr");
  let columns = [];
  const make = el("button", { type: "button", class: "primary", id: "make-token" }, "New token");
  const forOwner = el("input", { id: "token-owner", placeholder: `owner (default: ${me?.name ?? "you"})`, "aria-label": "owner of the new token" });
  root.append(
    el("div", { class: "toolbar" }, el("h1", {}, "Tokens"), el("span", { class: "spacer" }),
      me?.is_admin && forOwner, me?.is_admin && make),
    el("p", { class: "muted small" },
      "A token is shown once, when it is made. Revoke one you no longer use, or one that leaked: " +
      "it is refused from the next request."),
    problem,
    shown,
    el("div", { class: "table-wrap" },
      el("table", { class: "jobs responsive", id: "tokens-table" }, el("thead", {}, head), body)),
  );
  const inUse = (tokenStore.get() || "").slice(0, PREFIX_LENGTH);

  const revoke = async (token) => {
    const self = token.prefix === inUse;
    const question = self
      ? `Revoke ${token.prefix}…, the token this browser uses? You will be logged out.`
      : `Revoke ${token.prefix}…? Requests with it will be refused.`;
    if (!window.confirm(question)) return;
    try {
      await api(`v1/tokens/${encodeURIComponent(token.prefix)}`, { method: "DELETE", signal });
      if (self) window.dispatchEvent(new CustomEvent("accum:unauthorized"));
      else await refresh();
    } catch (error) {
      if (!signal.aborted) clear(problem, errorBox(error));
    }
  };

  const row = (token, lastUsed) => el(
    "tr", { dataset: { prefix: token.prefix } },
    me?.is_admin && el("td", { "data-label": "Owner" }, token.owner),
    el("td", { class: "mono", "data-label": "Prefix" }, `${token.prefix}…`, token.prefix === inUse && el("span", { class: "muted small" }, " (this browser)")),
    el("td", { "data-label": "Created" }, dateTime(token.created_at)),
    lastUsed && el("td", { "data-label": "Last used" }, token.last_used_at ? `${age(token.last_used_at)} ago` : "never"),
    el("td", {}, el("button", { type: "button", class: "danger", onclick: () => revoke(token) }, "Revoke")),
  );

  const refresh = async () => {
    const list = await api("v1/tokens", { signal });
    // When the server records it (newer servers do), when each token was last used.
    const lastUsed = list.items.some((t) => "last_used_at" in t);
    columns = [me?.is_admin && "Owner", "Prefix", "Created", lastUsed && "Last used", ""].filter((c) => c !== false);
    clear(head, columns.map((c) => el("th", {}, c)));
    clear(body, list.items.map((t) => row(t, lastUsed)));
    clear(problem);
  };

  make.addEventListener("click", async () => {
    try {
      const owner = forOwner.value.trim();
      const created = await api("v1/tokens", { method: "POST", body: owner ? { owner } : {}, signal });
      const copy = el("button", { type: "button", id: "copy-token" }, "Copy");
      copy.addEventListener("click", async () => {
        try {
          await navigator.clipboard.writeText(created.token);
          copy.textContent = "Copied";
        } catch {
          // no clipboard (plain http, or refused): select it for Ctrl-C
          getSelection().selectAllChildren(value);
          copy.textContent = "Selected: press Ctrl-C";
        }
      });
      const value = el("code", { class: "mono", id: "new-token-value" }, created.token);
      clear(shown, el("div", { class: "notice" },
        el("p", {}, `New token for ${created.owner}, shown this once: copy it now.`),
        el("div", { class: "copy-row" }, value, copy)));
      await refresh();
    } catch (error) {
      if (!signal.aborted) clear(problem, errorBox(error));
    }
  });

  await refresh();
}
