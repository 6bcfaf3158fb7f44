// Parallel coordinates: one vertical axis per spec field the jobs differ in, the last one a
// final metric, and each job a line across them in its colour, so which settings go with a
// good result reads at a glance. Numbers on a linear axis (a log one when they span more than
// a hundredfold), anything else spread evenly by its sorted values. Drawn as SVG; the figure's
// data-axes and each line's data-values say what is drawn, for tests.

import { distinctLabels, significant } from "./format.js";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 800;
const HEIGHT = 280;
const TOP = 42;
const BOTTOM = HEIGHT - 30;
const SIDE = 60;

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  node.append(...children);
  return node;
}

// An axis's scale: value -> 0 (bottom) .. 1 (top), and the labels of its ends.
function scaleOf(values) {
  const present = values.filter((v) => v !== null && v !== undefined);
  if (present.every((v) => typeof v === "number" && Number.isFinite(v))) {
    const min = Math.min(...present);
    const max = Math.max(...present);
    const log = min > 0 && max / min > 100;
    const t = log ? Math.log10 : (v) => v;
    const span = t(max) - t(min);
    const ends = distinctLabels([min, max], (v, digits) => significant(v, digits), 3);
    return { at: (v) => (span ? (t(v) - t(min)) / span : 0.5), low: ends[0], high: ends[1], log };
  }
  const order = [...new Set(present.map((v) => JSON.stringify(v)))].sort();
  const at = (v) => (order.length > 1 ? order.indexOf(JSON.stringify(v)) / (order.length - 1) : 0.5);
  const text = (s) => { const v = JSON.parse(s); return typeof v === "string" ? v : s; };
  return { at, low: order.length ? text(order[0]) : "", high: order.length > 1 ? text(order[order.length - 1]) : "", log: false };
}

// axes: [{name, values: one per job (null where a job has none)}]; lines: [{id, color, label}].
export function parallelCoordinates(axes, lines) {
  const step = axes.length > 1 ? (WIDTH - 2 * SIDE) / (axes.length - 1) : 0;
  const x = (i) => (axes.length > 1 ? SIDE + i * step : WIDTH / 2);
  const scales = axes.map((axis) => scaleOf(axis.values));
  const y = (k, v) => BOTTOM - scales[k].at(v) * (BOTTOM - TOP);
  const drawnAxes = axes.map((axis, k) => svg("g", { class: "pc-axis" },
    svg("line", { x1: x(k), x2: x(k), y1: TOP, y2: BOTTOM, stroke: "#94a3b8" }),
    svg("text", { x: x(k), y: TOP - 22, "text-anchor": "middle", class: "pc-name" }, axis.name + (scales[k].log ? " (log)" : "")),
    svg("text", { x: x(k), y: TOP - 8, "text-anchor": "middle", class: "pc-end" }, scales[k].high),
    svg("text", { x: x(k), y: BOTTOM + 16, "text-anchor": "middle", class: "pc-end" }, scales[k].low)));
  const drawnLines = lines.map((line, j) => {
    const points = axes.map((axis, k) => {
      const v = axis.values[j];
      return v === null || v === undefined ? null : `${x(k).toFixed(1)},${y(k, v).toFixed(1)}`;
    }).filter(Boolean);
    return svg("polyline", {
      points: points.join(" "), fill: "none", stroke: line.color, "stroke-width": 2.5, "stroke-linejoin": "round",
      "data-job-id": line.id, "data-values": axes.map((a) => JSON.stringify(a.values[j] ?? null)).join("|"),
    }, svg("title", {}, line.label));
  });
  return svg("svg", {
    id: "parallel-coordinates", viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", class: "parallel",
    "aria-label": `${lines.length} jobs across ${axes.map((a) => a.name).join(", ")}`,
    "data-axes": axes.map((a) => a.name).join("|"),
  }, ...drawnAxes, ...drawnLines);
}
