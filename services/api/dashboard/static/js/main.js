// The dashboard's router: one view per URL hash, each given an AbortSignal that fires when
// the user leaves it (timers, streams and charts stop with it).
//   #/login   #/jobs?status=running   #/jobs/ID   #/compare?ids=A,B   #/submit?from=ID
//   #/tokens   #/workers (shown when the server has a worker registry)

import { api, openapi, tokenStore } from "./api.js";
import { clear, errorBox } from "./dom.js";
import * as compareView from "./views/compare.js";
import * as jobView from "./views/job.js";
import * as jobsView from "./views/jobs.js";
import * as loginView from "./views/login.js";
import * as submitView from "./views/submit.js";
import * as tokensView from "./views/tokens.js";
import * as workersView from "./views/workers.js";

const VIEWS = {
  login: loginView, jobs: jobsView, job: jobView, compare: compareView, submit: submitView, tokens: tokensView,
  workers: workersView,
};
const session = { me: null, workers: null };
let leaving = null;

function parseHash() {
  const [path, query = ""] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/").filter(Boolean);
  const params = new URLSearchParams(query);
  if (parts[0] === "jobs" && parts[1]) return { name: "job", id: decodeURIComponent(parts[1]), params };
  return { name: parts[0] in VIEWS ? parts[0] : "jobs", params };
}

function showHeader(me) {
  document.getElementById("nav").hidden = !me;
  document.querySelector("#nav [data-route=workers]").hidden = !session.workers;
  document.getElementById("logout").hidden = !me;
  document.getElementById("who").textContent = me ? `${me.name}${me.is_admin ? " (admin)" : ""}` : "";
  const active = parseHash().name;
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.route === active || (active === "job" && link.dataset.route === "jobs"));
  }
}

async function route() {
  leaving?.abort();
  leaving = new AbortController();
  const { signal } = leaving;
  const target = parseHash();
  const root = document.getElementById("view");
  if (target.name !== "login") {
    if (!tokenStore.get()) {
      location.replace("#/login");
      return;
    }
    try {
      session.me ??= await api("v1/me", { signal });
      // The Workers page only where the server keeps a worker registry: its OpenAPI document
      // lists GET /v1/workers (asking an older server would log a 404), and the call answers.
      session.workers ??= "/v1/workers" in ((await openapi()).paths ?? {})
        && await api("v1/workers", { signal }).then(() => true, () => false);
    } catch (error) {
      if (!signal.aborted && error.status !== 401) clear(root, errorBox(error));
      return;
    }
  }
  showHeader(target.name === "login" ? null : session.me);
  clear(root);
  try {
    await VIEWS[target.name].render({ root, id: target.id, params: target.params, signal, me: session.me });
  } catch (error) {
    if (!signal.aborted) root.append(errorBox(error));
  }
}

// A stored token the API refuses (revoked, or another server): back to the login page.
window.addEventListener("accum:unauthorized", () => {
  tokenStore.clear();
  session.me = null;
  session.workers = null;
  location.replace("#/login?expired=1");
});

document.getElementById("logout").addEventListener("click", () => {
  tokenStore.clear();
  session.me = null;
  session.workers = null;
  location.hash = "#/login";
});

window.addEventListener("hashchange", route);
route();
