// Submit a job: every spec field in a form, or the spec itself in a YAML / JSON editor, with
// the effective batch (m × N × GPUs) and the steps per epoch shown as they are typed.
// Problems are shown once, at the field they belong to, in the form's words: what the browser
// can check before sending, and the API's 422 (whose `optimizer.lr` is the "Learning rate"
// field here). #/submit?from=ID opens the form with that job's spec (Clone).

import { api, openapi } from "../api.js";
import { clear, el, errorBox } from "../dom.js";
import { grouped, jobLabel } from "../format.js";

const YAML_SCRIPT = "dashboard/vendor/js-yaml.min.js";
const SCHEDULERS = ["none", "cosine", "step"];

// The form: one entry per spec field, in sections. `path` is the spec's (and the API's error)
// path; `show(spec)` hides fields that do not apply (momentum is SGD's, betas AdamW's).
function fieldsFor(models, priorities) {
  const int = (min, max) => ({ type: "number", min, max, step: 1 });
  const real = (min) => ({ type: "number", min, step: "any" });
  return [
    { section: "Job", path: "name", label: "Name", attrs: { placeholder: "model-dataset" } },
    // Namespace entries ("timm:", "hf:") are patterns, not models: write those in the YAML/JSON tab.
    { section: "Job", path: "model", label: "Model", choices: models.filter((m) => !m.name.endsWith(":")).map((m) => [m.name, m.description]), value: "mlp" },
    { section: "Job", path: "dataset", label: "Dataset", choices: [], value: "digits" },
    { section: "Batch", path: "micro_batch_size", label: "Micro-batch m", attrs: int(1, 1048576), value: 16, hint: "samples per forward/backward" },
    { section: "Batch", path: "accumulation_steps", label: "Accumulation N", attrs: int(1, 65536), value: 4, hint: "micro-batches per optimizer step" },
    { section: "Batch", path: "gpus", label: "GPUs", attrs: int(0, 64), value: 1, hint: "0 = CPU" },
    { section: "Length", path: "epochs", label: "Epochs", attrs: int(1), value: 1, optional: true },
    { section: "Length", path: "max_steps", label: "Max steps", attrs: { ...int(1), placeholder: "instead of epochs" }, optional: true, hint: "optimizer steps; overrides epochs" },
    { section: "Optimizer", path: "optimizer.name", label: "Optimizer", choices: [["sgd"], ["adamw"]], value: "sgd" },
    { section: "Optimizer", path: "optimizer.lr", label: "Learning rate", attrs: real(0), value: 0.1 },
    { section: "Optimizer", path: "optimizer.momentum", label: "Momentum", attrs: real(0), value: 0, show: (s) => s.optimizer?.name === "sgd" },
    { section: "Optimizer", path: "optimizer.betas", label: "Betas", attrs: { placeholder: "0.9, 0.999" }, value: "0.9, 0.999", list: true, show: (s) => s.optimizer?.name === "adamw" },
    { section: "Optimizer", path: "optimizer.weight_decay", label: "Weight decay", attrs: real(0), value: 0 },
    { section: "Optimizer", path: "grad_clip_norm", label: "Gradient clip norm", attrs: { ...real(0), placeholder: "none" }, optional: true },
    { section: "Schedule", path: "scheduler.name", label: "LR schedule", choices: SCHEDULERS.map((s) => [s]), value: "none", hint: "counted in optimizer steps" },
    { section: "Schedule", path: "scheduler.warmup_steps", label: "Warm-up steps", attrs: int(0), value: 0, show: (s) => ["cosine", "step"].includes(s.scheduler?.name) },
    { section: "Schedule", path: "scheduler.step_size", label: "Step size", attrs: int(1), value: 100, show: (s) => s.scheduler?.name === "step" },
    { section: "Schedule", path: "scheduler.gamma", label: "Gamma", attrs: real(0), value: 0.1, show: (s) => s.scheduler?.name === "step" },
    { section: "Evaluation and checkpoints", path: "eval_every", label: "Evaluate every", attrs: { ...int(1), placeholder: "each epoch's end" }, optional: true, hint: "optimizer steps" },
    { section: "Evaluation and checkpoints", path: "checkpoint_every", label: "Checkpoint every", attrs: int(1), value: 100, hint: "optimizer steps (and always at the end)" },
    { section: "Evaluation and checkpoints", path: "keep_checkpoints", label: "Keep checkpoints", attrs: int(1), value: 3, hint: "latest ones, plus the best" },
    { section: "Run", path: "precision", label: "Precision", choices: [["fp32"], ["bf16"], ["fp16"]], value: "fp32" },
    { section: "Run", path: "seed", label: "Seed", attrs: int(0), value: 0 },
    { section: "Run", path: "queue", label: "Queue", value: "default", hint: "the worker queue (GPU class)" },
    priorities && { section: "Run", path: "priority", label: "Priority", choices: priorities.map((p) => [p]), value: priorities.includes("normal") ? "normal" : priorities[0] },
    { section: "Run", path: "max_restarts", label: "Max restarts", attrs: int(0, 100), value: 3, hint: "after lost workers" },
    { section: "Run", path: "compile", label: "torch.compile", check: true, value: false },
    { section: "Run", path: "fast_path", label: "Fast path", check: true, value: true },
    { section: "Run", path: "data_on_device", label: "Data on the GPU", check: true, value: false },
  ].filter(Boolean);
}

function getPath(object, path) {
  return path.split(".").reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), object);
}

function setPath(object, path, value) {
  const keys = path.split(".");
  let node = object;
  for (const key of keys.slice(0, -1)) node = node[key] ??= {};
  node[keys[keys.length - 1]] = value;
}

// A spec as submitted: names for the model and dataset unless they carry options, the
// scheduler as its name when it has nothing else, no nulls (the API's "not given").
function tidy(spec) {
  const out = JSON.parse(JSON.stringify(spec, (_k, v) => (v === null ? undefined : v)));
  for (const key of ["model", "dataset"]) {
    const value = out[key];
    if (value && typeof value === "object" && Object.keys(value).length === 1) out[key] = value.name;
    else if (value && typeof value === "object" && value.download === false && value.data_root === undefined) {
      delete value.download;
      if (Object.keys(value).length === 1) out[key] = value.name;
    }
  }
  if (out.scheduler && typeof out.scheduler === "object" && out.scheduler.name === "none" && !out.scheduler.warmup_steps) delete out.scheduler;
  return out;
}

// An API error message in the form's words: the field's label is right above it.
function inFormWords(message, path) {
  const last = path.split(".").pop();
  return message
    .replace(new RegExp(`^${last} `), "")
    .replace(/^Input should be /, "must be ")
    .replace(/^Value error, /, "")
    .replace(/^Field required$/, "required")
    .replace(/^Extra inputs are not permitted$/, "is not a spec field");
}

async function loadYaml() {
  if (window.jsyaml) return window.jsyaml;
  await new Promise((resolve, reject) => {
    document.head.append(el("script", { src: YAML_SCRIPT, onload: resolve, onerror: () => reject(new Error("could not load the YAML reader")) }));
  });
  return window.jsyaml;
}

export async function render({ root, params, signal }) {
  const from = params.get("from");
  const [models, datasets, source, described] = await Promise.all([
    api("v1/catalog/models", { signal }),
    api("v1/catalog/datasets", { signal }),
    from ? api(`v1/jobs/${encodeURIComponent(from)}`, { signal }) : null,
    // Fields that newer servers accept (priority) are offered only when this one documents them.
    openapi(),
  ]);
  const priorityField = described?.components?.schemas?.JobSpec?.properties?.priority;
  const priorities = priorityField && (priorityField.enum ?? priorityField.anyOf?.find((a) => a.enum)?.enum);
  const byName = Object.fromEntries(datasets.items.map((d) => [d.name, d]));
  const fields = fieldsFor(models.items, priorities);
  const inputs = new Map(); // path -> {field, input, box, error}
  let extras = {}; // spec keys the form does not show (model options, data_root), kept on submit
  let mode = "form";

  for (const field of fields) {
    const id = `f-${field.path.replaceAll(".", "-").replaceAll("_", "-")}`;
    let input;
    if (field.choices) {
      input = el("select", { id }, field.choices.map(([value, title]) => el("option", { value, title }, value)));
    } else if (field.check) {
      input = el("input", { id, type: "checkbox" });
    } else {
      input = el("input", { id, ...(field.attrs || {}), ...(field.attrs?.type ? {} : { type: "text" }) });
    }
    const error = el("small", { class: "field-error", id: `${id}-error`, role: "alert" });
    const box = field.check
      ? el("label", { class: "field check" }, el("span", {}, input, " ", field.label), error)
      : el("label", { class: "field" }, el("span", {}, field.label), input, field.hint && el("small", { class: "muted" }, field.hint), error);
    inputs.set(field.path, { field, input, box, error });
  }
  const input = (path) => inputs.get(path).input;
  // Short ids the tests and people know: #m, #n, #gpus, #name, #lr, #queue, #max-steps.
  for (const [path, short] of [["micro_batch_size", "m"], ["accumulation_steps", "n"], ["gpus", "gpus"], ["name", "name"],
    ["optimizer.lr", "lr"], ["queue", "queue"], ["max_steps", "max-steps"], ["epochs", "epochs"], ["model", "model"], ["dataset", "dataset"]]) {
    input(path).id = short;
    inputs.get(path).error.id = `${short}-error`;
  }

  const fillDatasets = () => {
    const model = models.items.find((m) => m.name === input("model").value);
    const keep = input("dataset").value || "digits";
    clear(input("dataset"), (model?.compatible_datasets ?? []).map((d) => el("option", { value: d, selected: d === keep, title: byName[d]?.description }, d)));
  };

  const setValue = (path, value) => {
    const { field, input: node } = inputs.get(path);
    if (field.check) node.checked = Boolean(value);
    else if (field.list) node.value = Array.isArray(value) ? value.join(", ") : value ?? "";
    else node.value = value ?? "";
  };

  // The form from a spec (a clone's, or what the editor holds); what it cannot show is kept.
  const fill = (spec) => {
    const s = JSON.parse(JSON.stringify(spec));
    for (const key of ["model", "dataset", "scheduler"]) if (typeof s[key] === "string") s[key] = { name: s[key] };
    extras = {};
    for (const key of ["model", "dataset"]) {
      const { name, ...rest } = s[key] || {};
      if (Object.keys(rest).some((k) => rest[k] !== null && !(k === "download" && rest[k] === false))) extras[key] = rest;
    }
    const shown = new Set([...inputs.keys()].map((p) => p.split(".")[0]));
    for (const [key, value] of Object.entries(s)) if (!shown.has(key) && value !== null) extras[key] = value;
    for (const [path, { field }] of inputs) {
      const value = path === "model" || path === "dataset" ? s[path]?.name : getPath(s, path);
      setValue(path, value === undefined || value === null ? (field.optional ? "" : field.value) : value);
      if (path === "model") fillDatasets();
    }
    if (s.epochs === undefined || s.epochs === null) setValue("epochs", "");
  };

  const numberOf = (node) => (node.value.trim() === "" ? undefined : Number(node.value));

  // The spec the form describes.
  const spec = () => {
    const s = {};
    for (const [path, { field, input: node, box }] of inputs) {
      if (box.hidden) continue;
      let value;
      if (field.check) value = node.checked;
      else if (field.list) value = node.value.split(/[\s,]+/).filter(Boolean).map(Number);
      else if (field.attrs?.type === "number") value = numberOf(node);
      else value = node.value.trim() || undefined;
      if (value !== undefined) setPath(s, path, value);
    }
    if (s.max_steps !== undefined) delete s.epochs;
    for (const [key, value] of Object.entries(extras)) {
      if (key === "model" || key === "dataset") s[key] = { name: s[key], ...value };
      else s[key] ??= value;
    }
    return tidy(s);
  };

  const effective = el("output", { id: "effective-batch", for: "m n gpus" });
  const steps = el("span", { class: "muted small", id: "steps-per-epoch" });
  const warning = el("p", { class: "warning", id: "batch-warning", hidden: true });
  const preview = el("pre", { class: "spec", id: "spec-preview" });
  const message = el("div", { id: "submit-message" });

  const update = () => {
    const shownFor = spec();
    for (const { field, box } of inputs.values()) box.hidden = field.show ? !field.show(shownFor) : false;
    const s = spec();
    const m = s.micro_batch_size;
    const n = s.accumulation_steps;
    const gpus = s.gpus ?? 1;
    const world = Math.max(gpus, 1);
    const product = m * n * world;
    const device = gpus === 0 ? "CPU" : `${world} GPU${world > 1 ? "s" : ""}`;
    const size = byName[s.dataset?.name ?? s.dataset]?.train_size;
    const valid = Number.isInteger(m) && Number.isInteger(n) && m > 0 && n > 0;
    const perEpoch = valid && size ? Math.ceil(Math.ceil(Math.ceil(size / world) / m) / n) : null;
    effective.textContent = valid
      ? `${grouped(m)} × ${grouped(n)} × ${device} = ${grouped(product)} samples per optimizer step`
      : "m and N must be whole numbers of at least 1";
    effective.dataset.value = String(valid ? product : "");
    clear(steps, perEpoch ? `≈ ${grouped(perEpoch)} optimizer step${perEpoch === 1 ? "" : "s"} per epoch of ${grouped(size)} training samples` : "");
    warning.hidden = !(valid && size && product > size);
    warning.textContent = warning.hidden ? "" : `The effective batch (${grouped(product)}) is larger than the ${grouped(size)} training samples of ${s.dataset?.name ?? s.dataset}: every epoch is a single, short window.`;
    preview.textContent = JSON.stringify(s, null, 2);
  };

  // Problems at their fields, once: the browser's own checks first, in the form's words.
  const clearErrors = () => {
    for (const { error, box } of inputs.values()) {
      error.textContent = "";
      box.classList.remove("invalid");
    }
    clear(message);
    clear(editorErrors);
  };
  const showAt = (path, text) => {
    const entry = inputs.get(path) ?? inputs.get(path.split(".")[0]) ?? (path.startsWith("scheduler") ? inputs.get("scheduler.name") : null);
    if (!entry || entry.box.hidden) return false;
    entry.error.textContent = entry.error.textContent ? `${entry.error.textContent}; ${text}` : text;
    entry.box.classList.add("invalid");
    return true;
  };
  const checkInputs = () => {
    let ok = true;
    for (const [path, { field, input: node, box }] of inputs) {
      if (box.hidden || field.attrs?.type !== "number") continue;
      const v = node.validity;
      const problem = v.badInput ? "must be a number"
        : v.valueMissing || (!field.optional && node.value.trim() === "") ? "required"
          : v.rangeUnderflow ? `must be at least ${grouped(Number(node.min))}`
            : v.rangeOverflow ? `must be at most ${grouped(Number(node.max))}`
              : v.stepMismatch ? "must be a whole number" : null;
      if (problem) {
        showAt(path, problem);
        ok = false;
      }
    }
    return ok;
  };

  // --- the editor tab ---------------------------------------------------------------------
  const editor = el("textarea", { id: "spec-editor", spellcheck: false, rows: 22, "aria-label": "job spec, YAML or JSON" });
  const editorErrors = el("div", { id: "editor-errors" });
  const parseEditor = async () => {
    const text = editor.value;
    if (/^\s*[{[]/.test(text)) {
      try {
        return JSON.parse(text);
      } catch (error) {
        throw new Error(`not valid JSON: ${error.message}`);
      }
    }
    const yaml = await loadYaml();
    try {
      return yaml.load(text);
    } catch (error) {
      throw new Error(`not valid YAML at line ${(error.mark?.line ?? 0) + 1}: ${error.reason ?? error.message}`);
    }
  };
  const checkEditor = async () => {
    clear(editorErrors);
    try {
      const parsed = await parseEditor();
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("the spec must be a mapping of fields");
      editor.classList.remove("invalid");
      return parsed;
    } catch (error) {
      editor.classList.add("invalid");
      clear(editorErrors, el("p", { class: "field-error", role: "alert" }, error.message));
      return null;
    }
  };
  const formTab = el("button", { type: "button", class: "tab active", id: "tab-form", role: "tab" }, "Form");
  const editorTab = el("button", { type: "button", class: "tab", id: "tab-editor", role: "tab" }, "YAML / JSON");
  const formPane = el("div", { id: "form-pane" });
  const editorPane = el("div", { id: "editor-pane", hidden: true },
    el("p", { class: "muted small" }, "The spec as the CLI's spec files hold it (YAML or JSON). Every field of the spec reference in the README is accepted."),
    editor, editorErrors);
  const switchTo = async (target) => {
    if (target === mode) return;
    if (target === "editor") {
      const yaml = await loadYaml().catch(() => null);
      editor.value = yaml ? yaml.dump(spec(), { lineWidth: 100 }) : JSON.stringify(spec(), null, 2);
    } else {
      const parsed = await checkEditor();
      if (!parsed) return; // stay: the editor says what is wrong
      fill(parsed);
      update();
    }
    mode = target;
    formPane.hidden = mode !== "form";
    editorPane.hidden = mode !== "editor";
    formTab.classList.toggle("active", mode === "form");
    editorTab.classList.toggle("active", mode === "editor");
  };
  formTab.addEventListener("click", () => switchTo("form"));
  editorTab.addEventListener("click", () => switchTo("editor"));
  let typing = null;
  editor.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(checkEditor, 300); });

  const submit = async (event) => {
    event.preventDefault();
    clearErrors();
    let body;
    if (mode === "editor") {
      body = await checkEditor();
      if (!body) return;
    } else {
      if (!checkInputs()) {
        message.append(el("p", { class: "error", role: "alert" }, "Some fields need a change: see below them."));
        return;
      }
      body = spec();
    }
    try {
      const job = await api("v1/jobs", { method: "POST", body, signal });
      location.hash = `#/jobs/${job.id}`;
    } catch (error) {
      const items = error.body?.errors ?? [];
      if (!items.length) {
        message.append(errorBox(error));
        return;
      }
      const elsewhere = [];
      for (const item of items) {
        const path = String(item.loc || "").replace(/^body\.?/, "");
        const text = inFormWords(String(item.msg || ""), path);
        if (mode === "editor" || !showAt(path, text)) elsewhere.push(path ? `${path}: ${text}` : text);
      }
      if (mode === "form") message.append(el("p", { class: "error", role: "alert" }, "The server refused the spec: see the fields below."));
      if (elsewhere.length) {
        (mode === "editor" ? editorErrors : message).append(el("ul", { class: "error-list" }, elsewhere.map((t) => el("li", {}, t))));
      }
    }
  };

  input("model").addEventListener("change", fillDatasets);
  for (const [path, { field }] of inputs) {
    setValue(path, field.value ?? "");
    if (path === "model") fillDatasets();
  }
  if (source) {
    fill(source.spec);
    setValue("name", `${jobLabel(source)}-clone`);
  }

  const sections = [...new Set(fields.map((f) => f.section))];
  formPane.append(...sections.map((section) => el("fieldset", { class: "section" }, el("legend", {}, section),
    el("div", { class: "grid" }, fields.filter((f) => f.section === section).map((f) => inputs.get(f.path).box)),
    // The batch's consequences right under its three factors.
    section === "Batch" && [el("p", { class: "effective" }, "Effective batch: ", effective, el("br"), steps), warning])),
  el("details", {}, el("summary", {}, "Spec to submit"), preview));
  const form = el("form", { class: "card submit", id: "submit-form", novalidate: true, oninput: update, onchange: update, onsubmit: submit },
    el("div", { class: "tabs", role: "tablist" }, formTab, editorTab),
    message, formPane, editorPane,
    el("div", { class: "actions" }, el("button", { type: "submit", class: "primary", id: "submit-job" }, "Submit job")));
  root.append(el("h1", {}, source ? `New job from ${jobLabel(source)}` : "New job"));
  if (source) {
    root.append(el("p", { class: "muted", id: "cloned-from" }, "A copy of ", el("a", { href: `#/jobs/${source.id}` }, jobLabel(source)),
      "'s spec: change what you want to try."));
  }
  root.append(form);
  update();
  // A spec the form cannot hold (m "auto", N by epoch) opens in the editor.
  const { micro_batch_size: m, accumulation_steps: n } = source?.spec ?? {};
  if (source && (typeof m !== "number" || (n !== null && n !== undefined && typeof n !== "number"))) {
    mode = "form";
    await switchTo("editor");
    editor.value = JSON.stringify(tidy({ ...source.spec, name: `${jobLabel(source)}-clone` }), null, 2);
  }
}
