// The submit form's fields: one entry per spec field, in sections. `path` is the spec's (and
// the API's 422) path; `show(spec)` hides fields that do not apply (momentum is SGD's, betas
// AdamW's, a data root is for data read from disk); a field holding a value is always shown.
// Kinds: `choices` (a select), `check` (a checkbox), `options` (a YAML mapping merged into its
// parent: a model's or a dataset's own options), else an input with `attrs`; `parse` turns the
// typed text into the spec's value and `text` back; `own` fields are the form's, not the spec's.

const SCHEDULERS = ["none", "cosine", "step"];
// The namespaces of the catalog ("timm:", "hf:"): a name after the colon picks the model.
const NAMESPACE = /^([a-z_]+:)/;

// The catalog entry a model name belongs to: its own, or its namespace's ("timm:resnet18").
export function modelEntry(models, name) {
  const prefix = NAMESPACE.exec(name ?? "")?.[1];
  return models.find((m) => m.name === name) ?? (prefix ? models.find((m) => m.name === prefix) : undefined);
}

// "0: 8, 4: 2" as the spec's accumulation_steps mapping ({"0": 8, "4": 2}); null when it is
// not a list of epoch: N pairs.
export function epochSchedule(text) {
  const pairs = String(text ?? "").split(",").map((p) => p.trim()).filter(Boolean);
  const out = {};
  for (const pair of pairs) {
    const match = /^(\d+)\s*:\s*(\d+)$/.exec(pair);
    if (!match) return null;
    out[String(Number(match[1]))] = Number(match[2]);
  }
  return pairs.length ? out : null;
}

export function scheduleText(schedule) {
  return Object.entries(schedule).sort(([a], [b]) => Number(a) - Number(b)).map(([e, n]) => `${e}: ${n}`).join(", ");
}

export function fieldsFor({ models, datasets, priorities, roots }) {
  const int = (min, max) => ({ type: "number", min, max, step: 1 });
  const real = (min) => ({ type: "number", min, step: "any" });
  const byName = Object.fromEntries(datasets.map((d) => [d.name, d]));
  const dataset = (s) => byName[s.dataset?.name ?? s.dataset];
  const rootsHint = roots?.length ? `inside ${roots.join(" or ")}` : "inside a data root of this service (an admin can tell you which)";
  return [
    { section: "Job", path: "name", label: "Name", attrs: { placeholder: "model-dataset" } },
    { section: "Job", path: "model.name", label: "Model", value: "mlp", datalist: models.map((m) => [m.name, m.description]),
      attrs: { placeholder: "mlp, timm:resnet18, hf:gpt2", autocomplete: "off" },
      hint: "a catalog model, timm:<name>, hf:<model_type> or hf:<directory>" },
    { section: "Job", path: "model.options", label: "Model options", options: true,
      attrs: { placeholder: "{pretrained: true}" }, hint: "YAML mapping; the catalog lists each model's options" },
    { section: "Job", path: "dataset.name", label: "Dataset", choices: [], value: "digits" },
    { section: "Job", path: "dataset.data_root", label: "Data root", datalist: (roots ?? []).map((r) => [r]),
      attrs: { placeholder: roots?.[0] ? `${roots[0]}/…` : "/data/…", autocomplete: "off" },
      hint: `the data's folder, ${rootsHint}, or s3://bucket/prefix`, show: (s) => Boolean(dataset(s)?.needs_data_root) },
    { section: "Job", path: "dataset.download", label: "Download if missing", check: true, value: false,
      show: (s) => dataset(s)?.needs_data_root && dataset(s)?.source === "builtin" },
    { section: "Job", path: "dataset.options", label: "Dataset options", options: true,
      attrs: { placeholder: "{columns: {text: body}}" }, hint: "YAML mapping; the catalog lists each dataset's options" },
    // How the batch is given: m and N, the effective batch (N follows; m may be "auto"), or N
    // changing by epoch. `batch_by`, `micro_batch_auto` and `accumulation_by_epoch` are the
    // form's own: submit.js turns them into the spec's fields.
    { section: "Batch", path: "batch_by", label: "Batch given by", value: "m_n", own: true,
      choices: [["m_n", "m × N"], ["effective", "effective batch (N follows)"], ["by_epoch", "N by epoch"]] },
    { section: "Batch", path: "effective_batch_size", label: "Effective batch", attrs: int(1, 2147483647), value: 64,
      hint: "samples per optimizer step (m × N × GPUs)", show: (s) => s.batch_by === "effective" },
    { section: "Batch", path: "micro_batch_auto", label: "m: the largest that fits", check: true, value: false, own: true,
      show: (s) => s.batch_by === "effective" },
    { section: "Batch", path: "micro_batch_size", label: "Micro-batch m", attrs: int(1, 1048576), value: 16, hint: "samples per forward/backward",
      show: (s) => !(s.batch_by === "effective" && s.micro_batch_auto) },
    { section: "Batch", path: "accumulation_steps", label: "Accumulation N", attrs: int(1, 65536), value: 4, hint: "micro-batches per optimizer step",
      show: (s) => !s.batch_by || s.batch_by === "m_n" },
    { section: "Batch", path: "accumulation_by_epoch", label: "N by epoch", value: "0: 8, 4: 2", own: true,
      attrs: { placeholder: "0: 8, 4: 2", autocomplete: "off" }, hint: "epoch: N pairs, epochs counted from 0 as in the spec",
      show: (s) => s.batch_by === "by_epoch" },
    { section: "Batch", path: "gpus", label: "GPUs", attrs: int(0, 64), value: 1, hint: "0 = CPU" },
    { section: "Length", path: "epochs", label: "Epochs", attrs: int(1), value: 1, optional: true },
    { section: "Length", path: "max_steps", label: "Max steps", attrs: { ...int(1), placeholder: "instead of epochs" }, optional: true, hint: "optimizer steps; overrides epochs" },
    { section: "Length", path: "timeout", label: "Timeout", attrs: { placeholder: "the service's maximum" }, optional: true,
      hint: "seconds, or 90m, 12h, 7d", parse: (t) => (/^\d+$/.test(t) ? Number(t) : t) },
    { section: "Optimizer", path: "optimizer.name", label: "Optimizer", choices: [["sgd"], ["adamw"], ["adamw8bit", "adamw8bit (8-bit states, CUDA workers)"]], value: "sgd" },
    { section: "Optimizer", path: "optimizer.lr", label: "Learning rate", attrs: real(0), value: 0.1 },
    { section: "Optimizer", path: "optimizer.momentum", label: "Momentum", attrs: real(0), value: 0, show: (s) => s.optimizer?.name === "sgd" },
    { section: "Optimizer", path: "optimizer.betas", label: "Betas", attrs: { placeholder: "0.9, 0.999" }, value: "0.9, 0.999", list: true, show: (s) => ["adamw", "adamw8bit"].includes(s.optimizer?.name) },
    { section: "Optimizer", path: "optimizer.weight_decay", label: "Weight decay", attrs: real(0), value: 0 },
    { section: "Optimizer", path: "grad_clip_norm", label: "Gradient clip norm", attrs: { ...real(0), placeholder: "none" }, optional: true },
    { section: "Optimizer", path: "on_nonfinite", label: "On NaN / inf", choices: [["fail", "fail the job"], ["skip", "skip the step"]], value: "fail",
      hint: "a window whose loss or gradient is not finite" },
    { section: "Schedule", path: "scheduler.name", label: "LR schedule", choices: SCHEDULERS.map((s) => [s]), value: "none", hint: "counted in optimizer steps" },
    { section: "Schedule", path: "scheduler.warmup_steps", label: "Warm-up steps", attrs: int(0), value: 0, show: (s) => ["cosine", "step"].includes(s.scheduler?.name) },
    { section: "Schedule", path: "scheduler.step_size", label: "Step size", attrs: int(1), value: 100, show: (s) => s.scheduler?.name === "step" },
    { section: "Schedule", path: "scheduler.gamma", label: "Gamma", attrs: real(0), value: 0.1, show: (s) => s.scheduler?.name === "step" },
    // Memory levers beside accumulation (docs/accumulation.md, "Memory levers").
    { section: "Memory levers", path: "activation_checkpointing", label: "Activation checkpointing", value: "", optional: true,
      choices: [["", "off"], ["1", "every block"], ["2", "every 2nd block"], ["4", "every 4th block"]],
      parse: (t) => ({ every: Number(t) }),
      text: (v) => (v === true ? "1" : v && typeof v === "object" ? String(v.every) : ""),
      hint: "recompute activations in the backward: less memory, a second forward; same dropout masks" },
    { section: "Memory levers", path: "peft.method", label: "Fine-tune with", value: "", optional: true,
      choices: [["", "every parameter"], ["lora", "LoRA adapters (frozen base)"]],
      show: (s) => String(s.model?.name ?? s.model ?? "").startsWith("hf:"), hint: "hf: models; checkpoints hold the adapters" },
    { section: "Memory levers", path: "peft.r", label: "LoRA rank r", attrs: int(1, 4096), value: 8, show: (s) => s.peft?.method === "lora" },
    { section: "Memory levers", path: "peft.alpha", label: "LoRA alpha", attrs: int(1, 65536), value: 16, show: (s) => s.peft?.method === "lora", hint: "scaling alpha / r" },
    { section: "Memory levers", path: "peft.dropout", label: "LoRA dropout", attrs: real(0), value: 0, show: (s) => s.peft?.method === "lora" },
    { section: "Memory levers", path: "peft.target_modules", label: "Target modules", optional: true,
      attrs: { placeholder: "peft's default for the model", autocomplete: "off" }, show: (s) => s.peft?.method === "lora",
      parse: (t) => (t === "all-linear" ? t : t.split(/[\s,]+/).filter(Boolean)), text: (v) => (Array.isArray(v) ? v.join(", ") : String(v)),
      hint: "e.g. c_attn, or q_proj, v_proj, or all-linear" },
    { section: "Memory levers", path: "peft.merge", label: "Merged model for download", check: true, value: false, show: (s) => s.peft?.method === "lora" },
    { section: "Evaluation and checkpoints", path: "eval_every", label: "Evaluate every", attrs: { ...int(1), placeholder: "each epoch's end" }, optional: true, hint: "optimizer steps" },
    { section: "Evaluation and checkpoints", path: "checkpoint_every", label: "Checkpoint every", attrs: int(1), value: 100, hint: "optimizer steps (and always at the end)" },
    { section: "Evaluation and checkpoints", path: "keep_checkpoints", label: "Keep checkpoints", attrs: int(1), value: 3, hint: "latest ones, plus the best" },
    { section: "Evaluation and checkpoints", path: "verify_window", label: "Check the first window", value: "true",
      choices: [["true", "fail the job when accumulation is not exact"], ["warn", "record it and train on"], ["false", "skip the check"]],
      parse: (t) => (t === "warn" ? t : t === "true"), text: (v) => String(v), hint: "against the big batch, before the first step" },
    { section: "Warm start", path: "init_from.job", label: "From job", attrs: { placeholder: "one of your job ids", autocomplete: "off" }, optional: true },
    { section: "Warm start", path: "init_from.step", label: "Checkpoint step", attrs: { ...int(1), placeholder: "the latest" }, optional: true },
    { section: "Warm start", path: "init_from.uri", label: "Or weights file", datalist: (roots ?? []).map((r) => [r]),
      attrs: { placeholder: roots?.[0] ? `${roots[0]}/model.pt` : "/data/model.pt", autocomplete: "off" }, optional: true,
      hint: `a checkpoint or state dict ${rootsHint}` },
    { section: "Warm start", path: "init_from.strict", label: "Every key must match", check: true, value: true },
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
