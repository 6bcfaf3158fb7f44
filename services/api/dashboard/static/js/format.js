// How jobs are shown: status badges, progress bars, effective batch, ages, numbers.

import { el } from "./dom.js";

export const ACTIVE = new Set(["queued", "running", "cancelling"]);

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
    { class: "progress", title: `optimizer step ${step} of ${total ?? "?"}` },
    el("span", { class: "bar" }, bar),
    el("span", { class: "bar-label" }, total ? `${step} / ${total}` : `${step}`),
  );
}

// "16 × 4 × 2 GPUs = 128": the three factors of the effective batch (m × N × GPUs).
export function effectiveBatch(spec, effective) {
  const gpus = Math.max(spec.gpus ?? 1, 1);
  const m = spec.micro_batch_size;
  const n = spec.accumulation_steps;
  if (typeof m !== "number" || typeof n !== "number") {
    // "auto" micro-batch, or an epoch schedule of N: only the product is fixed.
    const schedule = n && typeof n === "object" ? ` (N by epoch: ${JSON.stringify(n)})` : "";
    return `${effective ?? "?"}${m === "auto" ? " (m auto)" : ""}${schedule}`;
  }
  const device = spec.gpus === 0 ? "CPU" : `${gpus} GPU${gpus > 1 ? "s" : ""}`;
  return `${m} × ${n} × ${device} = ${effective ?? m * n * gpus}`;
}

export function formatNumber(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return Number(value.toPrecision(4)).toString();
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
  const seconds = Math.max(0, (now - Date.parse(timestamp)) / 1000);
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
  return `${Math.floor(seconds / 86400)} d`;
}

export function dateTime(timestamp) {
  return timestamp ? new Date(timestamp).toLocaleString() : "–";
}

export function jobLabel(job) {
  return job.name || job.id;
}
