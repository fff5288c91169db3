// The package's metadata: its version is the crates' version, and what its exports name is
// in the packed tarball (with the wasm and the worker).
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
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
