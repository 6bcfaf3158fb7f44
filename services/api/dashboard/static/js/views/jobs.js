// The jobs list: newest first, filtered by status, refreshed every few seconds; tick jobs
// to compare their loss curves.

import { api, sleep } from "../api.js";
import { clear, el, errorBox } from "../dom.js";
import { age, effectiveBatch, formatNumber, jobLabel, progressBar, statusBadge } from "../format.js";

const STATUSES = ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"];
const REFRESH_MS = 3000;
const PAGE = 100;

export async function render({ root, params, signal, me }) {
  const status = STATUSES.includes(params.get("status")) ? params.get("status") : "";
  const selected = new Set();
  const compare = el("button", { type: "button", id: "compare-selected", disabled: true }, "Compare selected");
  compare.addEventListener("click", () => { location.hash = `#/compare?ids=${[...selected].join(",")}`; });
  const filters = el(
    "nav",
    { class: "filters", "aria-label": "Filter by status" },
    ["", ...STATUSES].map((s) =>
      el("a", { href: s ? `#/jobs?status=${s}` : "#/jobs", class: s === status ? "chip active" : "chip", dataset: { filter: s || "all" } }, s || "all"),
    ),
  );
  const columns = ["", "Name", "Status", "Progress", "Effective batch (m × N × GPUs)", "Loss", "Age", me?.is_admin && "Owner"].filter((c) => c !== false);
  const body = el("tbody");
  const table = el("table", { class: "jobs", id: "jobs-table" }, el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c)))), body);
  const footer = el("p", { class: "muted small" });
  const problem = el("div");
  root.append(
    el("div", { class: "toolbar" }, el("h1", {}, "Jobs"), filters, el("span", { class: "spacer" }), compare,
      el("a", { href: "#/submit", class: "button primary" }, "New job")),
    problem,
    el("div", { class: "table-wrap" }, table),
    footer,
  );

  const row = (job) => {
    const box = el("input", { type: "checkbox", "aria-label": `select ${jobLabel(job)}`, checked: selected.has(job.id) });
    box.addEventListener("change", () => {
      box.checked ? selected.add(job.id) : selected.delete(job.id);
      compare.disabled = selected.size < 2;
    });
    return el(
      "tr", { dataset: { jobId: job.id, status: job.status } },
      el("td", {}, box),
      el("td", {}, el("a", { href: `#/jobs/${job.id}`, class: "job-link" }, jobLabel(job)), el("div", { class: "muted small mono" }, job.id)),
      el("td", {}, statusBadge(job.status)),
      el("td", {}, progressBar(job)),
      el("td", { class: "mono" }, effectiveBatch(job.spec, job.effective_batch_size)),
      el("td", { class: "num" }, formatNumber(job.latest_metrics.loss)),
      el("td", { title: new Date(job.created_at).toLocaleString() }, age(job.created_at)),
      me?.is_admin && el("td", {}, job.owner ?? ""),
    );
  };

  const refresh = async () => {
    const page = await api(`v1/jobs?limit=${PAGE}${status ? `&status=${status}` : ""}`, { signal });
    if (!page.items.length) {
      clear(body, el("tr", {}, el("td", { colspan: columns.length, class: "muted empty" },
        status ? `No ${status} jobs.` : "No jobs yet: submit one.")));
    } else {
      clear(body, page.items.map(row));
    }
    footer.textContent = `${page.items.length}${page.next_cursor ? "+" : ""} jobs · updated ${new Date().toLocaleTimeString()} · refreshes every ${REFRESH_MS / 1000} s`;
    clear(problem);
  };

  await refresh();
  (async () => {
    while (!signal.aborted) {
      await sleep(REFRESH_MS, signal);
      if (signal.aborted || document.hidden) continue;
      try {
        await refresh();
      } catch (error) {
        if (!signal.aborted) clear(problem, errorBox(error));
      }
    }
  })();
}
