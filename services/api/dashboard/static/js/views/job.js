// One job: summary, live charts (history downsampled with max_points, then the SSE stream),
// its attempts, the events timeline (filterable, checkpoints folded), checkpoints with
// downloads, the job's own output (Logs, job_logs.js), Cancel (confirmed) / Resume / Clone, and the spec.

import { api, downloadFile, saveBlob, sleep, streamJob } from "../api.js";
import { chartControls, chartSettings } from "../chart_controls.js";
import { LineChart, Series, xContext } from "../charts.js";
import { cardRow, clear, el, errorBox, richText } from "../dom.js";
import { metricsCsv } from "../metrics_csv.js";
import { LogsPanel } from "./job_logs.js";
import {
  ACTIVE, EXACTNESS_CAVEATS, FINISHED, dateTime, duration, effectiveBatch, epochNumber, exactnessBadge, exactnessOfEvent,
  formatBytes, formatNumber, grouped, hasMetric, isNonFinite, jobLabel, latestMetric, nonFiniteStop, progressBar, runTime,
  statusBadge,
} from "../format.js";

// Points per metric fetched as history; a live curve longer than COMPACT_AT is fetched again,
// downsampled by the server (which keeps each curve's min/max shape).
const MAX_POINTS = 1000;
const COMPACT_AT = 3 * MAX_POINTS;
const RECONNECT_MS = 2000;
const PANELS = [
  { id: "chart-loss", title: "Loss", metrics: ["loss", "val_loss"], always: true },
  // System metrics (services/worker/system_metrics.py), beside the loss; a panel the job has no
  // figure for (no GPU, no NVML) takes no place, live or not.
  { id: "chart-host", title: "Host CPU and memory %", metrics: ["host_cpu_percent", "host_memory_percent"], ifAny: true },
  { id: "chart-rss", title: "Process memory (RSS, bytes)", metrics: ["process_rss_bytes"], ifAny: true },
  { id: "chart-gpu", title: "GPU utilisation %", metrics: ["gpu_utilization_percent"], ifAny: true },
  { id: "chart-gpu-memory", title: "GPU memory used (bytes)", metrics: ["gpu_memory_used_bytes"], ifAny: true },
  { id: "chart-val-accuracy", title: "Validation accuracy", metrics: ["val_accuracy"], waiting: "Waiting for the first evaluation" },
  { id: "chart-lr", title: "Learning rate", metrics: ["lr"] },
  { id: "chart-grad-norm", title: "Gradient norm", metrics: ["grad_norm"] },
  { id: "chart-samples", title: "Samples/s", metrics: ["samples_per_s"] },
];
// Any other metric the run logs (items_per_s, step_time_s, GPU power, ...)
// gets a chart of its own, after these, the first time a point of it arrives.
const DRAWN = new Set(PANELS.flatMap((p) => p.metrics));
const EVENT_TONES = {
  succeeded: "good", started: "info", resumed: "info", checkpoint: "muted", created: "muted",
  failed: "bad", traceback: "bad", process_died: "bad", oom_backoff: "warn", requeued: "warn", lease_expired: "warn",
  fp16_step_skipped: "warn", nonfinite_step_skipped: "warn", batchnorm_warning: "warn",
  cancel_requested: "muted", cancelled: "muted", system_metrics: "muted",
};
// How an attempt ended, in the page's words (the API's `outcome`).
const OUTCOMES = {
  handed_back: "handed back (worker stopped)", store_fault: "handed back (store fault)",
  node_lost: "handed back (node lost)", hung: "handed back (rank hung)", lost: "worker lost",
};
const CHECKPOINTS_NAMED = 4;
const ATTEMPT_COLUMNS = ["Attempt", "Worker", "Started", "Ended", "Outcome", "From step", "Steps"];
const CHECKPOINT_COLUMNS = ["Step", "Epoch", "Size", "val_loss", "sha256", "File"];

// A finished short job's time to a tenth of a second (a demo job takes about one).
function tookText(seconds, job) {
  return FINISHED.has(job.status) && seconds < 59.95 ? `${seconds.toFixed(1)} s` : duration(seconds);
}

// Where the last attempt's time went, as its worker timed it (the API's `phases`, in order):
// "queued 0.02 s · claim 0.01 s · build 0.21 s · ...".
function phasesText(job) {
  const attempts = job.attempts ?? [];
  const last = attempts[attempts.length - 1];
  if (!last?.phases || !Object.keys(last.phases).length) return null;
  const parts = [];
  if (attempts.length === 1 && job.created_at && last.started_at) {
    parts.push(`queued ${Math.max((Date.parse(last.started_at) - Date.parse(job.created_at)) / 1000, 0).toFixed(2)} s`);
  }
  for (const [name, seconds] of Object.entries(last.phases)) parts.push(`${name.replace("_", " ")} ${Number(seconds).toFixed(2)} s`);
  return parts.join(" · ");
}

export async function render({ root, id, signal }) {
  let job;
  try {
    job = await api(`v1/jobs/${encodeURIComponent(id)}`, { signal });
  } catch (error) {
    if (error.status !== 404) throw error;
    // Another owner's job answers 404 too: say so in the page's words, with a way back.
    root.append(el("p", { class: "crumbs" }, el("a", { href: "#/jobs" }, "← Jobs")),
      el("div", { class: "card", id: "not-found" }, el("h1", {}, "No such job"),
        el("p", {}, "There is no job ", el("code", {}, id), " that this token may see: it does not exist, or it belongs to another owner."),
        el("p", {}, el("a", { href: "#/jobs", class: "button" }, "Back to your jobs"))));
    return;
  }
  const page = new JobPage(root, job, signal);
  // A finished job's curves are read before the first paint (its panels are only those it
  // has); a live job's are read when its stream opens, so the two leave no gap between them.
  if (FINISHED.has(job.status)) await page.loadHistory();
  else page.draw();
  page.follow();
}

class JobPage {
  constructor(root, job, signal) {
    this.id = job.id;
    this.signal = signal;
    this.series = new Map();
    this.events = [];
    this.eventIds = new Set();
    this.lastEventId = null;
    this.following = false;
    this.drawPending = false;
    this.compacting = new Set();
    this.settings = chartSettings();
    this.kindFilter = "";
    this.caveat = null; // {text, message} of a warning that limits the exactness check

    this.title = el("h1", {});
    this.badge = el("span");
    this.exactness = el("span");
    this.cancelButton = el("button", { type: "button", id: "cancel", class: "danger", onclick: () => this.cancel() }, "Cancel");
    this.resumeButton = el("button", { type: "button", id: "resume", onclick: () => this.act("resume") }, "Resume");
    this.deleteButton = el("button", { type: "button", id: "delete", class: "danger", onclick: () => this.remove() }, "Delete");
    this.csvButton = el("button", { type: "button", id: "export-csv", title: "every logged point, not downsampled", onclick: () => this.exportCsv() }, "CSV");
    this.problem = el("div", { id: "problem" });
    this.labels = el("section", { id: "labels", class: "labels" });
    this.editingLabels = false;
    this.summary = el("dl", { class: "summary" });
    this.streamState = el("span", { class: "muted small", id: "stream-state" });
    this.chartGrid = el("div", { class: "charts" });
    this.panels = PANELS.map((panel) => this.panel(panel));
    this.attemptRows = el("tbody");
    this.nodeList = el("p", { class: "small", id: "nodes", hidden: true });
    this.kindSelect = el("select", { id: "event-kind", "aria-label": "show events of kind" });
    this.kindSelect.addEventListener("change", () => { this.kindFilter = this.kindSelect.value; this.renderEvents(); });
    this.timeline = el("ol", { class: "timeline", id: "timeline" });
    this.checkpoints = el("tbody");
    this.spec = el("pre", { class: "spec" });
    this.logs = new LogsPanel(job.id, signal);

    root.append(
      el("p", { class: "crumbs" }, el("a", { href: "#/jobs" }, "← Jobs")),
      el("div", { class: "toolbar" }, this.title, this.badge, this.exactness, el("span", { class: "spacer" }),
        el("a", { href: `#/compare?ids=${job.id}`, class: "button" }, "Compare…"),
        el("a", { href: `#/submit?from=${job.id}`, class: "button", id: "clone" }, "Clone"),
        this.csvButton, this.cancelButton, this.resumeButton, this.deleteButton),
      this.problem,
      this.labels,
      this.summary,
      el("section", {},
        el("div", { class: "section-head" }, el("h2", {}, "Training curves ", this.streamState),
          chartControls(this.settings, () => this.draw())),
        this.chartGrid),
      el("section", {}, el("h2", {}, "Attempts"),
        el("div", { class: "table-wrap" }, el("table", { id: "attempts", class: "responsive" },
          el("thead", {}, el("tr", {}, ["#", ...ATTEMPT_COLUMNS.slice(1)].map((c) => el("th", {}, c)))),
          this.attemptRows)), this.nodeList),
      el("div", { class: "columns" },
        el("section", {}, el("div", { class: "section-head" }, el("h2", {}, "Events"),
          el("label", { class: "inline small" }, "show ", this.kindSelect)), this.timeline),
        el("section", {}, el("h2", {}, "Checkpoints"),
          el("div", { class: "table-wrap" }, el("table", { id: "checkpoints", class: "responsive" },
            el("thead", {}, el("tr", {}, CHECKPOINT_COLUMNS.map((c, i) => el("th", {}, i === CHECKPOINT_COLUMNS.length - 1 ? "" : c)))),
            this.checkpoints)))),
      this.logs.section,
      el("details", { class: "spec-box" }, el("summary", {}, "Spec (normalised)"), this.spec),
    );
    signal.addEventListener("abort", () => this.panels.forEach((p) => p.chart.destroy()), { once: true });
    this.show(job);
    this.loadCheckpoints();
  }

  panel(panel) {
    return { ...panel, chart: new LineChart(this.chartGrid, { title: panel.title, id: panel.id, sync: `job-${this.id}` }) };
  }

  show(job) {
    // GET /v1/jobs/ID and the stream's `status` messages are the same object; the exactness
    // check may also come as the exactness_check event, so a status message without it keeps it.
    this.job = { ...job, owner: job.owner ?? this.job?.owner, exactness: job.exactness ?? this.job?.exactness,
      trackers: job.trackers ?? this.job?.trackers };
    job = this.job;
    this.title.textContent = jobLabel(job);
    clear(this.badge, statusBadge(job.status));
    clear(this.exactness, exactnessBadge(job, this.caveat));
    const stop = nonFiniteStop(job);
    if (stop) this.markStop(stop);
    this.cancelButton.hidden = !["queued", "running"].includes(job.status);
    this.resumeButton.hidden = !["failed", "cancelled"].includes(job.status);
    this.deleteButton.hidden = !FINISHED.has(job.status); // the API deletes finished jobs only
    const spec = job.spec;
    const optimizer = `${spec.optimizer.name}, lr ${spec.optimizer.lr}`;
    const epochs = spec.epochs ? ` of ${spec.epochs}` : "";
    const validation = ["val_loss", "val_accuracy"].filter((n) => hasMetric(job, n) || isNonFinite(job, n));
    const queue = typeof job.queue_position === "number" && job.status === "queued"
      ? `${job.queue} (position ${job.queue_position})` : job.queue;
    const took = runTime(job);
    const rows = [
      ["Job id", el("span", { class: "mono" }, job.id)],
      ["Progress", progressBar(job)],
      ["Epoch", `${epochNumber(job.progress.epoch)}${epochs}`],
      ["Effective batch", el("span", { class: "mono" }, effectiveBatch(spec, job.effective_batch_size))],
      ["Model / dataset", `${spec.model.name} on ${spec.dataset.name}`],
      ...(job.strategy ? [["Strategy", el("span", { id: "strategy" }, sharingStrategy(job))]] : []),
      ...(job.levers?.length ? [["Memory levers", el("span", { id: "levers" }, job.levers.join(", "))]] : []),
      ...(job.peak_memory_bytes_per_rank?.length
        ? [["Peak memory", el("span", { id: "rank-peaks", class: "mono" },
          job.peak_memory_bytes_per_rank.map((b, r) => `rank ${r}: ${b === null ? "–" : formatBytes(b)}`).join(", "))]]
        : []),
      ["Optimizer", optimizer],
      ["Loss", el("span", { id: "latest-loss", class: isNonFinite(job, "loss") ? "nonfinite" : "" }, latestMetric(job, "loss"))],
      stop && ["Stopped by", el("span", { id: "stopped-by", class: "nonfinite" }, `${stop.metric} ${stop.label} at step ${grouped(stop.step)}`)],
      ["Validation", validation.length ? validation.map((n) => `${n.replace("val_", "")} ${latestMetric(job, n)}`).join(", ") : "–"],
      ["Queue", queue],
      ["Owner", job.owner ?? "–"],
      ...(job.trackers?.length ? [["Trackers", trackerLinks(job.trackers)]] : []),
      ["Created", dateTime(job.created_at)],
      [FINISHED.has(job.status) ? "Took" : "Running for", took === null ? "–" : tookText(took, job)],
      ...(phasesText(job) ? [["Phases", el("span", { id: "phases", class: "small" }, phasesText(job))]] : []),
    ];
    clear(this.summary, rows.filter(Boolean).map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v))));
    this.showError();
    this.spec.textContent = JSON.stringify(spec, null, 2);
    this.renderAttempts();
    this.showLabels();
    this.logs.update(job);
  }

  // The owner's tags and notes (set at submit, PATCH /v1/jobs/ID edits them); the stream's
  // updates leave the form alone while it is open.
  showLabels() {
    if (this.editingLabels) return;
    const { tags = [], notes } = this.job;
    clear(this.labels,
      el("div", { class: "labels-head" },
        el("div", { class: "tags", id: "job-tags" }, tags.length
          ? tags.map((t) => el("a", { href: `#/jobs?tag=${encodeURIComponent(t)}`, class: "tag", dataset: { tag: t } }, t))
          : el("span", { class: "muted small" }, "No tags")),
        el("button", { type: "button", id: "edit-labels", class: "small", onclick: () => this.editLabels() }, "Edit tags and notes")),
      notes ? el("p", { id: "job-notes", class: "notes" }, notes) : el("p", { id: "job-notes", class: "muted small" }, "No notes"));
  }

  editLabels() {
    this.editingLabels = true;
    const tags = el("input", { id: "tags-input", value: (this.job.tags ?? []).join(", "), maxlength: 900,
      placeholder: "sweep-3, baseline", "aria-label": "tags, separated by commas" });
    const notes = el("textarea", { id: "notes-input", rows: 4, maxlength: 10000, "aria-label": "notes" });
    notes.value = this.job.notes ?? "";
    const problem = el("div");
    const done = () => { this.editingLabels = false; this.showLabels(); };
    const save = async (event) => {
      event.preventDefault();
      const body = { tags: tags.value.split(",").map((t) => t.trim()).filter(Boolean), notes: notes.value };
      try {
        const job = await api(`v1/jobs/${this.id}`, { method: "PATCH", body, signal: this.signal });
        this.editingLabels = false;
        this.show(job);
      } catch (error) {
        if (!this.signal.aborted) clear(problem, errorBox(error));
      }
    };
    clear(this.labels, el("form", { id: "labels-form", onsubmit: save },
      el("label", {}, "Tags ", el("span", { class: "muted small" }, "(letters, digits, _ . : -; commas between)"), tags),
      el("label", {}, "Notes", notes),
      problem,
      el("div", { class: "toolbar" },
        el("button", { type: "submit", id: "save-labels", class: "primary" }, "Save"),
        el("button", { type: "button", id: "cancel-labels", onclick: done }, "Cancel"))));
    tags.focus();
  }

  // The job's error, once, with the worker's traceback folded under it.
  showError() {
    const error = this.job.error;
    if (!error) {
      if (this.problem.dataset.kind === "job-error") clear(this.problem);
      return;
    }
    const traceback = [...this.events].reverse().find((e) => e.kind === "traceback")?.data?.traceback;
    this.problem.dataset.kind = "job-error";
    clear(this.problem, el("div", { class: "error", role: "alert", id: "job-error" },
      el("strong", {}, `${error.type}: `), richText(error.message),
      traceback && el("details", { class: "traceback" }, el("summary", {}, "Traceback"), el("pre", {}, traceback))));
  }

  async cancel() {
    const what = this.job.status === "running" ? "It stops at its next micro-batch." : "It will not run.";
    if (!window.confirm(`Cancel job ${jobLabel(this.job)}? ${what}`)) return;
    await this.act("cancel");
  }

  async remove() {
    if (!window.confirm(`Delete job ${jobLabel(this.job)}? Its checkpoints, metrics and events go too; this cannot be undone.`)) return;
    try {
      await api(`v1/jobs/${this.id}`, { method: "DELETE", signal: this.signal });
    } catch (error) {
      if (!this.signal.aborted) clear(this.problem, errorBox(error));
      return;
    }
    location.hash = "#/jobs";
  }

  async exportCsv() {
    try {
      const text = await metricsCsv(this.id, this.signal);
      saveBlob(new Blob([text], { type: "text/csv" }), `${jobLabel(this.job)}-metrics.csv`);
    } catch (error) {
      if (!this.signal.aborted) clear(this.problem, errorBox(error));
    }
  }

  async act(verb) {
    if (this.problem.dataset.kind !== "job-error") clear(this.problem);
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
    let first = FINISHED.has(this.job.status);
    try {
      while (!this.signal.aborted) {
        this.streamState.textContent = "· connecting…";
        try {
          const ended = await streamJob(this.id, (m) => this.onMessage(m), {
            signal: this.signal,
            lastEventId: this.lastEventId,
            onOpen: () => {
              this.streamState.textContent = ACTIVE.has(this.job.status) ? "· live" : "";
              if (!first) this.loadHistory(); // the stream's metrics start now: history before it
              first = false;
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
    if (event === "metric") this.addPoint(data);
    else if (event === "status") this.show(data);
    else if (event === "job_event") {
      this.addEvent(data);
      if (data.kind === "exactness_check" && this.job) {
        this.job.exactness = exactnessOfEvent(data);
        clear(this.exactness, exactnessBadge(this.job, this.caveat));
      }
    } else if (event === "end") {
      this.streamState.textContent = "";
      this.loadCheckpoints();
      api(`v1/jobs/${this.id}`, { signal: this.signal }).then((job) => { this.show(job); this.draw(); }).catch(() => {});
    }
  }

  async loadHistory(name) {
    const query = `max_points=${MAX_POINTS}${name ? `&name=${encodeURIComponent(name)}` : ""}`;
    try {
      const page = await api(`v1/jobs/${this.id}/metrics?${query}`, { signal: this.signal });
      for (const point of page.items) this.addPoint(point, false);
    } catch (error) {
      if (!this.signal.aborted) clear(this.problem, errorBox(error));
    }
    this.draw();
  }

  addPoint(point, schedule = true) {
    let series = this.series.get(point.name);
    if (!series) {
      this.series.set(point.name, (series = new Series()));
      if (!DRAWN.has(point.name)) {
        this.panels.push(this.panel({ id: `chart-${point.name.replace(/[^a-z0-9]+/gi, "-")}`, title: point.name, metrics: [point.name] }));
      }
    }
    series.add(point);
    if (series.length > COMPACT_AT && !this.compacting.has(point.name)) this.compact(point.name);
    if (schedule && !this.drawPending) {
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
      for (const p of page.items) fresh.add(p);
      const last = fresh.length ? fresh.steps[fresh.length - 1] : -1;
      old.steps.forEach((step, i) => {
        if (step > last) {
          fresh.add({ step, value: old.values[i], nonfinite: old.labels[i], ts: old.times[i] && new Date(old.times[i]).toISOString(), epoch: old.epochs[i] });
        }
      });
      this.series.set(name, fresh);
    } catch {
      // keep the full curve; the next point tries again
    } finally {
      this.compacting.delete(name);
    }
  }

  draw() {
    this.drawPending = false;
    const finished = FINISHED.has(this.job.status);
    const markers = this.attempts().filter((a) => a.attempt > 1 && a.fromStep)
      .map((a) => ({ x: a.fromStep, text: `attempt ${a.attempt}` }));
    for (const panel of this.panels) {
      const lines = panel.metrics.map((m) => {
        const series = this.series.get(m) ?? new Series();
        return { label: m, series, context: xContext(this.job, this.series.get("loss") ?? series) };
      });
      const empty = lines.every((l) => !l.series.length);
      // A finished job shows the curves it has; a live one keeps every panel's place, so a
      // chart that gets its first point does not push the page about.
      panel.chart.figure.hidden = empty && (finished || panel.ifAny) && !panel.always;
      if (empty) panel.chart.placeholder(finished ? "No training steps were logged" : panel.waiting ?? "Waiting for the first point");
      panel.chart.set(lines, { xMode: this.settings.xMode, smoothing: this.settings.smoothing, markers });
    }
  }

  // The attempts, as the API lists them (every start of the job, oldest first).
  attempts() {
    return (this.job.attempts ?? []).map((a) => ({
      attempt: a.attempt, worker: a.worker ?? a.host ?? "–", started: a.started_at, ended: a.ended_at,
      outcome: (OUTCOMES[a.outcome] ?? a.outcome) + (a.cause ? ` (${a.cause})` : ""),
      fromStep: a.resume_step, steps: a.steps_done,
    }));
  }

  renderAttempts() {
    const attempts = this.attempts();
    clear(this.attemptRows, attempts.length ? attempts.map((a) => cardRow({ dataset: { attempt: String(a.attempt) } }, ATTEMPT_COLUMNS, [
      el("td", { class: "num" }, String(a.attempt)),
      el("td", { class: "mono small" }, a.worker),
      el("td", {}, dateTime(a.started)),
      el("td", {}, dateTime(a.ended)),
      el("td", {}, a.outcome),
      el("td", { class: "num" }, a.fromStep ? grouped(a.fromStep) : "start"),
      el("td", { class: "num" }, a.steps == null ? "–" : grouped(a.steps))]))
      : el("tr", {}, el("td", { colspan: 7, class: "muted empty" }, "Not started yet")));
    this.renderNodes();
  }

  // A multi-node job: the worker of each node of its current or last attempt (the API's `nodes`;
  // while its gang forms, those that joined so far).
  renderNodes() {
    const nodes = this.job.nodes, wanted = this.job.world?.nodes;
    this.nodeList.hidden = !nodes;
    if (!nodes) return;
    const forming = this.job.status === "queued";
    clear(this.nodeList,
      el("strong", {}, forming ? `Gang forming: ${nodes.length} of ${wanted} nodes joined` : `Nodes (${nodes.length} of ${wanted})`),
      nodes.length ? ": " : "",
      ...nodes.flatMap((n, i) => [i ? ", " : "", el("span", { class: "mono", dataset: { node: String(n.node_rank) } },
        `${n.node_rank}: ${n.worker}${n.host ? ` (${n.host})` : ""}`)]));
  }

  // The point the run stopped at, on its metric's chart (with the NaN / inf marker), where no
  // point was logged for that step.
  markStop({ step, metric, label }) {
    const series = this.series.get(metric);
    if (series?.steps.includes(step)) return;
    this.addPoint({ name: metric, step, value: null, nonfinite: label, ts: this.job.finished_at, epoch: this.job.progress?.epoch });
  }

  addEvent(event) {
    if (this.eventIds.has(event.id)) return;
    if (EXACTNESS_CAVEATS[event.kind] && !this.caveat) {
      this.caveat = { text: EXACTNESS_CAVEATS[event.kind], message: event.message };
      clear(this.exactness, exactnessBadge(this.job, this.caveat));
    }
    this.eventIds.add(event.id);
    this.lastEventId = Math.max(this.lastEventId ?? 0, event.id);
    this.events.push(event);
    if (!this.eventsPending) {
      this.eventsPending = true;
      queueMicrotask(() => {
        this.eventsPending = false;
        this.renderEvents();
        this.renderAttempts();
        this.showError();
        this.draw();
      });
    }
    if (event.kind === "checkpoint") this.loadCheckpoints();
  }

  renderEvents() {
    const counts = new Map();
    for (const e of this.events) counts.set(e.kind, (counts.get(e.kind) ?? 0) + 1);
    clear(this.kindSelect, el("option", { value: "", selected: !this.kindFilter }, `all (${this.events.length})`),
      [...counts].sort().map(([kind, n]) => el("option", { value: kind, selected: kind === this.kindFilter }, `${kind.replaceAll("_", " ")} (${n})`)));
    const shown = this.events.filter((e) => (this.kindFilter ? e.kind === this.kindFilter : e.kind !== "traceback"));
    const items = [];
    for (const event of shown) {
      const previous = items[items.length - 1];
      if (event.kind === "checkpoint" && previous?.kind === "checkpoint") previous.group.push(event);
      else items.push({ kind: event.kind, group: [event] });
    }
    const list = this.timeline;
    const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
    clear(list, items.map((item) => this.eventItem(item)));
    if (atBottom) list.scrollTop = list.scrollHeight; // follow new events unless scrolled up
  }

  eventItem({ kind, group }) {
    const last = group[group.length - 1];
    let message = last.message || "";
    if (kind === "checkpoint" && group.length > 1) {
      const steps = group.map((e) => e.data?.step ?? "?");
      const named = steps.length <= CHECKPOINTS_NAMED ? steps.join(", ") : `${steps[0]}, ${steps[1]}, … ${steps[steps.length - 1]}`;
      message = `${group.length} checkpoints, steps ${named}`;
    } else if (kind === "failed" && this.job.error) {
      message = "see the error above";
    }
    const time = new Date(last.created_at);
    return el("li", { dataset: { kind, count: String(group.length) } },
      el("time", { datetime: last.created_at, title: time.toLocaleString() }, time.toLocaleTimeString()),
      el("span", { class: `kind tone-${EVENT_TONES[kind] ?? "muted"}` }, kind.replaceAll("_", " ")),
      el("span", { class: "message" }, richText(message),
        last.attempt > 1 ? el("span", { class: "muted small" }, ` · attempt ${last.attempt}`) : null));
  }

  async loadCheckpoints() {
    try {
      const { items } = await api(`v1/jobs/${this.id}/checkpoints`, { signal: this.signal });
      const none = FINISHED.has(this.job.status) ? "None: this job saved no checkpoint" : "None yet";
      clear(this.checkpoints, items.length ? items.map((c) => this.checkpointRow(c))
        : el("tr", {}, el("td", { colspan: 6, class: "muted empty" }, none)));
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
    return cardRow({ dataset: { step: String(c.step) } }, CHECKPOINT_COLUMNS, [
      el("td", { class: "num" }, grouped(c.step), c.is_best ? el("span", { class: "best", title: "best val_loss" }, " ★") : null),
      el("td", { class: "num" }, epochNumber(c.epoch)),
      el("td", { class: "num" }, formatBytes(c.size_bytes)),
      el("td", { class: "num" }, formatNumber(c.metrics.val_loss)),
      el("td", { class: "mono small", title: c.sha256 }, c.sha256.slice(0, 12)),
      el("td", {}, download)]);
  }
}

// The job's runs in MLflow, TensorBoard, W&B (GET /v1/jobs/ID `trackers`): a link where the
// tracker has a web address, else its run id; "(pending)" while points wait for it.
function trackerLinks(runs) {
  return el("span", { id: "trackers" }, runs.flatMap((run, index) => [
    index ? ", " : "",
    run.url
      ? el("a", { href: run.url, target: "_blank", rel: "noopener", class: `tracker-${run.tracker}` }, run.tracker)
      : el("span", { class: `tracker-${run.tracker}`, title: run.run_id ?? "" }, run.tracker),
    run.pending ? el("span", { class: "muted small" }, " (pending)") : "",
  ]));
}

// "fsdp (2 ranks, sync window, CPU offload)" / "ddp (2 ranks)": the strategy row of the summary.
function sharingStrategy(job) {
  const spec = job.spec, ranks = job.world.ranks;  // nodes x max(gpus, 1), from the API
  const parts = [`${ranks} rank${ranks > 1 ? "s" : ""}`];
  if (job.strategy === "fsdp" && spec.fsdp) {
    parts.push(`sync ${spec.fsdp.sync ?? "micro_batch"}`);
    if (spec.fsdp.cpu_offload) parts.push("CPU offload");
    if (spec.fsdp.mixed_precision) parts.push("bf16 parameters");
  }
  return `${job.strategy} (${parts.join(", ")})`;
}
