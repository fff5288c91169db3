// The package's metadata: its version is the crates' version, and what its exports name is
// in the packed tarball (with the wasm and the worker).
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { NPM, ROOT, tarball } from "./harness.mjs";

const pkg = JSON.parse(fs.readFileSync(path.join(NPM, "package.json")));

test("the package version is the crates' version", () => {
  const cargo = fs.readFileSync(path.join(ROOT, "Cargo.toml"), "utf8");
  const section = cargo.slice(cargo.indexOf("[workspace.package]"));
  const version = /^version\s*=\s*"([^"]+)"/m.exec(section)?.[1];
  assert.ok(version, "Cargo.toml has [workspace.package] version");
  assert.equal(pkg.version, version);
});

test("the tarball holds every file the exports name, the worker and the wasm", () => {
  const files = execFileSync("tar", ["tzf", tarball()]).toString().split("\n").filter(Boolean);
  const named = Object.values(pkg.exports).flatMap((e) => (typeof e === "string" ? [e] : Object.values(e)));
  for (const f of [...named, "./src/worker.js", "./wasm/synchro_client.js", "./wasm/synchro_client_bg.wasm", "./README.md"]) {
    assert.ok(files.includes(`package/${f.slice(2)}`), `${f} is in the tarball`);
  }
});

test("the tarball installs with nothing but node and its entry point loads", () => {
  // An empty project, the tarball alone, no network: the wasm is prebuilt inside and the
  // package has no dependency (react is an optional peer, for ./react only).
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "synchro-npm-fresh-"));
  try {
    fs.writeFileSync(path.join(dir, "package.json"), JSON.stringify({ name: "fresh", private: true, type: "module" }));
    execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--loglevel=error", tarball()], { cwd: dir, stdio: "pipe" });
    const installed = path.join(dir, "node_modules", "@synchro", "client");
    for (const f of ["wasm/synchro_client_bg.wasm", "wasm/synchro_client.js", "src/worker.js"]) {
      assert.ok(fs.existsSync(path.join(installed, f)), `${f} is installed`);
    }
    const exported = execFileSync(process.execPath, ["--input-type=module", "-e",
      "const m = await import('@synchro/client'); console.log(Object.keys(m).sort().join(','))"], { cwd: dir }).toString().trim();
    assert.equal(exported, "SynchroError,createClient");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("npm publish --dry-run accepts the packed tarball, public and with provenance", () => {
  assert.deepEqual(pkg.publishConfig, { access: "public", provenance: true });
  assert.match(pkg.repository?.url ?? "", /^git\+https:\/\/github\.com\//, "provenance needs the repository");
  const out = execFileSync("npm", ["publish", tarball(), "--dry-run"], { stdio: "pipe", encoding: "utf8" });
  const text = out + "";
  assert.ok(text.includes(`${pkg.name}@${pkg.version}`), text);
});
