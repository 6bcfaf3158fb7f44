// The jobs list: the newest jobs, refreshed every few seconds, sortable by any column,
// searchable by name, notes and tags, filtered by status and tag (on the server) and by owner
// and queue; spec fields and latest metrics as columns of your choice (job_columns.js); tick
// jobs to compare them. The choices live in the URL
// (#/jobs?status=running&tag=sweep&q=cnn&sort=loss&cols=spec:optimizer.lr), so a reload or a
// shared link shows the same list.

import { api, sleep } from "../api.js";
import { clear, el, errorBox } from "../dom.js";
import { columnChooser, extraColumn, metricOrder } from "./job_columns.js";
import {
  age, duration, effectiveBatch, isNonFinite, latestMetric, progressBar, runTime, shortId, statusBadge,
} from "../format.js";

const STATUSES = ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"];
const REFRESH_MS = 3000;
const PAGE = 200;
// The validation metric shown per job: accuracy where there is one, else the loss.
const FINAL_METRICS = ["val_accuracy", "val_loss"];

function finalMetric(job) {
  const name = FINAL_METRICS.find((n) => job.latest_metrics?.[n] !== undefined);
  return name ? { name, text: latestMetric(job, name), value: job.latest_metrics[name] } : null;
}

// Columns: label, sort key (a value to order by), cell; then the chosen extra ones.
function columns(me, extra) {
  const cols = [
    { key: "name", label: "Name", sort: (j) => (j.name || "").toLowerCase(),
      cell: (j) => el("td", { "data-label": "Name" }, el("a", { href: `#/jobs/${j.id}`, class: "job-link" }, j.name || "unnamed"),
        el("div", { class: "muted small mono" }, shortId(j.id)),
        j.tags?.length ? el("div", { class: "tags" }, j.tags.map((t) => el("a", { href: `#/jobs?tag=${encodeURIComponent(t)}`, class: "tag", dataset: { tag: t } }, t))) : null) },
    { key: "status", label: "Status", sort: (j) => STATUSES.indexOf(j.status), cell: (j) => el("td", { "data-label": "Status" }, statusBadge(j.status)) },
    { key: "progress", label: "Progress", sort: (j) => (j.progress.total_optimizer_steps ? j.progress.optimizer_step / j.progress.total_optimizer_steps : 0),
      cell: (j) => el("td", { "data-label": "Progress" }, progressBar(j)) },
    { key: "batch", label: "Effective batch", title: "m × N × GPUs", sort: (j) => j.effective_batch_size ?? 0,
      cell: (j) => el("td", { class: "mono", "data-label": "Batch" }, effectiveBatch(j.spec, j.effective_batch_size)) },
    { key: "loss", label: "Loss", sort: (j) => metricOrder(j, "loss"),
      cell: (j) => el("td", { class: `num${isNonFinite(j, "loss") ? " nonfinite" : ""}`, "data-label": "Loss" }, latestMetric(j, "loss")) },
    { key: "val", label: "Validation", sort: (j) => finalMetric(j)?.value ?? -Infinity,
      cell: (j) => {
        const metric = finalMetric(j);
        return el("td", { class: "num", "data-label": "Validation", title: metric?.name ?? "" },
          metric ? `${metric.text} ${metric.name === "val_accuracy" ? "acc" : "loss"}` : "–");
      } },
    { key: "duration", label: "Duration", sort: (j) => runTime(j) ?? -1,
      cell: (j) => { const t = runTime(j); return el("td", { class: "num", "data-label": "Duration" }, t === null ? "–" : duration(t)); } },
    { key: "queue", label: "Queue", sort: (j) => j.queue, cell: (j) => el("td", { "data-label": "Queue" }, j.queue) },
    { key: "age", label: "Age", sort: (j) => Date.parse(j.created_at), cell: (j) => el("td", { title: new Date(j.created_at).toLocaleString(), "data-label": "Age" }, age(j.created_at)) },
  ];
  if (me?.is_admin) cols.push({ key: "owner", label: "Owner", sort: (j) => j.owner ?? "", cell: (j) => el("td", { "data-label": "Owner" }, j.owner ?? "") });
  return [...cols, ...extra.map(extraColumn).filter(Boolean)];
}

export async function render({ root, params, signal, me }) {
  const state = {
    status: STATUSES.includes(params.get("status")) ? params.get("status") : "",
    q: params.get("q") || "",
    tag: params.get("tag") || "",
    cols: (params.get("cols") || "").split(",").filter((k) => extraColumn(k)),
    owner: params.get("owner") || "",
    queue: params.get("queue") || "",
    sort: params.get("sort") || "age",
    dir: params.get("dir") === "asc" ? "asc" : "desc",
  };
  let cols = columns(me, state.cols);
  if (!cols.some((c) => c.key === state.sort)) state.sort = "age";
  const selected = new Set();
  let jobs = [];
  let more = false;

  const compare = el("button", { type: "button", id: "compare-selected", disabled: true }, "Compare selected");
  compare.addEventListener("click", () => { location.hash = `#/compare?ids=${[...selected].join(",")}`; });
  const chips = ["", ...STATUSES].map((s) => {
    const chip = el("a", { href: s ? `#/jobs?status=${s}` : "#/jobs", class: "chip", dataset: { filter: s || "all" } }, s || "all");
    chip.addEventListener("click", (event) => {
      event.preventDefault(); // keep the other choices; only the server's filter changes
      state.status = s;
      remember();
      markChips();
      refresh().catch((error) => { if (!signal.aborted) clear(problem, errorBox(error)); });
    });
    return chip;
  });
  const markChips = () => chips.forEach((c) => c.classList.toggle("active", (c.dataset.filter === "all" ? "" : c.dataset.filter) === state.status));
  const statusFilter = el("nav", { class: "filters", "aria-label": "Filter by status" }, chips);
  const search = el("input", { type: "search", id: "job-search", placeholder: "Search name, notes, tags", value: state.q, "aria-label": "search jobs by name, notes or tag" });
  const tagSelect = el("select", { id: "tag-filter", "aria-label": "tag" });
  const ownerSelect = el("select", { id: "owner-filter", "aria-label": "owner", hidden: !me?.is_admin });
  const queueSelect = el("select", { id: "queue-filter", "aria-label": "queue" });
  const head = el("tr");
  const body = el("tbody");
  const table = el("table", { class: "jobs responsive", id: "jobs-table" }, el("thead", {}, head), body);
  const chooser = columnChooser((key, on) => {
    state.cols = on ? [...state.cols.filter((k) => k !== key), key] : state.cols.filter((k) => k !== key);
    cols = columns(me, state.cols);
    if (!cols.some((c) => c.key === state.sort)) state.sort = "age";
    remember();
    renderHead();
    renderBody();
  });
  const footer = el("p", { class: "muted small", id: "jobs-footer" });
  const problem = el("div");
  root.append(
    el("div", { class: "toolbar" }, el("h1", {}, "Jobs"), el("span", { class: "spacer" }), compare,
      el("a", { href: "#/submit", class: "button primary" }, "New job")),
    el("div", { class: "toolbar filters-bar" }, statusFilter, search, tagSelect, ownerSelect, queueSelect, chooser.menu),
    problem,
    el("div", { class: "table-wrap" }, table),
    footer,
  );

  // The choices go into the URL without a navigation (the view is not rebuilt).
  const remember = () => {
    const query = new URLSearchParams();
    for (const key of ["status", "tag", "q", "owner", "queue"]) if (state[key]) query.set(key, state[key]);
    if (state.cols.length) query.set("cols", state.cols.join(","));
    if (state.sort !== "age" || state.dir !== "desc") { query.set("sort", state.sort); query.set("dir", state.dir); }
    const hash = `#/jobs${query.size ? `?${query}` : ""}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
  };

  const renderHead = () => {
    clear(head, el("th", { class: "select" }, el("span", { class: "visually-hidden" }, "Select")), cols.map((c) => {
      const active = c.key === state.sort;
      const button = el("button", { type: "button", class: "sort", dataset: { sort: c.key }, title: c.title ?? `Sort by ${c.label.toLowerCase()}` },
        c.label, active ? (state.dir === "asc" ? " ▲" : " ▼") : "");
      button.addEventListener("click", () => {
        state.dir = active && state.dir === "desc" ? "asc" : active ? "desc" : c.key === "name" || c.key === "queue" ? "asc" : "desc";
        state.sort = c.key;
        remember();
        renderHead();
        renderBody();
      });
      return el("th", { "aria-sort": active ? (state.dir === "asc" ? "ascending" : "descending") : "none" }, button);
    }));
  };

  const options = (select, values, current, all) => {
    clear(select, el("option", { value: "" }, all), [...values].sort().map((v) => el("option", { value: v, selected: v === current }, v)));
    select.value = current;
  };

  const row = (job) => {
    const box = el("input", { type: "checkbox", "aria-label": `select ${job.name || job.id}`, checked: selected.has(job.id) });
    box.addEventListener("change", () => {
      box.checked ? selected.add(job.id) : selected.delete(job.id);
      compare.disabled = selected.size < 2;
    });
    return el("tr", { dataset: { jobId: job.id, status: job.status } }, el("td", { class: "select" }, box), cols.map((c) => c.cell(job)));
  };

  const renderBody = () => {
    const q = state.q.trim().toLowerCase();
    const matches = (j) => (j.name || "").toLowerCase().includes(q) || j.id.startsWith(q)
      || (j.notes || "").toLowerCase().includes(q) || (j.tags ?? []).some((t) => t.toLowerCase().includes(q));
    const shown = jobs.filter((j) => (!q || matches(j))
      && (!state.owner || j.owner === state.owner) && (!state.queue || j.queue === state.queue));
    const col = cols.find((c) => c.key === state.sort);
    const sign = state.dir === "asc" ? 1 : -1;
    shown.sort((a, b) => {
      const [x, y] = [col.sort(a), col.sort(b)];
      return (x < y ? -1 : x > y ? 1 : 0) * sign || b.id.localeCompare(a.id);
    });
    if (!shown.length) {
      const why = jobs.length || state.tag ? "No jobs match these filters." : state.status ? `No ${state.status} jobs.` : "No jobs yet: submit one.";
      clear(body, el("tr", {}, el("td", { colspan: cols.length + 1, class: "muted empty" }, why)));
    } else {
      clear(body, shown.map(row));
    }
    footer.textContent = `${shown.length} of ${jobs.length}${more ? "+" : ""} jobs · updated ${new Date().toLocaleTimeString()} · refreshes every ${REFRESH_MS / 1000} s`
      + (more ? ` · the ${PAGE} newest are listed: narrow by status for older ones` : "");
  };

  const refresh = async () => {
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (state.status) query.set("status", state.status);
    if (state.tag) query.set("tag", state.tag); // on the server: older jobs with the tag too
    const page = await api(`v1/jobs?${query}`, { signal });
    jobs = page.items;
    more = Boolean(page.next_cursor);
    options(ownerSelect, new Set(jobs.map((j) => j.owner).filter(Boolean)), state.owner, "all owners");
    options(queueSelect, new Set(jobs.map((j) => j.queue)), state.queue, "all queues");
    options(tagSelect, new Set([...jobs.flatMap((j) => j.tags ?? []), ...(state.tag ? [state.tag] : [])]), state.tag, "all tags");
    chooser.update(jobs, state.cols);
    renderBody();
    clear(problem);
  };

  search.addEventListener("input", () => { state.q = search.value; remember(); renderBody(); });
  ownerSelect.addEventListener("change", () => { state.owner = ownerSelect.value; remember(); renderBody(); });
  queueSelect.addEventListener("change", () => { state.queue = queueSelect.value; remember(); renderBody(); });
  tagSelect.addEventListener("change", () => {
    state.tag = tagSelect.value;
    remember();
    refresh().catch((error) => { if (!signal.aborted) clear(problem, errorBox(error)); });
  });
  renderHead();
  markChips();
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
