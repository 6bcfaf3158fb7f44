// The API as the page uses it: JSON calls with the stored bearer token, and the live job
// stream read with fetch() (EventSource cannot send an Authorization header).

const TOKEN_KEY = "accum.token";

export const tokenStore = {
  get: () => localStorage.getItem(TOKEN_KEY),
  set: (token) => localStorage.setItem(TOKEN_KEY, token),
  clear: () => localStorage.removeItem(TOKEN_KEY),
};

export class ApiError extends Error {
  constructor(status, body) {
    // problem+json answers carry a `detail` that says what to fix.
    super((body && (body.detail || body.title)) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

function headers(token, extra = {}) {
  return { Authorization: `Bearer ${token}`, ...extra };
}

// Paths are relative ("v1/jobs"), so the page also works behind a proxy under a prefix.
export async function api(path, { method = "GET", body, signal, token = tokenStore.get() } = {}) {
  const extra = { Accept: "application/json" };
  if (body !== undefined) extra["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers: headers(token, extra),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  const data = await response.json().catch(() => null);
  // Only the stored token's refusal logs out; a token being tried on the login page does not.
  if (response.status === 401 && token && token === tokenStore.get()) {
    window.dispatchEvent(new CustomEvent("accum:unauthorized"));
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

// Parse one SSE block ("event: x\ndata: {...}\n") into {event, data, id}; null for comments.
function parseBlock(block) {
  let event = "message";
  let id = null;
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
    else if (field === "id") id = Number(value);
  }
  if (!data.length) return null;
  return { event, id, data: JSON.parse(data.join("\n")) };
}

// Read the job's live stream until it ends (resolves true after `end`, false if the
// connection dropped first). `onMessage({event, data, id})` gets each message; `onOpen()` is
// called once the stream is open (its metrics start at that moment: read history then).
export async function streamJob(jobId, onMessage, { signal, lastEventId = null, onOpen } = {}) {
  const extra = { Accept: "text/event-stream" };
  if (lastEventId !== null) extra["Last-Event-ID"] = String(lastEventId);
  const response = await fetch(`v1/jobs/${encodeURIComponent(jobId)}/events`, {
    headers: headers(tokenStore.get(), extra),
    signal,
    cache: "no-store",
  });
  if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
  onOpen?.();  // the server has fixed where the stream starts: history read now leaves no gap
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    buffer += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const message = parseBlock(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
      if (!message) continue;
      onMessage(message);
      if (message.event === "end") {
        reader.cancel().catch(() => {});
        return true;
      }
    }
  }
}

// Checkpoint downloads need the token too, so a plain link cannot fetch them: fetch the
// file, then hand the browser a blob URL to save.
export async function downloadFile(path, filename) {
  const response = await fetch(path, { headers: headers(tokenStore.get()) });
  if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
  saveBlob(await response.blob(), filename);
}

// Hand the browser a file made or fetched by the page, to save as `filename`.
export function saveBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const link = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// Wait `ms`, or less if the view is left (the signal aborts).
export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

// The server's OpenAPI document (no token needed), read once: what this server offers, so the
// page shows features a newer server has (a worker registry, job priorities) and no others.
let described = null;
export function openapi() {
  described ??= fetch("openapi.json", { cache: "no-store" }).then((r) => (r.ok ? r.json() : {})).catch(() => ({}));
  return described;
}
