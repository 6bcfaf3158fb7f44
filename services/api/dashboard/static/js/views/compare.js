// Compare jobs: one metric (loss by default) of two or more jobs on one chart, e.g. batch 64
// against 16 × 4, the classic accumulation experiment. #/compare?ids=A,B&metric=val_loss

import { api, sleep } from "../api.js";
import { COLORS, LineChart, Series } from "../charts.js";
import { clear, el, errorBox } from "../dom.js";
import { ACTIVE, effectiveBatch, formatNumber, jobLabel, statusBadge } from "../format.js";

const METRICS = ["loss", "val_loss", "val_accuracy", "lr", "grad_norm", "samples_per_s"];
const MAX_POINTS = 1000;
const REFRESH_MS = 5000;

export async function render({ root, params, signal }) {
  const ids = (params.get("ids") || "").split(",").map((s) => s.trim()).filter(Boolean);
  const metric = METRICS.includes(params.get("metric")) ? params.get("metric") : "loss";
  root.append(el("div", { class: "toolbar" }, el("h1", {}, "Compare"), el("span", { class: "spacer" }), metricPicker(ids, metric)));
  const picker = el("section", { class: "card picker" });
  if (ids.length < 2) root.append(el("p", { class: "muted" }, "Pick two or more jobs to plot on one chart."));
  if (ids.length) {
    const jobs = await Promise.all(ids.map((id) => api(`v1/jobs/${encodeURIComponent(id)}`, { signal })));
    const chart = new LineChart(root, {
      id: "compare-chart",
      title: `${metric} by optimizer step`,
      labels: jobs.map((j) => `${jobLabel(j)} (${effectiveBatch(j.spec, j.effective_batch_size)})`),
    });
    signal.addEventListener("abort", () => chart.destroy(), { once: true });
    const table = el("tbody");
    root.append(el("div", { class: "table-wrap" }, el("table", { id: "compare-table" },
      el("thead", {}, el("tr", {}, ["", "Job", "Status", "Effective batch (m × N × GPUs)", "Steps", `Last ${metric}`].map((c) => el("th", {}, c)))),
      table)));
    const refresh = async () => {
      const pages = await Promise.all(jobs.map((j) => api(`v1/jobs/${j.id}/metrics?name=${metric}&max_points=${MAX_POINTS}`, { signal })));
      const series = pages.map((page) => {
        const s = new Series();
        for (const p of page.items) s.add(p.step, p.value);
        return s;
      });
      chart.set(series);
      const fresh = await Promise.all(jobs.map((j) => api(`v1/jobs/${j.id}`, { signal })));
      clear(table, fresh.map((job, i) => {
        const swatch = el("span", { class: "swatch" });
        swatch.style.background = COLORS[i % COLORS.length];
        return el("tr", {},
          el("td", {}, swatch),
          el("td", {}, el("a", { href: `#/jobs/${job.id}` }, jobLabel(job))),
          el("td", {}, statusBadge(job.status)),
          el("td", { class: "mono" }, effectiveBatch(job.spec, job.effective_batch_size)),
          el("td", { class: "num" }, String(job.progress.optimizer_step)),
          el("td", { class: "num" }, formatNumber(series[i].ys[series[i].ys.length - 1])));
      }));
      return fresh.some((job) => ACTIVE.has(job.status));
    };
    (async () => {
      let active = await refresh();
      while (active && !signal.aborted) {
        await sleep(REFRESH_MS, signal);
        if (signal.aborted) break;
        active = await refresh().catch((error) => { root.append(errorBox(error)); return false; });
      }
    })().catch((error) => { if (!signal.aborted) root.append(errorBox(error)); });
  }
  root.append(picker);
  await fillPicker(picker, ids, metric, signal);
}

function metricPicker(ids, metric) {
  const select = el("select", { id: "compare-metric", "aria-label": "metric" },
    METRICS.map((m) => el("option", { value: m, selected: m === metric }, m)));
  select.addEventListener("change", () => { location.hash = `#/compare?ids=${ids.join(",")}&metric=${select.value}`; });
  return el("label", { class: "inline" }, "Metric ", select);
}

async function fillPicker(picker, ids, metric, signal) {
  const { items } = await api("v1/jobs?limit=50", { signal });
  const chosen = new Set(ids);
  const list = el("div", { class: "pick-list" }, items.map((job) => {
    const box = el("input", { type: "checkbox", value: job.id, checked: chosen.has(job.id) });
    box.addEventListener("change", () => (box.checked ? chosen.add(job.id) : chosen.delete(job.id)));
    return el("label", { class: "pick" }, box, " ", jobLabel(job), " ", statusBadge(job.status),
      el("span", { class: "muted small mono" }, ` ${effectiveBatch(job.spec, job.effective_batch_size)}`));
  }));
  const show = el("button", { type: "button", class: "primary", id: "compare-show" }, "Compare");
  show.addEventListener("click", () => { location.hash = `#/compare?ids=${[...chosen].join(",")}&metric=${metric}`; });
  clear(picker, el("h2", {}, "Jobs"), items.length ? list : el("p", { class: "muted" }, "No jobs yet."), show);
}
