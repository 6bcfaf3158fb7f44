// The controls above a page's charts: the x axis (step, epoch, samples seen, wall time) and
// the smoothing weight. Kept in this browser, so every page opens the way it was left.

import { X_MODES } from "./charts.js";
import { el } from "./dom.js";

const KEY = "accum.charts";

export function chartSettings() {
  try {
    const saved = JSON.parse(localStorage.getItem(KEY) || "{}");
    return {
      xMode: saved.xMode in X_MODES ? saved.xMode : "step",
      smoothing: Math.min(Math.max(Number(saved.smoothing) || 0, 0), 0.99),
    };
  } catch {
    return { xMode: "step", smoothing: 0 };
  }
}

export function chartControls(settings, onChange) {
  const xSelect = el("select", { id: "x-axis", "aria-label": "x axis" },
    Object.entries(X_MODES).map(([value, label]) => el("option", { value, selected: value === settings.xMode }, label)));
  const slider = el("input", {
    id: "smoothing", type: "range", min: "0", max: "0.99", step: "0.01", value: String(settings.smoothing),
    "aria-label": "smoothing",
  });
  const shown = el("output", { for: "smoothing", class: "small mono" }, settings.smoothing.toFixed(2));
  const changed = () => {
    settings.xMode = xSelect.value;
    settings.smoothing = Number(slider.value);
    shown.textContent = settings.smoothing.toFixed(2);
    localStorage.setItem(KEY, JSON.stringify(settings));
    onChange(settings);
  };
  xSelect.addEventListener("change", changed);
  slider.addEventListener("input", changed);
  return el("div", { class: "chart-controls" },
    el("label", { class: "inline" }, "x axis ", xSelect),
    el("label", { class: "inline", title: "exponential moving average; the raw curve stays faint behind" },
      "smoothing ", slider, shown));
}
