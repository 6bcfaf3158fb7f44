// Line charts drawn by the vendored uPlot (window.uPlot): any x axis (optimizer step, epoch,
// samples seen, wall time), log scale, EMA smoothing with the raw curve kept faint behind,
// one cursor synced across a page's charts, zoom that survives live updates, and markers on
// the x axis: where a curve went non-finite (NaN, inf) and where an attempt restarted.
// The figure's data-* attributes say what is drawn, so browser tests need not read pixels:
// data-points, data-series, data-nonfinite ("loss@2:NaN ..."), data-restarts, data-zoomed,
// data-x-range ("min,max" of the x axis as drawn).

import { el } from "./dom.js";
import { batchSize, distinctLabels, grouped } from "./format.js";

export const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
export const X_MODES = {
  step: "optimizer step",
  epoch: "epoch",
  samples: "samples seen",
  time: "wall time",
};
// Whole numbers on step and sample axes: no tick at step 2.5.
const WHOLE_INCREMENTS = [1, 2, 5].flatMap((k) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9].map((p) => k * p)).sort((a, b) => a - b);
const HEIGHT = 220;
const COMPACT = new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 });
const NONFINITE_COLOR = "#b91c1c";
const RESTART_COLOR = "#64748b";
// The charts of each sync key: uPlot zooms and unzooms them together, and a chart's own zoom
// (kept across live updates) must follow, or a double-click on one chart leaves the others to
// jump back to the old zoom at their next point.
const SYNCED = new Map();

// One metric's points in step order, with what each point needs for any x axis. A restarted
// attempt rewrites steps after its checkpoint, so a point at a known step replaces the old one.
export class Series {
  constructor() {
    this.steps = [];
    this.values = []; // number, or null when not finite (see labels)
    this.labels = []; // null, or "NaN" / "inf" / "-inf"
    this.times = []; // ms since the epoch
    this.epochs = []; // the API's 0-based epoch index
  }

  get length() {
    return this.steps.length;
  }

  // point: {step, value, nonfinite?, ts, epoch} as the API and the stream send it.
  add(point) {
    const { steps } = this;
    const row = [point.step, point.value ?? null, point.nonfinite ?? (point.value === null ? "NaN" : null),
      point.ts ? Date.parse(point.ts) : null, point.epoch ?? null];
    let at = steps.length;
    if (steps.length && point.step <= steps[steps.length - 1]) {
      let lo = 0;
      let hi = steps.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (steps[mid] < point.step) lo = mid + 1;
        else hi = mid;
      }
      at = lo;
      if (steps[at] === point.step) {
        this.set(at, row);
        return;
      }
    }
    this.insert(at, row);
  }

  set(at, [step, value, label, time, epoch]) {
    this.steps[at] = step;
    this.values[at] = value;
    this.labels[at] = label;
    this.times[at] = time;
    this.epochs[at] = epoch;
  }

  insert(at, [step, value, label, time, epoch]) {
    this.steps.splice(at, 0, step);
    this.values.splice(at, 0, value);
    this.labels.splice(at, 0, label);
    this.times.splice(at, 0, time);
    this.epochs.splice(at, 0, epoch);
  }

  last() {
    const i = this.steps.length - 1;
    return i < 0 ? null : { step: this.steps[i], value: this.values[i], label: this.labels[i] };
  }
}

// How a job's steps map to each x axis: steps per epoch (from the spec's epochs, else from the
// steps the data shows in its first epoch), samples per step (the effective batch).
export function xContext(job, series) {
  const epochs = job.spec?.epochs;
  const total = job.progress?.total_optimizer_steps;
  let perEpoch = typeof epochs === "number" && total ? total / epochs : null;
  if (!perEpoch && series) {
    const i = series.epochs.findIndex((e) => e !== null && e >= 1);
    if (i > 0) perEpoch = series.steps[i] - 1;
  }
  return { perEpoch, batch: batchSize(job) };
}

function xOf(mode, context, series, i) {
  const step = series.steps[i];
  if (mode === "epoch") {
    // Epochs done, fractional (the first epoch spans 0 to 1); until the epoch's length is known
    // (a max_steps job still in its first epoch) the axis stays in steps and says so.
    return context.perEpoch ? step / context.perEpoch : step;
  }
  if (mode === "samples") return context.batch ? step * context.batch : step;
  if (mode === "time") return series.times[i] === null ? null : series.times[i] / 1000;
  return step;
}

// TensorBoard's smoothing: an exponential moving average, debiased at the start, over the
// finite values (a NaN neither resets it nor is smoothed over).
function smooth(values, weight) {
  let last = 0;
  let count = 0;
  return values.map((v) => {
    if (v === null || !Number.isFinite(v)) return null;
    last = last * weight + (1 - weight) * v;
    count += 1;
    return last / (1 - weight ** count);
  });
}

// A y axis's tick labels: grouped digits up to a million, then powers of ten ("2.5e15", never
// "1,000T", whose head a narrow axis cut off as "0,000T"), each with as many digits as it
// takes for no two ticks to read the same.
export function tickLabels(ticks, from = 0) {
  const finite = ticks.filter((t) => t !== null && Number.isFinite(t));
  const max = Math.max(0, ...finite.map(Math.abs));
  const exponent = max >= 1e6 || (max > 0 && max < 1e-3);
  const print = exponent
    ? (v, digits) => (v === 0 ? "0" : v.toExponential(digits).replace(/\.?0+e/, "e").replace("e+", "e"))
    : (v, digits) => new Intl.NumberFormat("en", { maximumFractionDigits: digits }).format(v);
  return distinctLabels(ticks, (v, digits) => (v === null || v === undefined ? "" : print(v, digits)), from);
}

// Room for the longest tick label (uPlot draws them on the canvas, where they would be cut).
function axisWidth(labels) {
  return Math.max(40, 16 + 7 * Math.max(0, ...(labels ?? []).map((l) => String(l ?? "").length)));
}

// A legend's value: 4 significant digits, powers of ten past a million (as the ticks).
function formatValue(v) {
  if (v === null || v === undefined) return "";
  const abs = Math.abs(v);
  if (abs >= 1e6 || (abs !== 0 && abs < 1e-3)) return tickLabels([v], 3)[0];
  return String(Number(v.toPrecision(4)));
}

function formatX(mode, v) {
  if (v === null || v === undefined) return "–";
  if (mode === "time") return new Date(v * 1000).toLocaleTimeString();
  if (mode === "epoch") return Number(v.toFixed(2)).toString();
  return grouped(Math.round(v));
}

export class LineChart {
  // sync: a key shared by the charts whose cursors move together (one page).
  constructor(parent, { title, id, sync = null, logToggle = true, onLog = null }) {
    this.syncKey = sync;
    this.log = false;
    this.plot = el("div", { class: "plot" }, el("p", { class: "muted empty" }, "Waiting for the first point"));
    this.logBox = el("input", { type: "checkbox", class: "log-toggle" });
    this.logBox.addEventListener("change", () => {
      this.log = this.logBox.checked;
      onLog?.(this.log);
      this.redraw(true);
    });
    this.figure = el(
      "figure",
      { class: "chart", id, dataset: { points: "0", series: "0", nonfinite: "", restarts: "", zoomed: "false" } },
      el("figcaption", {}, el("span", { class: "chart-title" }, title), el("span", { class: "spacer" }),
        logToggle && el("label", { class: "inline small muted" }, this.logBox, "log")),
      this.plot,
    );
    parent.append(this.figure);
    this.uplot = null;
    this.structure = null;
    this.zoom = null; // {min, max} of x chosen by the user, kept across data updates
    this.lines = [];
    this.options = { xMode: "step", smoothing: 0, markers: [] };
    this.resizer = new ResizeObserver(() => this.uplot?.setSize(this.size()));
    this.resizer.observe(this.plot);
    if (sync) SYNCED.set(sync, (SYNCED.get(sync) ?? new Set()).add(this));
  }

  // The charts that zoom with this one (itself included).
  group() {
    return this.syncKey ? [...SYNCED.get(this.syncKey)] : [this];
  }

  // Back to the whole run (a double-click on any chart of the group).
  unzoom() {
    this.zoom = null;
    this.userZoom = false;
    this.figure.dataset.zoomed = "false";
    const xs = this.uplot?.data[0];
    if (xs?.length) this.uplot.setScale("x", { min: xs[0], max: xs[xs.length - 1] });
  }

  size() {
    return { width: Math.max(this.plot.clientWidth, 160), height: HEIGHT };
  }

  // Say why a chart stays empty (a finished job that never logged this metric).
  placeholder(text) {
    if (!this.uplot) this.plot.replaceChildren(el("p", { class: "muted empty" }, text));
  }

  // lines: [{label, series: Series, context: xContext(...), color?, width?}]
  // options: {xMode, smoothing (0..0.99), markers: [{x in steps, kind: "restart", text}]}
  set(lines, options = {}) {
    this.lines = lines;
    this.options = { ...this.options, ...options };
    this.redraw(false);
  }

  redraw(rebuild) {
    const { xMode, smoothing } = this.options;
    const filled = this.lines.filter((l) => l.series.length);
    this.figure.dataset.points = String(this.lines.reduce((n, l) => n + l.series.length, 0));
    this.figure.dataset.series = String(filled.length);
    this.figure.dataset.nonfinite = this.nonFiniteMarks().map((m) => `${m.label}@${m.step}:${m.text}`).join(" ");
    this.figure.dataset.restarts = (this.options.markers || []).map((m) => m.x).join(" ");
    if (!filled.length) return;
    const data = this.data();
    const structure = JSON.stringify([this.lines.map((l) => l.label), smoothing > 0, this.log, xMode]);
    if (this.uplot && structure === this.structure && !rebuild) {
      if (this.zoom) {
        this.uplot.setData(data, false);
        this.uplot.setScale("x", this.zoom); // y ranges itself over the zoomed window
      } else {
        this.uplot.setData(data);
      }
      return;
    }
    const keepZoom = this.structure && JSON.parse(this.structure)[3] === xMode ? this.zoom : null;
    this.uplot?.destroy();
    this.plot.replaceChildren();
    this.structure = structure;
    this.zoom = null;
    this.uplot = new window.uPlot(this.uplotOptions(), data, this.plot);
    if (keepZoom) {
      this.zoom = keepZoom;
      this.uplot.setScale("x", keepZoom);
    }
    this.hideSmoothedLegend();
  }

  // One x array for all lines (uPlot.join aligns them, gaps where a line has no point), then
  // per line its raw values and, with smoothing, its EMA.
  data() {
    const { xMode, smoothing } = this.options;
    this.labelsAt = []; // per line: Map x -> "NaN" / "inf" / "-inf"
    const tables = this.lines.map((line) => {
      const { series, context } = line;
      const xs = [];
      const ys = [];
      const labels = new Map();
      for (let i = 0; i < series.length; i += 1) {
        const x = xOf(xMode, context, series, i);
        if (x === null || (xs.length && x <= xs[xs.length - 1])) continue;
        let y = series.values[i];
        if (series.labels[i]) {
          labels.set(x, series.labels[i]);
          y = null; // no finite value to draw: the marker says what it was
        } else if (this.log && y !== null && y <= 0) y = null;
        xs.push(x);
        ys.push(y);
      }
      this.labelsAt.push(labels);
      return smoothing > 0 ? [xs, ys, smooth(ys, smoothing)] : [xs, ys];
    });
    if (tables.length === 1) return tables[0];
    return window.uPlot.join(tables);
  }

  // Where each line went non-finite: the first step of every run of NaN / inf points.
  nonFiniteMarks() {
    const marks = [];
    for (const line of this.lines) {
      const { series } = line;
      for (let i = 0; i < series.length; i += 1) {
        if (series.labels[i] && (i === 0 || !series.labels[i - 1])) {
          let end = i;
          while (end + 1 < series.length && series.labels[end + 1]) end += 1;
          marks.push({ label: line.label, step: series.steps[i], text: series.labels[i], line, i, end });
        }
      }
    }
    return marks;
  }

  uplotOptions() {
    const { xMode, smoothing } = this.options;
    const unknownEpoch = xMode === "epoch" && this.lines.some((l) => !l.context.perEpoch);
    const xLabel = unknownEpoch ? "optimizer step (epoch length not known yet)" : X_MODES[xMode];
    const series = [{ label: X_MODES[xMode], value: (_u, v) => formatX(unknownEpoch ? "step" : xMode, v) }];
    this.lines.forEach((line, i) => {
      const color = line.color ?? COLORS[i % COLORS.length];
      const labelOf = (u, v, idx) => {
        if (v !== null && v !== undefined) return formatValue(v);
        const x = u.data[0][idx];
        return this.labelsAt[i]?.get(x) ?? "–";
      };
      series.push({
        label: line.label,
        stroke: smoothing > 0 ? `${color}44` : color,
        width: smoothing > 0 ? 1 : line.width ?? 2,
        spanGaps: true,
        value: (u, v, _s, idx) => labelOf(u, v, idx),
      });
      if (smoothing > 0) {
        series.push({ label: `${line.label} (smoothed)`, stroke: color, width: 2, spanGaps: true,
          value: (_u, v) => formatValue(v) });
      }
    });
    const wholeX = xMode === "step" || xMode === "samples";
    return {
      ...this.size(),
      scales: { x: { time: xMode === "time" }, y: this.log ? { distr: 3 } : {} },
      cursor: {
        drag: { x: true, y: false },
        // The value each legend shows is the one logged at the cursor's step, or "–": a curve
        // without a point there (val_loss between evaluations) does not borrow a neighbour's.
        dataIdx: (_u, _s, idx) => idx,
        ...(this.syncKey ? { sync: { key: this.syncKey } } : {}),
      },
      series,
      axes: [
        { label: xLabel, labelSize: 20, stroke: "#475569", grid: { stroke: "#e2e8f0" },
          ...(wholeX ? { incrs: WHOLE_INCREMENTS, values: (_u, ticks) => ticks.map((t) => COMPACT.format(t)) } : {}) },
        { size: (_u, labels) => axisWidth(labels), stroke: "#475569", grid: { stroke: "#e2e8f0" },
          values: (_u, ticks) => {
            const labels = tickLabels(ticks);
            this.figure.dataset.yTicks = labels.join("|");
            return labels;
          } },
      ],
      hooks: {
        setSelect: [(u) => {
          if (u.select.width > 0) this.userZoom = true;
        }],
        setScale: [(u, key) => {
          if (key !== "x" || !this.userZoom) return;
          this.userZoom = false;
          this.zoom = { min: u.scales.x.min, max: u.scales.x.max };
          this.figure.dataset.zoomed = "true";
        }],
        ready: [(u) => u.over.addEventListener("dblclick", () => this.group().forEach((chart) => chart.unzoom()))],
        draw: [(u) => {
          this.figure.dataset.xRange = `${u.scales.x.min},${u.scales.x.max}`;
          this.drawMarkers(u);
        }],
      },
    };
  }

  hideSmoothedLegend() {
    if (!(this.options.smoothing > 0)) return;
    const rows = this.uplot.root.querySelectorAll(".u-legend .u-series");
    rows.forEach((row, i) => { if (i > 0 && i % 2 === 0) row.hidden = true; });
  }

  drawMarkers(u) {
    const { xMode } = this.options;
    const { ctx, bbox } = u;
    const ratio = window.devicePixelRatio || 1;
    const vline = (x, color, dash, text, top) => {
      if (x === null || x === undefined || x < u.scales.x.min || x > u.scales.x.max) return;
      const px = Math.round(u.valToPos(x, "x", true));
      ctx.save();
      ctx.strokeStyle = color;
      ctx.setLineDash(dash.map((d) => d * ratio));
      ctx.lineWidth = ratio;
      ctx.beginPath();
      ctx.moveTo(px, bbox.top);
      ctx.lineTo(px, bbox.top + bbox.height);
      ctx.stroke();
      ctx.fillStyle = color;
      ctx.font = `${11 * ratio}px system-ui, sans-serif`;
      ctx.fillText(text, px + 3 * ratio, top ? bbox.top + 12 * ratio : bbox.top + bbox.height - 4 * ratio);
      ctx.restore();
    };
    for (const mark of this.nonFiniteMarks()) {
      const from = xOf(xMode, mark.line.context, mark.line.series, mark.i);
      const to = xOf(xMode, mark.line.context, mark.line.series, mark.end);
      if (to > from) { // the run of non-finite steps, shaded
        const left = u.valToPos(Math.max(from, u.scales.x.min), "x", true);
        const right = u.valToPos(Math.min(to, u.scales.x.max), "x", true);
        if (right > left) {
          ctx.save();
          ctx.fillStyle = "rgba(185, 28, 28, 0.08)";
          ctx.fillRect(left, bbox.top, right - left, bbox.height);
          ctx.restore();
        }
      }
      vline(from, NONFINITE_COLOR, [4, 3], mark.text, true);
    }
    const first = this.lines.find((l) => l.series.length);
    for (const marker of this.options.markers || []) {
      const x = first ? stepToX(xMode, first, marker.x) : null;
      vline(x, RESTART_COLOR, [2, 3], marker.text ?? "restart", false);
    }
  }

  destroy() {
    SYNCED.get(this.syncKey)?.delete(this);
    if (SYNCED.get(this.syncKey)?.size === 0) SYNCED.delete(this.syncKey);
    this.resizer.disconnect();
    this.uplot?.destroy();
  }
}

// A step (a restart's checkpoint) on the chart's x axis: the x of that step's point, or of the
// nearest point after it.
function stepToX(mode, line, step) {
  const { series, context } = line;
  if (mode === "step") return step;
  const i = series.steps.findIndex((s) => s >= step);
  return i < 0 ? null : xOf(mode, context, series, i);
}
