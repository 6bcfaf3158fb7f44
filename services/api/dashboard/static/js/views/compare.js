// Compare jobs: one chart per chosen metric, every job a solid line of its own colour, on any
// x axis, with a table of the spec fields that differ between the jobs (m, N, lr, ...): the
// classic accumulation experiment, batch 64 against 16 × 4, reads at a glance.
//   #/compare?ids=A,B&metrics=loss,val_accuracy

import { api, sleep } from "../api.js";
import { chartControls, chartSettings } from "../chart_controls.js";
import { COLORS, LineChart, Series, xContext } from "../charts.js";
import { cardRow, clear, el, errorBox } from "../dom.js";
import { parallelCoordinates } from "../parallel.js";
import {
  ACTIVE, batchSize, distinctLabels, effectiveBatch, exactnessBadge, grouped, significant, statusBadge, uniqueLabel,
} from "../format.js";

const METRICS = ["loss", "val_loss", "val_accuracy", "lr", "grad_norm", "samples_per_s", "items_per_s", "step_time_s"];
const MAX_POINTS = 1000;
const REFRESH_MS = 5000;
// Spec fields with short names people know them by; any other differing field shows its path.
const FIELD_NAMES = {
  micro_batch_size: "m", accumulation_steps: "N", gpus: "GPUs", "optimizer.lr": "lr",
  "optimizer.name": "optimizer", "model.name": "model", "dataset.name": "dataset",
};
const IGNORED_FIELDS = new Set(["name", "queue"]);

export async function render({ root, params, signal }) {
  const ids = (params.get("ids") || "").split(",").map((s) => s.trim()).filter(Boolean);
  const asked = (params.get("metrics") || params.get("metric") || "loss").split(",").filter((m) => METRICS.includes(m));
  const metrics = asked.length ? asked : ["loss"];
  const settings = chartSettings();
  const picker = el("section", { class: "card picker" });
  const problem = el("div");
  root.append(el("div", { class: "toolbar" }, el("h1", {}, "Compare"), el("span", { class: "spacer" }), metricPicker(ids, metrics)), problem);
  if (ids.length < 2) root.append(el("p", { class: "muted" }, "Pick two or more jobs to plot together."));
  if (ids.length) {
    const jobs = await Promise.all(ids.map((id) => api(`v1/jobs/${encodeURIComponent(id)}`, { signal })));
    const grid = el("div", { class: "charts" });
    const charts = metrics.map((m) => new LineChart(grid, { id: `compare-${m.replaceAll("_", "-")}`, title: m, sync: "compare" }));
    signal.addEventListener("abort", () => charts.forEach((c) => c.destroy()), { once: true });
    const table = el("tbody");
    const columns = ["Colour", "Job", "Status", "Effective batch (m × N × GPUs)", "Steps", ...metrics.map((m) => `Last ${m}`)];
    const diff = el("div", { id: "compare-diff" });
    root.append(
      el("div", { class: "section-head" }, el("span", { class: "spacer" }), chartControls(settings, () => draw())),
      grid,
      el("h2", {}, "Jobs"),
      el("div", { class: "table-wrap" }, el("table", { id: "compare-table", class: "responsive" },
        el("thead", {}, el("tr", {}, ["", ...columns.slice(1)].map((c) => el("th", {}, c)))),
        table)),
      diff,
    );
    const series = new Map(); // `${job}/${metric}` -> Series
    let fresh = jobs;
    const draw = () => charts.forEach((chart, k) => chart.set(fresh.map((job, i) => {
      const s = series.get(`${job.id}/${metrics[k]}`) ?? new Series();
      // Solid lines, each narrower than the one before: curves that coincide (64 against
      // 16 × 4, exact accumulation) show as a line inside a band, both visible.
      return { label: uniqueLabel(job), color: COLORS[i % COLORS.length], width: Math.max(4.5 - 1.5 * i, 1.25),
        series: s, context: xContext(job, series.get(`${job.id}/loss`) ?? s) };
    }), { xMode: settings.xMode, smoothing: settings.smoothing }));
    const refresh = async () => {
      const wanted = [...new Set([...metrics, "loss"])];
      const pages = await Promise.all(jobs.flatMap((j) => wanted.map((m) =>
        api(`v1/jobs/${j.id}/metrics?name=${m}&max_points=${MAX_POINTS}`, { signal }).then((page) => [j.id, m, page]))));
      for (const [id, m, page] of pages) {
        const s = new Series();
        for (const p of page.items) s.add(p);
        series.set(`${id}/${m}`, s);
      }
      fresh = await Promise.all(jobs.map((j) => api(`v1/jobs/${j.id}`, { signal })));
      draw();
      // Each metric's last values, in as many digits as it takes to tell the jobs apart.
      const lasts = new Map(metrics.map((m) => [m, distinctLabels(fresh.map((job) => {
        const last = series.get(`${job.id}/${m}`)?.last();
        return last ? last.label ?? last.value : null;
      }), metricText, 4)]));
      clear(table, fresh.map((job, i) => cardRow({ dataset: { jobId: job.id } }, columns, [
        el("td", {}, el("span", { class: "swatch", style: `background:${COLORS[i % COLORS.length]}` })),
        el("td", {}, el("a", { href: `#/jobs/${job.id}` }, uniqueLabel(job)), " ", exactnessBadge(job)),
        el("td", {}, statusBadge(job.status)),
        el("td", { class: "mono" }, effectiveBatch(job.spec, job.effective_batch_size)),
        el("td", { class: "num" }, grouped(job.progress.optimizer_step)),
        ...metrics.map((m) => el("td", { class: "num" }, lasts.get(m)[i]))])));
      // A non-finite or missing last value has no place on the metric's axis.
      const lastValue = (job, m) => {
        const last = series.get(`${job.id}/${m}`)?.last();
        return last && !last.label ? last.value : null;
      };
      clear(diff, diffTable(fresh), parallelView(fresh, metrics[0], lastValue));
      return fresh.some((job) => ACTIVE.has(job.status));
    };
    (async () => {
      let active = await refresh();
      while (active && !signal.aborted) {
        await sleep(REFRESH_MS, signal);
        if (signal.aborted) break;
        active = await refresh().catch((error) => { clear(problem, errorBox(error)); return false; });
      }
    })().catch((error) => { if (!signal.aborted) clear(problem, errorBox(error)); });
  }
  root.append(picker);
  await fillPicker(picker, ids, metrics, signal);
}

// The spec as flat "path: value" pairs: {"optimizer": {"lr": 0.1}} -> {"optimizer.lr": 0.1}.
function flatten(value, prefix = "", out = {}) {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) flatten(v, prefix ? `${prefix}.${k}` : k, out);
  } else {
    out[prefix] = value;
  }
  return out;
}

// A metric's value with `digits` significant digits; NaN and inf by their label, "–" if none.
function metricText(value, digits) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "string") return value;
  const abs = Math.abs(value);
  return abs !== 0 && (abs < 1e-3 || abs >= 1e6) ? value.toExponential(digits - 1) : significant(value, digits);
}

// A row of spec values, numbers in as many digits as it takes for different values to read
// differently (weight_decay 0 against 0.0001, not "0" and "0").
function showRow(values) {
  const numbers = distinctLabels(values.map((v) => (typeof v === "number" ? v : null)),
    (v, digits) => (v === null ? "" : Number.isInteger(v) ? grouped(v) : significant(v, digits)), 4);
  return values.map((v, i) => {
    if (v === undefined || v === null) return "–";
    if (typeof v === "number") return numbers[i];
    return typeof v === "string" ? v : JSON.stringify(v);
  });
}

// The spec fields whose values differ between the jobs, one row each; the effective batch
// first, since it is what the jobs are usually compared by.
// The spec fields whose values differ between the jobs: [[shown name, one value per job]].
function differingFields(jobs) {
  const flat = jobs.map((j) => flatten(j.spec));
  const fields = [...new Set(flat.flatMap(Object.keys))].filter((f) => !IGNORED_FIELDS.has(f)
    && new Set(flat.map((s) => JSON.stringify(s[f]))).size > 1);
  return fields.map((f) => [FIELD_NAMES[f] ?? f, flat.map((s) => s[f] ?? null)]);
}

// Parallel coordinates of the differing fields (and the effective batch, when it differs)
// against each job's last value of `metric`; null with fewer than two jobs or nothing to spread.
function parallelView(jobs, metric, lastValue) {
  const batches = jobs.map(batchSize);
  const fields = [...(new Set(batches).size > 1 ? [["effective batch", batches]] : []), ...differingFields(jobs)];
  if (jobs.length < 2 || !fields.length) return null;
  const finals = jobs.map((job) => lastValue(job, metric));
  const axes = [...fields.map(([name, values]) => ({ name, values })), { name: `last ${metric}`, values: finals }];
  const lines = jobs.map((job, i) => ({ id: job.id, color: COLORS[i % COLORS.length], label: uniqueLabel(job) }));
  return [el("h2", {}, `Spec fields against the last ${metric}`), el("div", { class: "card parallel-box" }, parallelCoordinates(axes, lines))];
}

function diffTable(jobs) {
  const fields = differingFields(jobs);
  const rows = [["effective batch", jobs.map(batchSize)], ...fields];
  const same = new Set(jobs.map(batchSize)).size === 1;
  return [
    el("h2", {}, "What differs"),
    fields.length ? null : el("p", { class: "muted" }, "The specs are the same but for their names."),
    el("div", { class: "table-wrap" }, el("table", { id: "compare-diff-table", class: "responsive" },
      el("thead", {}, el("tr", {}, el("th", {}, "Field"), jobs.map((j, i) => el("th", {},
        el("span", { class: "swatch", style: `background:${COLORS[i % COLORS.length]}` }), " ", uniqueLabel(j))))),
      el("tbody", {}, rows.map(([field, values], r) => cardRow({ dataset: { field }, class: r === 0 && same ? "same" : "" },
        [null, ...jobs.map(uniqueLabel)], [el("th", { scope: "row" }, field), ...showRow(values).map((text) => el("td", { class: "mono" }, text))]))))),
  ];
}

function metricPicker(ids, metrics) {
  const chosen = new Set(metrics);
  return el("fieldset", { class: "metric-picker", id: "compare-metrics" }, el("legend", { class: "visually-hidden" }, "Metrics"),
    METRICS.map((m) => {
      const box = el("input", { type: "checkbox", value: m, checked: chosen.has(m) });
      box.addEventListener("change", () => {
        box.checked ? chosen.add(m) : chosen.delete(m);
        if (!chosen.size) return;
        location.hash = `#/compare?ids=${ids.join(",")}&metrics=${METRICS.filter((x) => chosen.has(x)).join(",")}`;
      });
      return el("label", { class: "chip-check" }, box, m);
    }));
}

async function fillPicker(picker, ids, metrics, signal) {
  const { items } = await api("v1/jobs?limit=100", { signal });
  const chosen = new Set(ids);
  const list = el("div", { class: "pick-list" }, items.map((job) => {
    const box = el("input", { type: "checkbox", value: job.id, checked: chosen.has(job.id) });
    box.addEventListener("change", () => (box.checked ? chosen.add(job.id) : chosen.delete(job.id)));
    return el("label", { class: "pick" }, box, " ", uniqueLabel(job), " ", statusBadge(job.status),
      el("span", { class: "muted small mono" }, ` ${effectiveBatch(job.spec, job.effective_batch_size)}`));
  }));
  const showButton = el("button", { type: "button", class: "primary", id: "compare-show" }, "Compare");
  showButton.addEventListener("click", () => { location.hash = `#/compare?ids=${[...chosen].join(",")}&metrics=${metrics.join(",")}`; });
  clear(picker, el("h2", {}, "Jobs"), items.length ? list : el("p", { class: "muted" }, "No jobs yet."), showButton);
}
