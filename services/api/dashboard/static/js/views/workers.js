// The workers (from the worker registry, GET /v1/workers, on servers that have one): name,
// state, queues, devices, and for admins the current job and how long ago each was last
// heard from (owners are not told those).

import { api, sleep } from "../api.js";
import { clear, el, errorBox } from "../dom.js";
import { age, shortId } from "../format.js";

const REFRESH_MS = 5000;

// "2× NVIDIA H100 80GB HBM3 (80 GiB)" or "AMD EPYC, 16 cores"
function devices(worker) {
  const list = Array.isArray(worker.devices) ? worker.devices : [];
  const gpus = list.filter((d) => d.kind === "gpu");
  if (gpus.length) {
    const names = [...new Set(gpus.map((d) => d.name))].join(", ");
    const memory = Math.max(0, ...gpus.map((d) => d.memory_bytes ?? 0));
    return `${gpus.length}× ${names}${memory ? ` (${Math.round(memory / 2 ** 30)} GiB)` : ""}`;
  }
  return list.map((d) => [d.name ?? "CPU", d.cores ? `${d.cores} cores` : null].filter(Boolean).join(", ")).join("; ") || "CPU";
}

export async function render({ root, signal }) {
  const body = el("tbody");
  const problem = el("div");
  root.append(
    el("div", { class: "toolbar" }, el("h1", {}, "Workers")),
    problem,
    el("div", { class: "table-wrap" }, el("table", { class: "jobs responsive", id: "workers-table" },
      el("thead", {}, el("tr", {}, ["Name", "State", "Queues", "Devices", "Current job", "Heartbeat"].map((c) => el("th", {}, c)))),
      body)),
  );
  const refresh = async () => {
    const { items } = await api("v1/workers", { signal });
    clear(body, items.length ? items.map((w) => {
      const jobId = w.current_job ?? null;
      const heartbeat = w.last_seen ?? null;
      return el("tr", { dataset: { worker: w.name, state: w.state } },
        el("td", { class: "mono", "data-label": "Name" }, w.name),
        el("td", { "data-label": "State" }, el("span", { class: `status worker-${w.state}` }, w.state)),
        el("td", { "data-label": "Queues" }, (w.queues ?? []).join(", ")),
        el("td", { "data-label": "Devices" }, devices(w)),
        el("td", { "data-label": "Current job" }, jobId ? el("a", { href: `#/jobs/${jobId}`, class: "mono" }, shortId(jobId)) : "–"),
        el("td", { "data-label": "Heartbeat" }, heartbeat ? `${age(heartbeat)} ago` : "–"));
    }) : el("tr", {}, el("td", { colspan: 6, class: "muted empty" }, "No worker has registered.")));
    clear(problem);
  };
  await refresh();
  while (!signal.aborted) {
    await sleep(REFRESH_MS, signal);
    if (signal.aborted) break;
    await refresh().catch((error) => { if (!signal.aborted) clear(problem, errorBox(error)); });
  }
}
