// Line charts over optimizer steps, drawn by the vendored uPlot (window.uPlot).
// The container's data-points / data-series attributes say what is plotted, so the
// end-to-end tests can watch a chart grow without reading pixels.

import { el } from "./dom.js";

export const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const DASHES = [[], [6, 4], [2, 3], [8, 3, 2, 3]];
// Optimizer steps are whole numbers: no tick at step 2.5.
const STEP_INCREMENTS = [1, 2, 5].flatMap((k) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7].map((p) => k * p)).sort((a, b) => a - b);
const HEIGHT = 220;
const COMPACT = new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 });

export class LineChart {
  // labels: one per series, in the order set() gets them.
  constructor(parent, { title, labels, id }) {
    this.labels = labels;
    this.plot = el("div", { class: "plot" }, el("p", { class: "muted empty" }, "No points yet"));
    this.figure = el(
      "figure",
      { class: "chart", id, dataset: { points: "0", series: "0" } },
      el("figcaption", {}, title),
      this.plot,
    );
    parent.append(this.figure);
    this.uplot = null;
    this.resizer = new ResizeObserver(() => this.uplot?.setSize(this.size()));
    this.resizer.observe(this.plot);
  }

  size() {
    return { width: Math.max(this.plot.clientWidth, 200), height: HEIGHT };
  }

  // series: [{xs: number[], ys: (number|null)[]}], one per label (xs ascending).
  set(series) {
    const filled = series.filter((s) => s.xs.length);
    this.figure.dataset.points = String(series.reduce((n, s) => n + s.xs.length, 0));
    this.figure.dataset.series = String(filled.length);
    if (!filled.length) return;
    // uPlot wants one shared x array: join aligns the series (gaps where a series has no step).
    const data =
      series.length === 1
        ? [series[0].xs, series[0].ys]
        : window.uPlot.join(series.map((s) => [s.xs, s.ys]));
    if (this.uplot) {
      this.uplot.setData(data);
      return;
    }
    this.plot.replaceChildren();
    this.uplot = new window.uPlot(this.options(), data, this.plot);
  }

  options() {
    return {
      ...this.size(),
      scales: { x: { time: false } },
      cursor: { drag: { x: true, y: false } },
      series: [
        { label: "step" },
        ...this.labels.map((label, i) => ({
          label,
          stroke: COLORS[i % COLORS.length],
          // Dashed after the first: identical curves (64 vs 16 x 4 with exact accumulation)
          // lie on top of each other, and the dashes keep both visible.
          dash: DASHES[i % DASHES.length],
          width: i ? 2 : 1.5,
          spanGaps: true,
          value: (_u, v) => (v === null || v === undefined ? "–" : formatTick(v)),
        })),
      ],
      axes: [
        { label: "optimizer step", labelSize: 20, stroke: "#475569", grid: { stroke: "#e2e8f0" }, incrs: STEP_INCREMENTS },
        {
          size: 64,
          stroke: "#475569",
          grid: { stroke: "#e2e8f0" },
          values: (_u, ticks) => ticks.map(formatTick),
        },
      ],
    };
  }

  destroy() {
    this.resizer.disconnect();
    this.uplot?.destroy();
  }
}

function formatTick(v) {
  const abs = Math.abs(v);
  if (abs >= 1e4) return COMPACT.format(v);
  if (abs !== 0 && abs < 1e-3) return v.toExponential(1);
  return String(Number(v.toPrecision(4)));
}

// One metric's points in step order. A restarted attempt rewrites steps after its checkpoint,
// so a point at a known step replaces the old value instead of being appended.
export class Series {
  constructor() {
    this.xs = [];
    this.ys = [];
  }

  add(step, value) {
    const { xs, ys } = this;
    if (!xs.length || step > xs[xs.length - 1]) {
      xs.push(step);
      ys.push(value);
      return;
    }
    let lo = 0;
    let hi = xs.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (xs[mid] < step) lo = mid + 1;
      else hi = mid;
    }
    if (xs[lo] === step) ys[lo] = value;
    else {
      xs.splice(lo, 0, step);
      ys.splice(lo, 0, value);
    }
  }
}
