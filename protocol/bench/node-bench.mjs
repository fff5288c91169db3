// Digest benchmark (wasm in node): the same kernels and workload as
// protocol/examples/digest_bench.rs, timed from JS. Run through scripts/bench.sh.
//   node protocol/bench/node-bench.mjs <pkg-dir> [rows] [entries] [runs] [seed]
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { performance } from "node:perf_hooks";

const [pkgDir, rows = 200000, entries = 1000000, runs = 5, seed = 42] = process.argv.slice(2);
const wasm = createRequire(import.meta.url)(join(resolve(pkgDir), "synchro_protocol.js"));

function time(f, setup = () => {}) {
  setup();
  f();
  const t = [];
  for (let i = 0; i < Number(runs); i++) {
    setup();
    const start = performance.now();
    f();
    t.push((performance.now() - start) / 1000);
  }
  t.sort((a, b) => a - b);
  return t[Math.floor(t.length / 2)];
}

console.error(`generating ${rows} rows and ${entries} scope entries (seed ${seed})...`);
const w = new wasm.BenchWorkload(Number(rows), Number(entries), BigInt(seed));
const rowMb = w.rowInputBytes() / 1e6;
const scopeMb = w.scopeInputBytes() / 1e6;
const rawRows = time(() => w.rawSha256Rows());
const wire = time(() => w.rowDigestsFromWire());
const values = time(() => w.rowDigestsFromValues());
const rawScope = time(() => w.rawSha256Scope());
const scopeSorted = time(() => w.scopeDigestPresorted());
const scopeUnsorted = time(() => w.scopeDigestWithSort(), () => w.prepareUnsorted());
const n = w.rowCount();
const f0 = (x, w) => x.toFixed(0).padStart(w);
const f1 = (x, w) => x.toFixed(1).padStart(w);
console.log(`synchro digest benchmark: wasm32 in node ${process.version}, median of ${runs} runs`);
console.log(`rows: ${n} x 10 mixed-type fields, ${rowMb.toFixed(1)} MB of digest input`);
console.log(`  raw SHA-256 over the same octets   ${f0(n / rawRows, 10)} rows/s  ${f1(rowMb / rawRows, 7)} MB/s`);
console.log(`  row digest from validated values   ${f0(n / values, 10)} rows/s  ${f1(rowMb / values, 7)} MB/s  ratio to raw SHA-256 ${(rawRows / values).toFixed(2)}`);
console.log(`  row digest from wire JSON          ${f0(n / wire, 10)} rows/s  ${f1(rowMb / wire, 7)} MB/s  ratio to raw SHA-256 ${(rawRows / wire).toFixed(2)}`);
console.log(`scope: ${w.entryCount()} entries, ${scopeMb.toFixed(1)} MB of digest input`);
console.log(`  raw SHA-256 over the same octets   ${f1(rawScope * 1e3, 8)} ms`);
console.log(`  scope digest, presorted entries    ${f1(scopeSorted * 1e3, 8)} ms  ratio to raw SHA-256 ${(rawScope / scopeSorted).toFixed(2)}`);
console.log(`  scope digest, including the sort   ${f1(scopeUnsorted * 1e3, 8)} ms  ratio to raw SHA-256 ${(rawScope / scopeUnsorted).toFixed(2)}`);
