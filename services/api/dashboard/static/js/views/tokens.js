// Your API tokens: prefixes only (a token is shown once, when it is made), revoke one.
// Revoking the token this browser uses logs it out. Admins see everyone's and make new ones
// (for themselves or any owner): a leaked owner token cannot mint more.

import { api, tokenStore } from "../api.js";
import { clear, el, errorBox } from "../dom.js";
import { dateTime } from "../format.js";

const PREFIX_LENGTH = 12;

export async function render({ root, signal, me }) {
  const problem = el("div");
  const shown = el("div", { id: "new-token" });
  const body = el("tbody");
  const columns = [me?.is_admin && "Owner", "Prefix", "Created", ""].filter((c) => c !== false);
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
      el("table", { class: "jobs", id: "tokens-table" },
        el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c)))), body)),
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

  const row = (token) => el(
    "tr", { dataset: { prefix: token.prefix } },
    me?.is_admin && el("td", {}, token.owner),
    el("td", { class: "mono" }, `${token.prefix}…`, token.prefix === inUse && el("span", { class: "muted small" }, " (this browser)")),
    el("td", {}, dateTime(token.created_at)),
    el("td", {}, el("button", { type: "button", class: "danger", onclick: () => revoke(token) }, "Revoke")),
  );

  const refresh = async () => {
    const list = await api("v1/tokens", { signal });
    clear(body, list.items.map(row));
    clear(problem);
  };

  make.addEventListener("click", async () => {
    try {
      const owner = forOwner.value.trim();
      const created = await api("v1/tokens", { method: "POST", body: owner ? { owner } : {}, signal });
      clear(shown, el("div", { class: "notice" },
        el("p", {}, `New token for ${created.owner}, shown this once: copy it now.`),
        el("code", { class: "mono", id: "new-token-value" }, created.token)));
      await refresh();
    } catch (error) {
      if (!signal.aborted) clear(problem, errorBox(error));
    }
  });

  await refresh();
}
