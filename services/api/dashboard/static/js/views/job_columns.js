// Columns a user adds to the jobs table: spec fields and latest metrics, by key
// (`spec:optimizer.lr`, `metric:grad_norm`), kept in the URL (`cols=`), each sortable.

import { clear, el } from "../dom.js";
import { formatNumber, isNonFinite, latestMetric } from "../format.js";

// The spec fields worth a column, as paths into the normalised spec, with their headers.
export const SPEC_FIELDS = [
  ["model.name", "Model"], ["dataset.name", "Dataset"], ["micro_batch_size", "m"], ["accumulation_steps", "N"],
  ["gpus", "GPUs"], ["optimizer.name", "Optimizer"], ["optimizer.lr", "lr"], ["optimizer.weight_decay", "Weight decay"],
  ["epochs", "Epochs"], ["max_steps", "Max steps"], ["precision", "Precision"], ["seed", "Seed"],
];
const SPEC_LABELS = new Map(SPEC_FIELDS);

function specValue(spec, path) {
  return path.split(".").reduce((value, part) => (value && typeof value === "object" ? value[part] : undefined), spec);
}

function specText(value) {
  if (value === undefined || value === null) return "–";
  if (typeof value === "number") return formatNumber(value);
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

// NaN sorts after every number (the worst loss), missing values after that.
export function metricOrder(job, name) {
  if (isNonFinite(job, name)) return Infinity;
  const value = job.latest_metrics?.[name];
  return typeof value === "number" ? value : Number.MAX_VALUE;
}

// A column object as the jobs table uses them (key, label, sort, cell), or null for a key
// that names nothing this page knows.
export function extraColumn(key) {
  const [kind, name] = [key.slice(0, key.indexOf(":")), key.slice(key.indexOf(":") + 1)];
  if (kind === "spec" && SPEC_LABELS.has(name)) {
    const label = SPEC_LABELS.get(name);
    return {
      key, label, title: `spec ${name}`,
      sort: (j) => { const v = specValue(j.spec, name); return typeof v === "number" ? v : String(v ?? "").toLowerCase(); },
      cell: (j) => el("td", { class: "mono", "data-label": label, dataset: { column: key } }, specText(specValue(j.spec, name))),
    };
  }
  if (kind === "metric" && /^[\w.\-/]{1,100}$/.test(name)) {
    return {
      key, label: name, title: `latest ${name}`, sort: (j) => metricOrder(j, name),
      cell: (j) => el("td", { class: `num${isNonFinite(j, name) ? " nonfinite" : ""}`, "data-label": name, dataset: { column: key } },
        latestMetric(j, name)),
    };
  }
  return null;
}

// The "Columns" menu: a checkbox per spec field and per metric the listed jobs logged.
export function columnChooser(onChange) {
  const list = el("div", { class: "column-list" });
  const menu = el("details", { class: "column-chooser", id: "column-chooser" }, el("summary", {}, "Columns"), list);
  return {
    menu,
    update(jobs, chosen) {
      const metrics = new Set(chosen.filter((k) => k.startsWith("metric:")).map((k) => k.slice(7)));
      for (const job of jobs) for (const name of Object.keys(job.latest_metrics ?? {})) metrics.add(name);
      for (const job of jobs) for (const name of Object.keys(job.nonfinite_metrics ?? {})) metrics.add(name);
      const box = (key, label) => {
        const input = el("input", { type: "checkbox", value: key, checked: chosen.includes(key) });
        input.addEventListener("change", () => onChange(key, input.checked));
        return el("label", { class: "inline small" }, input, ` ${label}`);
      };
      clear(list,
        el("div", { class: "muted small" }, "Spec"), SPEC_FIELDS.map(([path, label]) => box(`spec:${path}`, label)),
        el("div", { class: "muted small" }, "Latest metrics"), [...metrics].sort().map((name) => box(`metric:${name}`, name)));
    },
  };
}
