// Submit a job: every spec field in a form, or the spec itself in a YAML / JSON editor, with
// the effective batch (m × N × GPUs) and the steps per epoch shown as they are typed.
// Problems are shown once, at the field they belong to, in the form's words: what the browser
// can check before sending, and the API's 422 (whose `optimizer.lr` is the "Learning rate"
// field here). #/submit?from=ID opens the form with that job's spec (Clone).

import { api, openapi } from "../api.js";
import { clear, el, errorBox } from "../dom.js";
import { grouped, jobLabel } from "../format.js";
import { loadYaml } from "../yaml.js";
import { epochSchedule, fieldsFor, modelEntry, scheduleText } from "./submit_fields.js";

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
// scheduler as its name when it has nothing else, no nulls (the API's "not given") and no
// defaults that only lengthen it (download: false, strict: true).
function tidy(spec) {
  const out = JSON.parse(JSON.stringify(spec, (_k, v) => (v === null ? undefined : v)));
  for (const key of ["model", "dataset"]) {
    const value = out[key];
    if (!value || typeof value !== "object") continue;
    if (value.download === false) delete value.download;
    if (Object.keys(value).length === 1 && value.name !== undefined) out[key] = value.name;
  }
  if (out.scheduler && typeof out.scheduler === "object" && out.scheduler.name === "none" && !out.scheduler.warmup_steps) delete out.scheduler;
  if (out.init_from && out.init_from.strict === true) delete out.init_from.strict;
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

export async function render({ root, params, signal, me }) {
  const from = params.get("from");
  const [models, datasets, source, described, yaml] = await Promise.all([
    api("v1/catalog/models", { signal }),
    api("v1/catalog/datasets", { signal }),
    from ? api(`v1/jobs/${encodeURIComponent(from)}`, { signal }) : null,
    // Fields that newer servers accept (priority) are offered only when this one documents them.
    openapi(),
    loadYaml(),
  ]);
  const priorityField = described?.components?.schemas?.JobSpec?.properties?.priority;
  const priorities = priorityField && (priorityField.enum ?? priorityField.anyOf?.find((a) => a.enum)?.enum);
  const byName = Object.fromEntries(datasets.items.map((d) => [d.name, d]));
  // The allowed data roots are the servers' paths: the API tells admins only.
  const fields = fieldsFor({ models: models.items, datasets: datasets.items, priorities, roots: me?.data_roots });
  const inputs = new Map(); // path -> {field, input, box, error}
  let extras = {}; // top-level spec keys the form does not show, kept on submit
  let mode = "form";

  for (const field of fields) {
    const id = `f-${field.path.replaceAll(".", "-").replaceAll("_", "-")}`;
    let input;
    let list = null;
    if (field.choices) {
      // A spec value is shown as written in a spec (its meaning on hover); a choice of the form
      // itself (batch_by) by its label: its value is nothing a person writes.
      input = el("select", { id }, field.choices.map(([value, title]) => el("option", { value, title }, field.own && title ? title : value)));
    } else if (field.check) {
      input = el("input", { id, type: "checkbox" });
    } else {
      if (field.datalist) list = el("datalist", { id: `${id}-list` }, field.datalist.map(([value, title]) => el("option", { value, title })));
      input = el("input", { id, ...(field.attrs || {}), ...(field.attrs?.type ? {} : { type: "text" }), list: list?.id });
    }
    const error = el("small", { class: "field-error", id: `${id}-error`, role: "alert" });
    const box = field.check
      ? el("label", { class: "field check" }, el("span", {}, input, " ", field.label), error)
      : el("label", { class: "field" }, el("span", {}, field.label), input, list, field.hint && el("small", { class: "muted" }, field.hint), error);
    inputs.set(field.path, { field, input, box, error });
  }
  const input = (path) => inputs.get(path).input;
  // Short ids the tests and people know: #m, #n, #gpus, #name, #lr, #queue, #max-steps.
  for (const [path, short] of [["micro_batch_size", "m"], ["accumulation_steps", "n"], ["gpus", "gpus"], ["name", "name"],
    ["optimizer.lr", "lr"], ["queue", "queue"], ["max_steps", "max-steps"], ["epochs", "epochs"], ["model.name", "model"],
    ["dataset.name", "dataset"], ["dataset.data_root", "data-root"]]) {
    input(path).id = short;
    inputs.get(path).error.id = `${short}-error`;
  }

  // The datasets the model can train on (its namespace's for timm: and hf: names; all of them
  // for a name the catalog does not know); `wanted` stays offered even if it is not one of them
  // (a clone keeps its dataset).
  const fillDatasets = (wanted) => {
    const entry = modelEntry(models.items, input("model.name").value.trim());
    const names = [...(entry?.compatible_datasets ?? datasets.items.map((d) => d.name))];
    const keep = wanted || input("dataset.name").value || "digits";
    if (wanted && !names.includes(wanted)) names.push(wanted);
    clear(input("dataset.name"), names.map((d) => el("option", { value: d, selected: d === keep, title: byName[d]?.description }, d)));
  };

  const setValue = (path, value) => {
    const { field, input: node } = inputs.get(path);
    if (field.check) node.checked = Boolean(value);
    else if (field.list) node.value = Array.isArray(value) ? value.join(", ") : value ?? "";
    else if (field.options) node.value = value && Object.keys(value).length ? yaml.dump(value, { flowLevel: 0 }).trim() : "";
    else if (field.text && value !== "" && value !== undefined) node.value = field.text(value);
    else node.value = value ?? "";
  };

  // A model's or dataset's own options: the keys its other fields do not hold.
  const optionsOf = (ref, shown) => Object.fromEntries(Object.entries(ref ?? {}).filter(([k, v]) => !shown.includes(k) && v !== null));

  // The form from a spec (a clone's, or what the editor holds); what it cannot show is kept.
  const fill = (spec) => {
    const s = JSON.parse(JSON.stringify(spec));
    for (const key of ["model", "dataset", "scheduler"]) if (typeof s[key] === "string") s[key] = { name: s[key] };
    s.model = { ...s.model, options: optionsOf(s.model, ["name"]) };
    s.dataset = { ...s.dataset, options: optionsOf(s.dataset, ["name", "data_root", "download"]) };
    // The batch as the spec gives it: the effective batch (m maybe "auto"), N by epoch, or m and N.
    s.batch_by = s.effective_batch_size != null ? "effective" : s.accumulation_steps && typeof s.accumulation_steps === "object" ? "by_epoch" : "m_n";
    s.micro_batch_auto = s.micro_batch_size === "auto";
    if (s.micro_batch_auto) delete s.micro_batch_size;
    if (s.batch_by === "by_epoch") {
      s.accumulation_by_epoch = scheduleText(s.accumulation_steps);
      delete s.accumulation_steps;
    }
    const shown = new Set([...inputs.keys()].map((p) => p.split(".")[0]));
    extras = Object.fromEntries(Object.entries(s).filter(([key, value]) => !shown.has(key) && value !== null));
    for (const [path, { field }] of inputs) {
      const value = getPath(s, path);
      setValue(path, value === undefined || value === null ? (field.optional ? "" : field.value) : value);
      if (path === "model.name") fillDatasets(s.dataset?.name);
    }
    if (s.epochs === undefined || s.epochs === null) setValue("epochs", "");
  };

  const numberOf = (node) => (node.value.trim() === "" ? undefined : Number(node.value));
  // A YAML mapping typed in an options field; throws with what is wrong.
  const optionsIn = (node) => {
    if (!node.value.trim()) return {};
    const parsed = yaml.load(node.value);
    if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("must be a mapping, such as {pretrained: true}");
    return parsed;
  };

  // The spec the form describes (an options field that does not parse adds nothing); `raw`
  // keeps the form's own fields (what the fields' `show` reads).
  const spec = (raw = false) => {
    const s = {};
    const options = [];
    for (const [path, { field, input: node, box }] of inputs) {
      if (box.hidden) continue;
      let value;
      if (field.check) value = node.checked;
      else if (field.list) value = node.value.split(/[\s,]+/).filter(Boolean).map(Number);
      else if (field.options) {
        try {
          options.push([path.replace(/\.options$/, ""), optionsIn(node)]);
        } catch { /* shown by checkInputs */ }
        continue;
      } else if (field.attrs?.type === "number") value = numberOf(node);
      else value = node.value.trim() || undefined;
      if (value !== undefined && field.parse && typeof value === "string") value = field.parse(value);
      if (value !== undefined) setPath(s, path, value);
    }
    for (const [parent, values] of options) {
      for (const [key, value] of Object.entries(values)) if (getPath(s, `${parent}.${key}`) === undefined) setPath(s, `${parent}.${key}`, value);
    }
    if (s.max_steps !== undefined) delete s.epochs;
    if (raw) return s;
    if (s.micro_batch_auto && s.batch_by === "effective") s.micro_batch_size = "auto";
    if (s.batch_by === "by_epoch") s.accumulation_steps = epochSchedule(s.accumulation_by_epoch) ?? s.accumulation_by_epoch;
    for (const own of fields.filter((f) => f.own)) delete s[own.path];
    if (s.init_from && s.init_from.job === undefined && s.init_from.uri === undefined) delete s.init_from;
    for (const [key, value] of Object.entries(extras)) s[key] ??= value;
    return tidy(s);
  };

  const effective = el("output", { id: "effective-batch", for: "m n gpus" });
  const steps = el("span", { class: "muted small", id: "steps-per-epoch" });
  const warning = el("p", { class: "warning", id: "batch-warning", hidden: true });
  const preview = el("pre", { class: "spec", id: "spec-preview" });
  const message = el("div", { id: "submit-message" });

  const update = () => {
    const shownFor = spec(true);
    // A field that holds a value the user gave stays in sight (a data root typed before the
    // dataset changed), so nothing is sent that the form does not show.
    const given = ({ field, input: node }) => (field.check ? node.checked && !field.value : field.value === undefined && node.value.trim() !== "");
    for (const entry of inputs.values()) entry.box.hidden = entry.field.show ? !(entry.field.show(shownFor) || given(entry)) : false;
    const s = spec();
    const gpus = s.gpus ?? 1;
    const world = Math.max(gpus, 1);
    const device = gpus === 0 ? "CPU" : `${world} GPU${world > 1 ? "s" : ""}`;
    const size = byName[s.dataset?.name ?? s.dataset]?.train_size;
    const { text, product, valid, perEpoch } = batchOf(s, world, device, size);
    effective.textContent = text;
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
    // `model` is its name's field, `model.hidden` (an option) its options'.
    const top = path.split(".")[0];
    if (top === "accumulation_steps" && !inputs.get("accumulation_by_epoch").box.hidden) path = "accumulation_by_epoch";
    const entry = inputs.get(path) ?? inputs.get(`${path}.name`) ?? inputs.get(`${top}.options`) ?? inputs.get(top)
      ?? inputs.get(`${top}.name`);
    if (!entry || entry.box.hidden) return false;
    entry.error.textContent = entry.error.textContent ? `${entry.error.textContent}; ${text}` : text;
    entry.box.classList.add("invalid");
    return true;
  };
  const checkInputs = () => {
    let ok = true;
    for (const [path, { field, input: node, box }] of inputs) {
      if (box.hidden) continue;
      if (field.options) {
        try {
          optionsIn(node);
        } catch (error) {
          showAt(path, error.reason ? `not YAML: ${error.reason}` : error.message);
          ok = false;
        }
      }
      if (field.attrs?.type !== "number") continue;
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
    if (!inputs.get("accumulation_by_epoch").box.hidden && !epochSchedule(input("accumulation_by_epoch").value)) {
      showAt("accumulation_by_epoch", "write it as epoch: N pairs, such as 0: 8, 4: 2");
      ok = false;
    }
    // Your own data (imagefolder, files, hf_disk) has no default folder.
    const dataset = byName[input("dataset.name").value];
    if (dataset?.source === "own" && !input("dataset.data_root").value.trim()) {
      showAt("dataset.data_root", `required: the folder that holds your ${dataset.name} data`);
      ok = false;
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
      editor.value = yaml.dump(spec());
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

  input("model.name").addEventListener("change", () => fillDatasets());
  for (const [path, { field }] of inputs) {
    setValue(path, field.value ?? "");
    if (path === "model.name") fillDatasets();
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
}

// The effective batch for the way the form gives it, in words, and the optimizer steps per
// epoch (an epoch of `size` samples: each of the `world` ranks reads its share in micro-batches
// of m, N of them per step; with "auto" m the count depends only on the effective batch).
function batchOf(s, world, device, size) {
  const whole = (v) => Number.isInteger(v) && v > 0;
  const m = s.micro_batch_size;
  if (s.effective_batch_size !== undefined) {
    const e = s.effective_batch_size;
    if (!whole(e)) return { text: "the effective batch must be a whole number of at least 1", valid: false };
    const perRank = e / world;
    const steps = size ? Math.ceil(Math.ceil(size / world) / perRank) : null;
    if (m === "auto") {
      return { text: `${grouped(e)} samples per optimizer step; m is chosen on the ${device} (the largest that fits and divides it), N follows`,
        product: e, valid: true, perEpoch: steps };
    }
    const n = perRank / m;
    if (!whole(m) || !Number.isInteger(n)) {
      return { text: `${grouped(e)} is not m × N × ${device} for m ${m ?? "–"}: pick an m that divides ${grouped(perRank)}`, valid: false };
    }
    return { text: `${grouped(m)} × ${grouped(n)} × ${device} = ${grouped(e)} samples per optimizer step`, product: e, valid: true, perEpoch: steps };
  }
  const n = s.accumulation_steps;
  if (n && typeof n === "object") {
    const entries = Object.entries(n).sort(([a], [b]) => Number(a) - Number(b));
    if (!whole(m) || !entries.length || !entries.every(([, v]) => whole(v))) return { text: "m and each N must be whole numbers of at least 1", valid: false };
    const first = m * entries[0][1] * world;
    const parts = entries.map(([epoch, v]) => `from epoch ${Number(epoch) + 1}: ${grouped(m)} × ${grouped(v)} × ${device} = ${grouped(m * v * world)}`);
    const steps = size ? Math.ceil(Math.ceil(Math.ceil(size / world) / m) / entries[0][1]) : null;
    return { text: `${parts.join("; ")} samples per optimizer step`, product: first, valid: true, perEpoch: steps };
  }
  if (!whole(m) || !whole(n)) return { text: "m and N must be whole numbers of at least 1", valid: false };
  const product = m * n * world;
  return { text: `${grouped(m)} × ${grouped(n)} × ${device} = ${grouped(product)} samples per optimizer step`, product, valid: true,
    perEpoch: size ? Math.ceil(Math.ceil(Math.ceil(size / world) / m) / n) : null };
}
