// Submit a job: a spec built from the catalog, with the effective batch (m × N × GPUs) shown
// as it is typed. The API validates the spec; its 422 names the field to fix.

import { api } from "../api.js";
import { clear, el, errorBox } from "../dom.js";

export async function render({ root, signal }) {
  const [models, datasets] = await Promise.all([
    api("v1/catalog/models", { signal }),
    api("v1/catalog/datasets", { signal }),
  ]);
  const byName = Object.fromEntries(datasets.items.map((d) => [d.name, d]));
  const f = {
    name: el("input", { id: "name", placeholder: "model-dataset" }),
    model: el("select", { id: "model" }, models.items.map((m) => el("option", { value: m.name, selected: m.name === "mlp", title: m.description }, m.name))),
    dataset: el("select", { id: "dataset" }),
    m: el("input", { id: "m", type: "number", min: 1, value: 16, required: true }),
    n: el("input", { id: "n", type: "number", min: 1, value: 4, required: true }),
    gpus: el("input", { id: "gpus", type: "number", min: 0, max: 64, value: 1, required: true }),
    epochs: el("input", { id: "epochs", type: "number", min: 1, value: 1 }),
    maxSteps: el("input", { id: "max-steps", type: "number", min: 1, placeholder: "or a step count" }),
    optimizer: el("select", { id: "optimizer" }, ["sgd", "adamw"].map((o) => el("option", { value: o }, o))),
    lr: el("input", { id: "lr", type: "number", step: "any", min: 0, value: 0.1, required: true }),
    precision: el("select", { id: "precision" }, ["fp32", "bf16", "fp16"].map((p) => el("option", { value: p }, p))),
    queue: el("input", { id: "queue", value: "default", required: true }),
  };
  const effective = el("output", { id: "effective-batch", for: "m n gpus" });
  const steps = el("span", { class: "muted small", id: "steps-per-epoch" });
  const preview = el("pre", { class: "spec", id: "spec-preview" });
  const message = el("div");
  const field = (label, input, hint) => el("label", { class: "field" }, el("span", {}, label), input, hint && el("small", { class: "muted" }, hint));

  const fillDatasets = () => {
    const model = models.items.find((m) => m.name === f.model.value);
    const keep = f.dataset.value || "digits";
    clear(f.dataset, model.compatible_datasets.map((d) => el("option", { value: d, selected: d === keep, title: byName[d]?.description }, d)));
  };
  const spec = () => {
    const s = {
      model: f.model.value,
      dataset: f.dataset.value,
      micro_batch_size: Number(f.m.value),
      accumulation_steps: Number(f.n.value),
      gpus: Number(f.gpus.value),
      optimizer: { name: f.optimizer.value, lr: Number(f.lr.value) },
      precision: f.precision.value,
      queue: f.queue.value.trim(),
    };
    if (f.maxSteps.value) s.max_steps = Number(f.maxSteps.value);
    else s.epochs = Number(f.epochs.value);
    if (f.name.value.trim()) s.name = f.name.value.trim();
    return s;
  };
  const update = () => {
    const s = spec();
    const world = Math.max(s.gpus, 1);
    const product = s.micro_batch_size * s.accumulation_steps * world;
    const device = s.gpus === 0 ? "CPU" : `${world} GPU${world > 1 ? "s" : ""}`;
    const size = byName[s.dataset]?.train_size;
    const perEpoch = size && product > 0 ? Math.ceil(Math.ceil(Math.ceil(size / world) / s.micro_batch_size) / s.accumulation_steps) : null;
    effective.textContent = Number.isFinite(product) && product > 0
      ? `${s.micro_batch_size} × ${s.accumulation_steps} × ${device} = ${product} samples per optimizer step`
      : "m and N must be positive";
    effective.dataset.value = String(product);
    clear(steps, perEpoch ? `≈ ${perEpoch} optimizer steps per epoch of ${size} training samples` : "");
    preview.textContent = JSON.stringify(s, null, 2);
  };
  const submit = async (event) => {
    event.preventDefault();
    clear(message);
    try {
      const job = await api("v1/jobs", { method: "POST", body: spec(), signal });
      location.hash = `#/jobs/${job.id}`;
    } catch (error) {
      const items = error.body?.errors ?? [];
      clear(message, errorBox(error), items.length ? el("ul", { class: "error-list" }, items.map((e) => el("li", {}, el("code", {}, e.loc), `: ${e.msg}`))) : null);
    }
  };

  f.model.addEventListener("change", fillDatasets);
  fillDatasets();
  const form = el("form", { class: "card submit", id: "submit-form", oninput: update, onchange: update, onsubmit: submit },
    el("div", { class: "grid" },
      field("Name", f.name),
      field("Model", f.model),
      field("Dataset", f.dataset),
      field("Micro-batch m", f.m, "samples per forward/backward"),
      field("Accumulation N", f.n, "micro-batches per optimizer step"),
      field("GPUs", f.gpus, "0 = CPU"),
      field("Epochs", f.epochs),
      field("Max steps", f.maxSteps, "overrides epochs"),
      field("Optimizer", f.optimizer),
      field("Learning rate", f.lr),
      field("Precision", f.precision),
      field("Queue", f.queue, "the worker queue (GPU class)")),
    el("p", { class: "effective" }, "Effective batch: ", effective, el("br"), steps),
    el("div", { class: "actions" }, el("button", { type: "submit", class: "primary", id: "submit-job" }, "Submit job")),
    message,
    el("details", {}, el("summary", {}, "Spec to submit"), preview));
  root.append(el("h1", {}, "New job"), form);
  update();
}
