// The workers (from the worker registry, GET /v1/workers, on servers that have one): name,
// queues, devices, current job and how long ago each was last heard from.

import { api, sleep } from "../api.js";
import { clear, el, errorBox } from "../dom.js";
import { age, shortId } from "../format.js";

const REFRESH_MS = 5000;

function devices(worker) {
  const list = worker.devices;
  if (!Array.isArray(list) || !list.length) return worker.gpus ?? "CPU";
  return list.map((d) => (typeof d === "string" ? d : [d.name ?? d.model, d.memory_gb ? `${d.memory_gb} GB` : null,
    d.memory_bytes ? `${Math.round(d.memory_bytes / 2 ** 30)} GiB` : null].filter(Boolean).join(" "))).join(", ");
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
      const job = w.current_job ?? w.job_id ?? null;
      const jobId = typeof job === "string" ? job : job?.id;
      const heartbeat = w.heartbeat_at ?? w.last_heartbeat_at ?? w.renewed_at;
      return el("tr", { dataset: { worker: w.name } },
        el("td", { class: "mono", "data-label": "Name" }, w.name),
        el("td", { "data-label": "State" }, w.state ?? (jobId ? "busy" : "idle")),
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
