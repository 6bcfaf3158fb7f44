// Small DOM helpers. Pages are built with elements and text nodes, never HTML strings, so a
// job name or an error message can hold any characters.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "style") node.style.cssText = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  node.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

// A row of a table that becomes one card per row on a phone (`table.responsive`): each cell
// carries its column's name, shown above its value there.
export function cardRow(attrs, labels, cells) {
  cells.forEach((cell, i) => { if (labels[i]) cell.dataset.label = labels[i]; });
  return el("tr", attrs, cells);
}

export function clear(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
}

// Messages from the API quote commands in backticks (`accum token create NAME`): shown as
// code, not as literal backticks.
export function richText(text) {
  return String(text).split(/(`[^`]+`)/).filter(Boolean).map((part) =>
    part.startsWith("`") && part.endsWith("`") ? el("code", {}, part.slice(1, -1)) : part);
}

export function errorBox(error) {
  return el("p", { class: "error", role: "alert" }, richText(error.message || error));
}
