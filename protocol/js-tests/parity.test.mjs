// Native and wasm must give identical output for every case: this runs the same conformance
// documents through the native `synchro-conformance` binary and through the wasm build
// (wasm-bindgen --target nodejs) and requires the two output texts to be equal octet for
// octet. Cases: all vectors plus a generated cross product of types and raw values.
//
//   node --test protocol/js-tests/      (after scripts/build-wasm.sh and cargo build)
// Env: SYNCHRO_CONFORMANCE_BIN (default target/debug/synchro-conformance),
//      SYNCHRO_WASM_PKG (default target/wasm-pkg/protocol/nodejs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const bin = process.env.SYNCHRO_CONFORMANCE_BIN ?? join(root, "target/debug/synchro-conformance");
const pkgDir = process.env.SYNCHRO_WASM_PKG ?? join(root, "target/wasm-pkg/protocol/nodejs");
const wasm = createRequire(import.meta.url)(join(pkgDir, "synchro_protocol.js"));
const readJson = (p) => JSON.parse(readFileSync(join(root, p), "utf8"));

function vectorCases() {
  const cases = [
    ...readJson("vectors/conformance-v1.json").cases,
    ...readJson("vectors/synchro-v1.json").cases,
  ].map(({ id, command, input }) => ({ id, command, input }));
  const kinds = {
    typed_value: "typed-value",
    schema_manifest: "manifest",
    row_identity: "row-identity",
    row_digest: "row-digest",
    scope_digest: "scope-digest",
  };
  for (const v of readJson("vectors/upstream/canonical-v1.json").vectors) {
    if (kinds[v.kind]) cases.push({ id: v.vector_id, command: kinds[v.kind], input: v.input });
  }
  return cases;
}

// Raw wire values crossed with every field spec: valid and invalid spellings of each type.
const RAW = [
  "null", "true", "false", "0", "-0", "1", "-1", "2147483647", "2147483648", "-2147483649",
  "1.5", "1.50", "1e21", "1e+21", "1E+21", "5e-324", "1e-7", "0.000001", "1e400", "-1e-400",
  "9007199254740993", "123456789012345680000", '""', '"0"', '"-0"', '"01"', '"1.230"',
  '"9223372036854775807"', '"-9223372036854775808"', '"9223372036854775808"', '"12.34"',
  '"1e2"', '"+1"', '"2024-02-29"', '"2023-02-29"', '"0000-01-01"', '"23:59:59.999999"',
  '"24:00:00.000000"', '"2024-02-29T12:34:56.123456Z"', '"2024-02-29T12:34:56Z"', '"AQID"',
  '"AQ=="', '"AQJ"', '"+/8"', '"-_8"', '"{}"', '"{\\"b\\":1,\\"a\\":2}"', '"{\\"a\\":2,\\"b\\":1}"',
  '"[1.0]"', '"[1e-7]"', '"\\u00e9"', '"e\\u0301"', '"\\ud800"', '"\\ud83d\\ude00"',
  '"\\u0000\\u001f"', "[1]", "{}", "[", "", " 1 ", "01", "NaN",
];
const SPECS = [
  ...["string", "int", "int64", "float", "boolean", "datetime", "date", "time", "json", "bytes"]
    .flatMap((type) => [{ type, nullable: true }, { type, nullable: false }]),
  { type: "decimal", nullable: true, precision: 6, scale: 2 },
  { type: "decimal", nullable: false, precision: 1000, scale: 500 },
  { type: "decimal", nullable: true },
  { type: "text", nullable: true },
  { type: "int", nullable: true, precision: 3, scale: 0 },
];
const JSON_TEXTS = [
  '{"b":2,"a":1}', "[1.0,1e0,10e-1]", '{"a":1,"a":2}', "[1e400]", "[1e20]", "[1e21]",
  '"\\u001f\\u007f"', '{"\\ud83d\\ude00":1,"\\uffff":2,"é":3}', "{ }", "[9007199254740991]",
  "[-9007199254740992]", '"\\ud800"', "[[[[[]]]]]", "[0.1,0.2,0.30000000000000004]", "tru",
  "[1,]", '{"a":[{"c":3,"b":2}],"0":null}', "-0", "1e-400", "123.456e-789",
];
const DECIMALS = [
  "1.2300", "123e-2", "0.01230e2", "-0.000", "+7", "1e5", "1e6", "1e", "", ".5", "5.", "00.5",
  "-12.5E-3", "1e999999999999", "0e999999999999999", "12345678901234567890.123456789",
];
const SEMVERS = [
  "1.0.0", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-beta.11", "1.0.0-beta.2", "1.0.0+b",
  "v1.0.0", "01.0.0", "1.0.0-01", "99999999999999999999.0.0", "1.0", "1.0.0-a..b",
];

function generatedCases() {
  const cases = [];
  let n = 0;
  for (const field_spec of SPECS) {
    for (const raw_json of RAW) {
      cases.push({ id: `gen-${n++}`, command: "typed-value", input: { field_spec, raw_json } });
    }
  }
  for (const text of JSON_TEXTS) {
    cases.push({ id: `gen-${n++}`, command: "canonical-json", input: { text } });
  }
  for (const source of DECIMALS) {
    cases.push({ id: `gen-${n++}`, command: "canonical-decimal", input: { source } });
    cases.push({ id: `gen-${n++}`, command: "canonical-decimal", input: { source, precision: 8, scale: 3 } });
    cases.push({ id: `gen-${n++}`, command: "canonical-float", input: { source } });
  }
  for (const a of SEMVERS) {
    for (const b of SEMVERS) {
      cases.push({ id: `gen-${n++}`, command: "semver-compare", input: { a, b } });
    }
  }
  cases.push({ id: `gen-${n++}`, command: "no-such-command", input: {} });
  cases.push({ id: `gen-${n++}`, command: "typed-value", input: {} });
  return cases;
}

function native(doc) {
  return execFileSync(bin, ["eval"], { input: doc, maxBuffer: 256 << 20 }).toString("utf8").trimEnd();
}

for (const [name, cases] of [["vectors", vectorCases()], ["generated", generatedCases()]]) {
  test(`native and wasm agree octet for octet on ${name} (${cases.length} cases)`, () => {
    const doc = JSON.stringify({ cases });
    const fromWasm = wasm.evalConformance(doc);
    const fromNative = native(doc);
    assert.equal(fromWasm, fromNative);
    const results = JSON.parse(fromWasm).results;
    assert.equal(results.length, cases.length);
    // The generated set must exercise both outcomes, or it proves little.
    const valid = results.filter((r) => r.output.valid).length;
    assert.ok(valid > 0 && valid < results.length, `valid=${valid}`);
  });
}

test("vector expectations hold in the wasm build (node)", () => {
  const cases = [...readJson("vectors/conformance-v1.json").cases, ...readJson("vectors/synchro-v1.json").cases];
  const results = JSON.parse(wasm.evalConformance(JSON.stringify({ cases }))).results;
  assert.equal(results.length, 123 + 39);
  for (const [i, c] of cases.entries()) {
    const out = results[i].output;
    for (const [k, v] of Object.entries(c.expect)) assert.deepEqual(out[k], v, `${c.id}.${k}`);
  }
});

test("errors cross the boundary as real Error objects with a stable code", () => {
  for (const [fn, args, code] of [
    [wasm.evalConformance, ["{"], "malformed_json"],
    [wasm.canonicalJson, ['{"a":1,"a":2}'], "duplicate_member"],
    [wasm.canonicalDecimal, ["1.234", 6, 2], "scale_exceeded"],
    [wasm.semverCompare, ["v1.0.0", "1.0.0"], "invalid_semver"],
    [wasm.typedValueBytes, ['{"type":"int","nullable":false}', "null"], "null_not_allowed"],
  ]) {
    assert.throws(() => fn(...args), (e) => e instanceof Error && e.code === code, code);
  }
  assert.equal(wasm.semverCompare("1.0.0-beta.2", "1.0.0-beta.11"), -1);
  assert.deepEqual([...wasm.typedValueBytes('{"type":"boolean","nullable":true}', "true")], [6, 1, 1]);
});

test("the wasm build reports the crate version", () => {
  const cargo = readFileSync(join(root, "Cargo.toml"), "utf8");
  const version = /\[workspace\.package\][^[]*?\nversion = "([^"]+)"/.exec(cargo)[1];
  assert.equal(wasm.version(), version);
});
