// The job page's Logs panel: what the job's training printed (GET /v1/jobs/ID/logs), each
// attempt's lines under its header, one attempt or all; polled while the job may still print,
// read once more after it finishes (the worker stores an attempt's last lines before its end).

import { api, sleep } from "../api.js";
import { clear, el } from "../dom.js";
import { ACTIVE } from "../format.js";

const POLL_MS = 2000;
const PAGE = 1000;

export class LogsPanel {
  constructor(jobId, signal) {
    this.jobId = jobId;
    this.signal = signal;
    this.lines = [];
    this.after = null;
    this.attempt = "";
    this.attempts = 0;
    this.active = true;
    this.polling = false;
    this.select = el("select", { id: "log-attempt", "aria-label": "show the output of attempt" });
    this.select.addEventListener("change", () => { this.attempt = this.select.value; this.render(); });
    this.output = el("pre", { class: "logs", id: "logs", tabindex: "0" });
    this.section = el("section", { id: "logs-section" },
      el("div", { class: "section-head" }, el("h2", {}, "Logs"),
        el("label", { class: "inline small" }, "attempt ", this.select)),
      this.output);
  }

  // Called with every new job object: which attempts to offer, and whether to keep polling.
  update(job) {
    this.active = ACTIVE.has(job.status);
    this.finishedText = this.active ? "No output yet" : "This job printed nothing";
    if ((job.attempts?.length ?? 0) !== this.attempts) {
      this.attempts = job.attempts?.length ?? 0;
      this.renderSelect();
    }
    if (!this.polling) this.poll();
  }

  async poll() {
    this.polling = true;
    try {
      while (!this.signal.aborted) {
        const last = !this.active; // finished: this read gets every line it printed
        try {
          await this.readNew();
          if (!this.lines.length) this.render(); // "No output yet", or that it printed nothing
        } catch {
          // the next poll tries again; the page's other panels report a lost server
        }
        if (last) return;
        await sleep(POLL_MS, this.signal);
      }
    } finally {
      this.polling = false;
    }
  }

  async readNew() {
    for (;;) {
      const after = this.after === null ? "" : `&after=${this.after}`;
      const { items } = await api(`v1/jobs/${this.jobId}/logs?limit=${PAGE}${after}`, { signal: this.signal });
      if (items.length) {
        this.lines.push(...items);
        this.after = items[items.length - 1].id;
        this.render();
      }
      if (items.length < PAGE) return;
    }
  }

  renderSelect() {
    const options = [el("option", { value: "", selected: !this.attempt }, "all")];
    for (let k = 1; k <= this.attempts; k += 1) {
      options.push(el("option", { value: String(k), selected: String(k) === this.attempt }, String(k)));
    }
    clear(this.select, options);
  }

  render() {
    const shown = this.attempt ? this.lines.filter((l) => String(l.attempt) === this.attempt) : this.lines;
    const box = this.output;
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const nodes = [];
    let attempt = null;
    for (const line of shown) {
      if (!this.attempt && line.attempt !== attempt) {
        nodes.push(el("span", { class: "log-attempt" }, `── attempt ${line.attempt} ──\n`));
        attempt = line.attempt;
      }
      nodes.push(el("span", { class: `log-${line.stream}`, dataset: { attempt: String(line.attempt) } }, `${line.line}\n`));
    }
    clear(box, nodes.length ? nodes : el("span", { class: "muted" }, this.finishedText ?? "No output yet"));
    if (atBottom) box.scrollTop = box.scrollHeight; // follow new lines unless scrolled up
  }
}
