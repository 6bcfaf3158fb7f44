// A job's whole metric history as CSV, read page by page from the API (never downsampled):
// one row per logged point, `name,step,epoch_index,value,ts` (epoch_index counts from 0 as the
// API does; value is the number, or NaN / inf / -inf as logged).

import { api } from "./api.js";

const PAGE = 10_000;
const HEADER = "name,step,epoch_index,value,ts";

export async function metricsCsv(jobId, signal) {
  const lines = [HEADER];
  let cursor = null;
  do {
    const query = `limit=${PAGE}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
    const page = await api(`v1/jobs/${encodeURIComponent(jobId)}/metrics?${query}`, { signal });
    for (const p of page.items) {
      lines.push([p.name, p.step, p.epoch ?? "", p.nonfinite ?? p.value ?? "", p.ts ?? ""].join(","));
    }
    cursor = page.next_cursor;
  } while (cursor);
  return `${lines.join("\n")}\n`;
}
