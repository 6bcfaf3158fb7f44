// Specs as YAML: the vendored js-yaml, loaded on first use, reading every number a person
// writes as a number. Its YAML 1.2 core schema already reads 3e-4, 1e5 and .5 as numbers, but
// takes a sign only before a digit, so "-.5" and "+.5" stayed strings (the API then refused the
// field as "not a valid number"); NUMBERS adds them, as the CLI's spec reader reads them.

import { el } from "./dom.js";

const SCRIPT = "dashboard/vendor/js-yaml.min.js";
const SIGNED_DOT = /^[-+]\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?$/;
let loading = null;

function withNumbers(jsyaml) {
  const signedDot = new jsyaml.Type("tag:accum,2026:number", {
    kind: "scalar",
    resolve: (text) => text !== null && SIGNED_DOT.test(text),
    construct: (text) => Number(text.replaceAll("_", "")),
  });
  const schema = jsyaml.DEFAULT_SCHEMA.extend({ implicit: [signedDot] });
  return {
    load: (text) => jsyaml.load(text, { schema }),
    dump: (value, options = {}) => jsyaml.dump(value, { lineWidth: 100, ...options }),
  };
}

// {load, dump}; rejects when the script cannot be read.
export function loadYaml() {
  loading ??= new Promise((resolve, reject) => {
    if (window.jsyaml) {
      resolve(withNumbers(window.jsyaml));
      return;
    }
    document.head.append(el("script", {
      src: SCRIPT,
      onload: () => resolve(withNumbers(window.jsyaml)),
      onerror: () => { loading = null; reject(new Error("could not load the YAML reader")); },
    }));
  });
  return loading;
}
