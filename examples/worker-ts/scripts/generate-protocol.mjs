// Generates src/protocol.ts, the protocol's TypeScript types, from the JSON Schema in
// schema/ at the repository root (which the engine generates from its Rust types).
//
//   node scripts/generate-protocol.mjs           # write src/protocol.ts
//   node scripts/generate-protocol.mjs --check   # fail if src/protocol.ts is not current
//
// The six schema documents are self-contained, so they repeat shared definitions; they are
// merged into one document (each root under its title) and compiled once, so that every type
// is declared once.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual } from "node:util";
import { compile } from "json-schema-to-typescript";

const here = dirname(fileURLToPath(import.meta.url));
const schemaDir = join(here, "..", "..", "..", "schema");
const output = join(here, "..", "src", "protocol.ts");
const FILES = [
  "decision-request.json",
  "decision-response.json",
  "client-input.json",
  "llm-request.json",
  "llm-response.json",
  "stream-delta.json",
];

// `additionalProperties: false` only says what the engine refuses; the TypeScript types are the
// same either way (decision-response.json, the worker's lenient answer, has none).
function withoutClosedObjects(value) {
  if (Array.isArray(value)) return value.map(withoutClosedObjects);
  if (value === null || typeof value !== "object") return value;
  const out = {};
  for (const [key, v] of Object.entries(value)) {
    if (key === "additionalProperties" && v === false) continue;
    out[key] = withoutClosedObjects(v);
  }
  return out;
}

// What the TypeScript compiler needs beyond the schema: a JSON value of any kind (a schema with
// no type, e.g. `state`) is `unknown`, not an object; and a `$ref` with a sibling description
// would be declared as a new type (`UrlRef1`), so the reference stands alone.
const TYPE_KEYWORDS = ["type", "$ref", "anyOf", "oneOf", "allOf", "const", "enum", "properties", "items", "not"];
function forTypeScript(schema) {
  if (schema === true) return { tsType: "unknown" };
  if (Array.isArray(schema)) return schema.map(forTypeScript);
  if (schema === null || typeof schema !== "object") return schema;
  if (typeof schema.$ref === "string") return { $ref: schema.$ref };
  const out = {};
  for (const [key, value] of Object.entries(schema)) {
    // Object-valued keywords whose values are maps of schemas, or schemas.
    if (key === "properties" || key === "$defs") {
      out[key] = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, forTypeScript(v)]));
    } else if (["items", "anyOf", "oneOf", "allOf", "additionalProperties", "not"].includes(key)) {
      out[key] = forTypeScript(value);
    } else {
      out[key] = value;
    }
  }
  if (!TYPE_KEYWORDS.some((k) => k in out)) out.tsType = "unknown";
  return out;
}

// A definition's shape, without its root-only title and description.
function shape(schema) {
  const { title, description, ...rest } = withoutClosedObjects(schema);
  return rest;
}

const defs = {};
function define(name, schema, file) {
  if (name in defs && !isDeepStrictEqual(shape(defs[name]), shape(schema))) {
    throw new Error(`schema/${file}: ${name} differs from its definition in another file`);
  }
  defs[name] ??= schema;
}

const roots = [];
for (const file of FILES) {
  const { $schema, $defs = {}, ...root } = JSON.parse(readFileSync(join(schemaDir, file), "utf8"));
  for (const [name, schema] of Object.entries($defs)) define(name, schema, file);
  roots.push(root.title);
  define(root.title, root, file);
}

const combined = {
  title: "ProtocolDocument",
  description: "Any top-level document of the decision protocol.",
  anyOf: roots.map((name) => ({ $ref: `#/$defs/${name}` })),
  $defs: defs,
};

const banner = `/* Generated from schema/*.json by scripts/generate-protocol.mjs; do not edit.
 * Regenerate: npm run generate (in examples/worker-ts). */`;
const ts = await compile(forTypeScript(combined), "ProtocolDocument", {
  bannerComment: banner,
  additionalProperties: false,
  unreachableDefinitions: true,
  declareExternallyReferenced: true,
  cwd: schemaDir,
});

if (process.argv.includes("--check")) {
  let current = "";
  try {
    current = readFileSync(output, "utf8");
  } catch {}
  if (current !== ts) {
    console.error(
      "examples/worker-ts/src/protocol.ts is not what schema/*.json generates;\n" +
        "regenerate it with: (cd examples/worker-ts && npm run generate)",
    );
    process.exit(1);
  }
  console.log("src/protocol.ts is current");
} else {
  writeFileSync(output, ts);
  console.log(`wrote src/protocol.ts (${ts.split("\n").length} lines)`);
}
