// How jobs are shown: status badges, progress bars, effective batch, times, numbers.
// Epochs: the API counts from 0 (the trainer's index); everything shown here counts from 1.
// Non-finite values: the API sends null with a label ("NaN", "inf", "-inf") beside it
// (`nonfinite` on a metric point, `nonfinite_metrics` on a job); they are shown by name.

import { el } from "./dom.js";

export const ACTIVE = new Set(["queued", "running", "cancelling"]);
export const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
const GROUPED = new Intl.NumberFormat("en");
const SHORT_ID = 6; // the id's random tail, unique among an owner's jobs (services/jobdb/job_ids.py)

export function statusBadge(status) {
  return el("span", { class: `status status-${status}`, dataset: { status } }, status);
}

export function progressBar(job) {
  const { optimizer_step: step, total_optimizer_steps: total } = job.progress;
  const fraction = total ? Math.min(step / total, 1) : 0;
  const bar = el("span", { class: "bar-fill" });
  bar.style.width = `${(fraction * 100).toFixed(1)}%`;
  return el(
    "span",
    { class: "progress", title: `optimizer step ${grouped(step)} of ${total ? grouped(total) : "?"}` },
    el("span", { class: "bar" }, bar),
    el("span", { class: "bar-label" }, total ? `${grouped(step)} / ${grouped(total)}` : grouped(step)),
  );
}

// "16 × 4 × 2 GPUs = 128": the factors of the effective batch (m × N × GPUs, × nodes when
// there are several: "16 × 4 × 2 GPUs × 3 nodes = 384").
export function effectiveBatch(spec, effective) {
  const gpus = Math.max(spec.gpus ?? 1, 1), nodes = spec.nodes ?? 1;
  const m = spec.micro_batch_size;
  const n = spec.accumulation_steps;
  const product = effective ?? (typeof m === "number" && typeof n === "number" ? m * n * gpus * nodes : null);
  if (typeof m !== "number" || typeof n !== "number") {
    // "auto" micro-batch, or an epoch schedule of N: only the product is fixed.
    const schedule = n && typeof n === "object" ? ` (N by epoch: ${JSON.stringify(n)})` : "";
    return `${product === null ? "?" : grouped(product)}${m === "auto" ? " (m auto)" : ""}${schedule}`;
  }
  const device = spec.gpus === 0 ? "CPU" : `${gpus} GPU${gpus > 1 ? "s" : ""}`;
  const across = nodes > 1 ? ` × ${nodes} nodes` : "";
  return `${grouped(m)} × ${grouped(n)} × ${device}${across} = ${grouped(product)}`;
}

// Samples per optimizer step: the job's own figure, else m × N × GPUs from its spec.
export function batchSize(job) {
  const { micro_batch_size: m, accumulation_steps: n, gpus, nodes } = job.spec ?? {};
  return job.effective_batch_size ?? (typeof m === "number" && typeof n === "number" ? m * n * Math.max(gpus ?? 1, 1) * (nodes ?? 1) : null);
}

export function grouped(value) {
  return typeof value === "number" && Number.isFinite(value) ? GROUPED.format(value) : String(value ?? "–");
}

// A metric value: 4 significant digits, its label when it is NaN or infinite, "–" when absent.
export function formatNumber(value, nonfinite) {
  if (nonfinite) return nonfinite;
  if (value === null || value === undefined) return "–";
  if (Number.isNaN(value)) return "NaN";
  if (!Number.isFinite(value)) return value > 0 ? "inf" : "-inf";
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return Number(value.toPrecision(4)).toString();
}

// Labels for numbers that must read apart (axis ticks, values compared side by side): printed
// by `print(value, digits)` with the fewest digits, from `from` up, at which no two different
// numbers share a label (0 and 0.0001 never both read "0").
export function distinctLabels(values, print, from = 0) {
  for (let digits = from; digits <= 17; digits += 1) {
    const labels = values.map((v) => print(v, digits));
    const seen = new Map();
    const clash = labels.some((label, i) => seen.has(label) && seen.get(label) !== values[i] ? true : (seen.set(label, values[i]), false));
    if (!clash) return labels;
  }
  return values.map(String);
}

// `digits` significant digits, the shortest way JavaScript writes the result (0.0001, 1e-7).
export function significant(value, digits) {
  return String(Number(value.toPrecision(Math.max(digits, 1))));
}

// The latest value of a job's metric, NaN and infinities included.
export function latestMetric(job, name) {
  return formatNumber(job.latest_metrics?.[name], job.nonfinite_metrics?.[name]);
}

export function hasMetric(job, name) {
  return job.latest_metrics?.[name] !== undefined;
}

export function isNonFinite(job, name) {
  return Boolean(job.nonfinite_metrics?.[name]);
}

export function epochNumber(index) {
  return typeof index === "number" ? String(index + 1) : "–";
}

export function formatBytes(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

export function age(timestamp, now = Date.now()) {
  return timestamp ? duration((now - Date.parse(timestamp)) / 1000) : "–";
}

// "45 s", "3 min", "2 h 07 min", "3 d 4 h"
export function duration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 172800) return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

// How long a job ran (or has been running): finished − first started, or now − first started
// (the job's own started_at is its latest attempt's: a restarted job took all of its attempts).
export function runTime(job, now = Date.now()) {
  if (!job.started_at) return null;
  const started = job.attempts?.[0]?.started_at ?? job.started_at;
  const end = job.finished_at ? Date.parse(job.finished_at) : FINISHED.has(job.status) ? null : now;
  return end === null ? null : (end - Date.parse(started)) / 1000;
}

export function dateTime(timestamp) {
  return timestamp ? new Date(timestamp).toLocaleString() : "–";
}

export function shortId(id) {
  return String(id).slice(-SHORT_ID);
}

export function jobLabel(job) {
  return job.name || shortId(job.id);
}

// Names repeat (one spec submitted twice): pickers and legends add the short id.
export function uniqueLabel(job) {
  return `${job.name || "unnamed"} · ${shortId(job.id)}`;
}

// The badge of the first-window check (issue: every job proves its accumulation exact), when
// the API reports one: `exactness: {checked, rel_error, tolerance, passed, note}`.
// `caveat`: a warning event that limits what the check proves (a BatchNorm model: the check
// runs in eval mode, while in training each micro-batch is normalised on its own statistics),
// said on the badge itself rather than only in the events.
export function exactnessBadge(job, caveat = null) {
  const check = job.exactness;
  if (check && check.status === "pending") {
    // Compared only where every weighting agrees: not a pass (issue 28); later windows decide.
    return el("span", { class: "exactness pending", id: "exactness", title: check.note || "" }, "exactness pending");
  }
  if (!check || !check.checked) return null;
  const value = check.rel_error;
  const error = typeof value === "number" ? `, rel. error ${value === 0 ? "0" : value.toExponential(1)}` : "";
  if (!check.passed) return el("span", { class: "exactness inexact", id: "exactness", title: check.note || "" }, `accumulation NOT exact${error}`);
  if (caveat) {
    return el("span", { class: "exactness caveat", id: "exactness", title: `${caveat.message}\n${check.note || ""}` },
      `first window = big batch${error}; ${caveat.text}`);
  }
  return el("span", { class: "exactness exact", id: "exactness", title: check.note || "" }, `first window = big batch${error}`);
}

// The caveats a job's events put on its exactness check, by event kind.
export const EXACTNESS_CAVEATS = {
  batchnorm_warning: "BatchNorm: training differs from the big batch",
};

// The non-finite value that stopped a run (accumcore's NonFiniteError): the job's
// `error.nonfinite` as the worker records it ({step, metric, value}: "NaN", "inf" or "-inf"),
// as {step, metric, label}, or null. The run never logged that step's metrics, so its charts
// have no point there without this.
export function nonFiniteStop(job) {
  const stop = job.error?.nonfinite;
  if (!stop || typeof stop.step !== "number" || !stop.metric) return null;
  return { step: stop.step, metric: stop.metric, label: stop.value };
}

// The same shape from a live `exactness_check` event (as services/api/schemas.py `exactness`).
export function exactnessOfEvent(event) {
  const data = event.data || {};
  const checked = data.passed === true || data.passed === false;
  const status = data.status === "skipped" ? "not_checked" : data.status || (checked ? (data.passed ? "passed" : "failed") : "not_checked");
  return {
    status, checked, passed: checked ? data.passed : null, tolerance: data.tolerance ?? null, note: event.message || "",
    rel_error: typeof data.rel_error === "number" && Number.isFinite(data.rel_error) ? data.rel_error : null,
  };
}
