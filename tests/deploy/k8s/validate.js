// Validates Kubernetes objects against the API schema with kubernetes-models
// (the OpenAPI schemas of Kubernetes, and the Prometheus Operator's CRDs).
// stdin: a JSON array of objects; stdout: one line per invalid object; exit 1
// if any is invalid or of a kind with no schema here.
"use strict";
const fs = require("fs");

function modelFor(apiVersion, kind) {
  const candidates = apiVersion.startsWith("monitoring.coreos.com/")
    ? [`@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`]
    : [`kubernetes-models/${apiVersion}/${kind}`];
  for (const path of candidates) {
    try {
      const mod = require(path);
      if (mod[kind]) return mod[kind];
    } catch (e) {
      if (e.code !== "MODULE_NOT_FOUND") throw e;
    }
  }
  return null;
}

const objects = JSON.parse(fs.readFileSync(0, "utf8"));
let bad = 0;
for (const obj of objects) {
  const name = `${obj.kind}/${obj.metadata && obj.metadata.name}`;
  const Model = modelFor(String(obj.apiVersion), String(obj.kind));
  if (!Model) {
    console.log(`${name}: no schema for apiVersion ${obj.apiVersion} kind ${obj.kind}`);
    bad++;
    continue;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    console.log(`${name}: ${e.message}`);
    bad++;
  }
}
console.error(`validate.js: ${objects.length - bad} of ${objects.length} objects valid`);
process.exit(bad ? 1 : 0);
