// One job: summary, live charts (history downsampled with max_points, then the SSE stream),
// the events timeline, checkpoints with downloads, Cancel / Resume, and the spec.

import { api, downloadFile, sleep, streamJob } from "../api.js";
import { LineChart, Series } from "../charts.js";
import { clear, el, errorBox } from "../dom.js";
import { ACTIVE, dateTime, effectiveBatch, formatBytes, formatNumber, jobLabel, progressBar, statusBadge } from "../format.js";

// Points per metric fetched as history; a live curve longer than COMPACT_AT is fetched again,
// downsampled by the server (which keeps each curve's min/max shape).
const MAX_POINTS = 1000;
const COMPACT_AT = 3 * MAX_POINTS;
const RECONNECT_MS = 2000;
const PANELS = [
  { id: "chart-loss", title: "Loss", metrics: ["loss", "val_loss"], always: true },
  { id: "chart-val-accuracy", title: "Validation accuracy", metrics: ["val_accuracy"] },
  { id: "chart-lr", title: "Learning rate", metrics: ["lr"] },
  { id: "chart-grad-norm", title: "Gradient norm", metrics: ["grad_norm"] },
  { id: "chart-samples", title: "Samples/s", metrics: ["samples_per_s"] },
];
const EVENT_TONES = {
  succeeded: "good", started: "info", resumed: "info", checkpoint: "muted", created: "muted",
  failed: "bad", traceback: "bad", oom_backoff: "warn", requeued: "warn", lease_expired: "warn",
  fp16_step_skipped: "warn", batchnorm_warning: "warn", cancel_requested: "muted", cancelled: "muted",
};

export async function render({ root, id, signal }) {
  const job = await api(`v1/jobs/${encodeURIComponent(id)}`, { signal });
  new JobPage(root, job, signal).follow();
}

class JobPage {
  constructor(root, job, signal) {
    this.id = job.id;
    this.signal = signal;
    this.series = new Map();
    this.eventIds = new Set();
    this.lastEventId = null;
    this.following = false;
    this.drawPending = false;
    this.compacting = new Set();

    this.title = el("h1", {});
    this.badge = el("span");
    this.cancelButton = el("button", { type: "button", id: "cancel", class: "danger", onclick: () => this.act("cancel") }, "Cancel");
    this.resumeButton = el("button", { type: "button", id: "resume", onclick: () => this.act("resume") }, "Resume");
    this.problem = el("div");
    this.summary = el("dl", { class: "summary" });
    this.streamState = el("span", { class: "muted small", id: "stream-state" });
    const chartGrid = el("div", { class: "charts" });
    this.panels = PANELS.map((panel) => ({ ...panel, chart: new LineChart(chartGrid, { title: panel.title, labels: panel.metrics, id: panel.id }) }));
    this.timeline = el("ol", { class: "timeline", id: "timeline" });
    this.checkpoints = el("tbody");
    this.spec = el("pre", { class: "spec" });

    root.append(
      el("p", { class: "crumbs" }, el("a", { href: "#/jobs" }, "← Jobs")),
      el("div", { class: "toolbar" }, this.title, this.badge, el("span", { class: "spacer" }),
        el("a", { href: `#/compare?ids=${job.id}`, class: "button" }, "Compare…"), this.cancelButton, this.resumeButton),
      this.problem,
      this.summary,
      el("section", {}, el("h2", {}, "Training curves ", this.streamState), chartGrid),
      el("div", { class: "columns" },
        el("section", {}, el("h2", {}, "Events"), this.timeline),
        el("section", {}, el("h2", {}, "Checkpoints"),
          el("div", { class: "table-wrap" }, el("table", { id: "checkpoints" },
            el("thead", {}, el("tr", {}, ["Step", "Epoch", "Size", "val_loss", "sha256", ""].map((c) => el("th", {}, c)))),
            this.checkpoints)))),
      el("details", { class: "spec-box" }, el("summary", {}, "Spec (normalised)"), this.spec),
    );
    signal.addEventListener("abort", () => this.panels.forEach((p) => p.chart.destroy()), { once: true });
    this.show(job);
    this.draw();
    this.loadCheckpoints();
  }

  show(job) {
    // Stream `status` messages do not name the owner (only GET /v1/jobs/ID does): keep it.
    this.job = { ...job, owner: job.owner ?? this.job?.owner };
    job = this.job;
    this.title.textContent = jobLabel(job);
    clear(this.badge, statusBadge(job.status));
    this.cancelButton.hidden = !["queued", "running"].includes(job.status);
    this.resumeButton.hidden = !["failed", "cancelled"].includes(job.status);
    const spec = job.spec;
    const optimizer = `${spec.optimizer.name}, lr ${spec.optimizer.lr}`;
    const latest = job.latest_metrics;
    const rows = [
      ["Job id", el("span", { class: "mono" }, job.id)],
      ["Progress", progressBar(job)],
      ["Effective batch", el("span", { class: "mono" }, effectiveBatch(spec, job.effective_batch_size))],
      ["Model / dataset", `${spec.model.name} on ${spec.dataset.name}`],
      ["Optimizer", optimizer],
      ["Loss", formatNumber(latest.loss)],
      ["Validation", latest.val_loss === undefined ? "–" : `loss ${formatNumber(latest.val_loss)}, accuracy ${formatNumber(latest.val_accuracy)}`],
      ["Attempts", String(job.attempts)],
      ["Worker", job.worker ? [job.worker.host, job.worker.gpu].filter(Boolean).join(" · ") : "–"],
      ["Queue", job.queue],
      ["Owner", job.owner ?? "–"],
      ["Created", dateTime(job.created_at)],
      ["Started", dateTime(job.started_at)],
      ["Finished", dateTime(job.finished_at)],
    ];
    clear(this.summary, rows.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v))));
    clear(this.problem, job.error && errorBox(`${job.error.type}: ${job.error.message}`));
    this.spec.textContent = JSON.stringify(spec, null, 2);
  }

  async act(verb) {
    clear(this.problem);
    try {
      this.show(await api(`v1/jobs/${this.id}/${verb}`, { method: "POST", signal: this.signal }));
    } catch (error) {
      if (!this.signal.aborted) clear(this.problem, errorBox(error));
      return;
    }
    if (verb === "resume" && !this.following) this.follow();
  }

  // Follow the live stream until the job ends, reconnecting (from the last event seen) if the
  // connection drops. Each time the stream opens, the history is read again and merged by step.
  async follow() {
    this.following = true;
    try {
      while (!this.signal.aborted) {
        this.streamState.textContent = "· connecting…";
        try {
          const ended = await streamJob(this.id, (m) => this.onMessage(m), {
            signal: this.signal,
            lastEventId: this.lastEventId,
            onOpen: () => {
              this.streamState.textContent = ACTIVE.has(this.job.status) ? "· live" : "";
              this.loadHistory();
            },
          });
          if (ended) return;
        } catch (error) {
          if (this.signal.aborted) return;
          this.streamState.textContent = `· stream lost (${error.message}); reconnecting`;
        }
        await sleep(RECONNECT_MS, this.signal);
      }
    } finally {
      this.following = false;
    }
  }

  onMessage({ event, data }) {
    if (event === "metric") this.addPoint(data.name, data.step, data.value);
    else if (event === "status") this.show(data);
    else if (event === "job_event") this.addEvent(data);
    else if (event === "end") {
      this.streamState.textContent = "";
      this.loadCheckpoints();
      api(`v1/jobs/${this.id}`, { signal: this.signal }).then((job) => this.show(job)).catch(() => {});
    }
  }

  async loadHistory(name) {
    const query = `max_points=${MAX_POINTS}${name ? `&name=${encodeURIComponent(name)}` : ""}`;
    try {
      const page = await api(`v1/jobs/${this.id}/metrics?${query}`, { signal: this.signal });
      for (const point of page.items) this.addPoint(point.name, point.step, point.value);
    } catch (error) {
      if (!this.signal.aborted) clear(this.problem, errorBox(error));
    }
  }

  addPoint(name, step, value) {
    let series = this.series.get(name);
    if (!series) this.series.set(name, (series = new Series()));
    series.add(step, value);
    if (series.xs.length > COMPACT_AT && !this.compacting.has(name)) this.compact(name);
    if (!this.drawPending) {
      this.drawPending = true;
      requestAnimationFrame(() => this.draw());
    }
  }

  // A long live run: replace the curve by the server's downsample, keep what came after it.
  async compact(name) {
    this.compacting.add(name);
    try {
      const page = await api(`v1/jobs/${this.id}/metrics?name=${encodeURIComponent(name)}&max_points=${MAX_POINTS}`, { signal: this.signal });
      const old = this.series.get(name);
      const fresh = new Series();
      for (const p of page.items) fresh.add(p.step, p.value);
      const last = fresh.xs.length ? fresh.xs[fresh.xs.length - 1] : -1;
      old.xs.forEach((x, i) => { if (x > last) fresh.add(x, old.ys[i]); });
      this.series.set(name, fresh);
    } catch {
      // keep the full curve; the next point tries again
    } finally {
      this.compacting.delete(name);
    }
  }

  draw() {
    this.drawPending = false;
    for (const panel of this.panels) {
      const data = panel.metrics.map((m) => this.series.get(m) ?? new Series());
      panel.chart.figure.hidden = !panel.always && data.every((s) => !s.xs.length);
      panel.chart.set(data);
    }
  }

  addEvent(event) {
    if (this.eventIds.has(event.id)) return;
    this.eventIds.add(event.id);
    this.lastEventId = Math.max(this.lastEventId ?? 0, event.id);
    const list = this.timeline;
    const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
    list.append(
      el("li", { dataset: { kind: event.kind } },
        el("time", { datetime: event.created_at, title: new Date(event.created_at).toLocaleString() }, new Date(event.created_at).toLocaleTimeString()),
        el("span", { class: `kind tone-${EVENT_TONES[event.kind] ?? "muted"}` }, event.kind.replaceAll("_", " ")),
        el("span", { class: "message" }, event.message || ""),
        event.attempt > 1 && el("span", { class: "muted small" }, ` attempt ${event.attempt}`)),
    );
    if (atBottom) list.scrollTop = list.scrollHeight; // follow new events unless scrolled up
    if (event.kind === "checkpoint") this.loadCheckpoints();
  }

  async loadCheckpoints() {
    try {
      const { items } = await api(`v1/jobs/${this.id}/checkpoints`, { signal: this.signal });
      clear(this.checkpoints, items.length ? items.map((c) => this.checkpointRow(c))
        : el("tr", {}, el("td", { colspan: 6, class: "muted empty" }, "None yet")));
    } catch (error) {
      if (!this.signal.aborted) clear(this.problem, errorBox(error));
    }
  }

  checkpointRow(c) {
    const filename = `${this.id}-${c.step}.pt`;
    const download = el("a", { href: `v1/jobs/${this.id}/checkpoints/${c.step}`, class: "download", download: filename });
    download.textContent = "Download";
    download.addEventListener("click", (event) => {
      event.preventDefault(); // the file needs the token: fetch it, then save the blob
      downloadFile(download.getAttribute("href"), filename).catch((error) => clear(this.problem, errorBox(error)));
    });
    return el("tr", { dataset: { step: String(c.step) } },
      el("td", { class: "num" }, String(c.step), c.is_best ? el("span", { class: "best", title: "best val_loss" }, " ★") : null),
      el("td", { class: "num" }, c.epoch ?? "–"),
      el("td", { class: "num" }, formatBytes(c.size_bytes)),
      el("td", { class: "num" }, formatNumber(c.metrics.val_loss)),
      el("td", { class: "mono small", title: c.sha256 }, c.sha256.slice(0, 12)),
      el("td", {}, download));
  }
}
