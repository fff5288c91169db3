// What the package's browser tests and benchmark share: the real stack (PostgreSQL + the
// server program, tests/examples/npm_stack.rs), a fresh Vite app that installs the packed
// tarball and is built with `vite build`, `vite preview` serving it (proxying /sync to the
// server, so the page and the server share an origin), and Debian's Chromium driven by
// playwright-core. Nothing downloads a browser.
import { spawn, execFileSync } from "node:child_process";
import { createInterface } from "node:readline";
import fs from "node:fs";
import zlib from "node:zlib";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const NPM = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
export const ROOT = path.resolve(NPM, "..");
export const TARGET = process.env.CARGO_TARGET_DIR || path.join(ROOT, "target");
process.env.PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD = "1";

/** The packed package: $SYNCHRO_NPM_TARBALL, else built now (scripts/build-npm.sh). */
export function tarball() {
  if (process.env.SYNCHRO_NPM_TARBALL) return process.env.SYNCHRO_NPM_TARBALL;
  const out = execFileSync(path.join(ROOT, "scripts/build-npm.sh"), { stdio: ["ignore", "pipe", "inherit"] });
  return out.toString().trim().split("\n").pop();
}

/** Starts the stack; `command(line)` sends one command and resolves to its answer line. */
export async function startStack() {
  const bin = path.join(TARGET, "debug/examples/npm_stack");
  if (!fs.existsSync(bin)) throw new Error(`${bin} is missing: cargo build -p synchro-tests --bin synchro-server-under-test --example npm_stack`);
  const child = spawn(bin, [], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout });
  const waiting = [];
  const early = [];
  lines.on("line", (l) => (waiting.length ? waiting.shift()(l) : early.push(l)));
  const next = () => new Promise((r) => (early.length ? r(early.shift()) : waiting.push(r)));
  const first = await next();
  if (!first.startsWith("SYNCHRO_URL=")) throw new Error(`the stack printed ${first}`);
  let queue = Promise.resolve();
  const command = (line) => {
    const answer = queue.then(() => {
      child.stdin.write(line.replace(/\n/g, " ") + "\n");
      return next();
    });
    queue = answer.catch(() => {});
    return answer;
  };
  return {
    url: first.slice("SYNCHRO_URL=".length),
    command,
    async sql(statements) {
      const a = await command(`sql ${statements}`);
      if (a !== "ok") throw new Error(`sql failed: ${a}`);
    },
    async rows(select) {
      const r = await command(`rows ${select}`);
      if (!r.startsWith("rows ")) throw new Error(`query failed: ${r}`);
      return JSON.parse(r.slice(5));
    },
    async token(user, ttl = 3600) {
      const a = await command(`token ${user} ${ttl}`);
      return a.slice("token ".length);
    },
    async publish() {
      return command("publish");
    },
    /** The connection string of a login of the stack's database (`synchro_dev_adapter`, ...). */
    async database(login) {
      const a = await command(`database ${login}`);
      return a.slice("database ".length);
    },
    stop() {
      child.stdin.end();
      return new Promise((r) => child.on("exit", r));
    },
  };
}

function run(cmd, args, cwd) {
  execFileSync(cmd, args, { cwd, stdio: ["ignore", "inherit", "inherit"], env: process.env });
}

/**
 * A fresh Vite app in `dir` (removed first) from the template `app/`, with the tarball and
 * the Vite of this package's lock installed, built with `vite build`.
 */
export function buildApp(dir, tgz) {
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  for (const f of fs.readdirSync(path.join(NPM, "test/app"))) fs.copyFileSync(path.join(NPM, "test/app", f), path.join(dir, f));
  const vite = JSON.parse(fs.readFileSync(path.join(NPM, "node_modules/vite/package.json"))).version;
  fs.writeFileSync(
    path.join(dir, "package.json"),
    JSON.stringify({ name: "synchro-test-app", private: true, type: "module", dependencies: { "@synchro/client": `file:${tgz}`, vite } }, null, 2),
  );
  run("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error"], dir);
  run("npx", ["vite", "build", "--logLevel", "warn"], dir);
  return dir;
}

/** Gzipped bytes of every JS and wasm file a built app ships. */
export function shippedSize(dir) {
  let total = 0;
  const files = [];
  const walk = (d) => {
    for (const f of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, f.name);
      if (f.isDirectory()) walk(p);
      else if (/\.(m?js|wasm)$/.test(f.name)) {
        const gz = zlib.gzipSync(fs.readFileSync(p), { level: 9 }).length;
        files.push([path.relative(dir, p), gz]);
        total += gz;
      }
    }
  };
  walk(path.join(dir, "dist"));
  return { total, files };
}

/** `vite preview` of a built app with /sync proxied to `server`; resolves to its origin. */
export async function preview(dir, server) {
  const port = 20000 + Math.floor(Math.random() * 20000);
  const child = spawn("npx", ["vite", "preview", "--port", String(port), "--strictPort", "--host", "127.0.0.1"], {
    cwd: dir,
    env: { ...process.env, SYNCHRO_URL: server },
    stdio: ["ignore", "pipe", "inherit"],
    detached: true,
  });
  const origin = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 300; i++) {
    try {
      if ((await fetch(origin)).ok) break;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    origin,
    stop() {
      try {
        process.kill(-child.pid);
      } catch {}
    },
  };
}

/** Debian's Chromium, headless, with the flags this machine's closed network needs. */
export async function chromium() {
  const { chromium } = await import("playwright-core");
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}

/** Polls `fn` (in node) until it returns a truthy value; fails after `ms` with `what`. */
export async function until(what, fn, ms = 30000) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what} (last: ${last instanceof Error ? last.stack : JSON.stringify(last)})`);
}
