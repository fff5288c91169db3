// End to end: the demo as two people use it. `synchro-server dev --fresh` (a throwaway PostgreSQL
// with the task board), the demo built with `vite build` and served by `vite preview`
// (/sync proxied to that server, /demo/token minting the users' tokens), and Debian's
// Chromium with one browser context per user (alice, bob), driven through the page only.
// The steps run in order on one server and one pair of pages; each waits for what it
// checks by polling with a deadline, never by sleeping. A screenshot of every state goes to
// $CARGO_TARGET_DIR/web-demo-artifacts/ (default target/), with the server's log.
//
// Needs: target/debug/synchro-server (cargo build -p synchro-server --bin synchro-server),
// npm/wasm/ (scripts/build-npm.sh), `npm install` here, /usr/bin/chromium and psql.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFile } from "node:child_process";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import net from "node:net";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

process.env.PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD = "1";
const run = promisify(execFile);

const DEMO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const ROOT = path.resolve(DEMO, "..");
const TARGET = path.resolve(ROOT, process.env.CARGO_TARGET_DIR || "target");
const SERVER_BIN = path.join(TARGET, "debug/synchro-server");
const ARTIFACTS = path.join(TARGET, "web-demo-artifacts");
const VITE = path.join(DEMO, "node_modules/vite/bin/vite.js");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

let server; // {origin, database, stop}
let site; // {origin, stop}
let browser;
const users = {}; // name -> {context, page, errors}

// --- helpers ---------------------------------------------------------------------------

/** Polls `fn` until it returns a truthy value; fails after `ms` naming `what`. */
async function until(what, fn, ms = 30000) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** Kills a detached child's process group: TERM, then KILL after `ms`. */
function stopGroup(child, ms = 15000) {
  if (!child || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {}
    }, ms);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
    try {
      process.kill(-child.pid, "SIGTERM");
    } catch {
      clearTimeout(timer);
      resolve();
    }
  });
}

/** `synchro-server dev` on a free port; resolves once it prints its addresses and is ready. */
async function startServer() {
  if (!fs.existsSync(SERVER_BIN)) {
    throw new Error(`${SERVER_BIN} is missing: build it first with \`cargo build -p synchro-server --bin synchro-server\``);
  }
  const port = await freePort();
  const log = fs.createWriteStream(path.join(ARTIFACTS, "server.log"));
  // Its own process group, so its PostgreSQL goes with it if it must be killed.
  const child = spawn(SERVER_BIN, ["dev", "--fresh", "--listen", `127.0.0.1:${port}`], { stdio: ["ignore", "pipe", "pipe"], detached: true, env: { ...process.env, NO_COLOR: "1" } });
  child.stderr.pipe(log);
  const printed = { origin: null, database: null };
  const exited = new Promise((_, reject) => child.once("exit", (code) => reject(new Error(`synchro-server dev exited (${code}) before it was ready: see ${path.join(ARTIFACTS, "server.log")}`))));
  exited.catch(() => {});
  createInterface({ input: child.stdout }).on("line", (line) => {
    log.write(`[stdout] ${line}\n`);
    const on = /^synchro dev server on (http:\/\/\S+)/.exec(line);
    if (on) printed.origin = on[1];
    const db = /^\s*database: (.+)$/.exec(line);
    if (db) printed.database = db[1].trim();
  });
  const stop = () => stopGroup(child);
  try {
    await Promise.race([
      exited,
      until(
        "synchro-server dev to print its address and database and answer GET /ready",
        async () => printed.origin && printed.database && (await fetch(`${printed.origin}/ready`)).ok,
        120000,
      ),
    ]);
  } catch (e) {
    await stop();
    throw e;
  }
  return { origin: printed.origin, database: printed.database, stop };
}

/** The database URL (a libpq connection string) as another login. */
const as = (user) => server.database.replace(/\buser=\S+/, `user=${user}`);

/** Runs SQL through psql as the server's admin login; resolves to its unaligned output. */
async function psql(sql) {
  const { stdout } = await run("psql", [server.database, "-v", "ON_ERROR_STOP=1", "-qAtX", "-c", sql]);
  return stdout.trim();
}

const dbTitle = (id) => psql(`SELECT title FROM app.tasks WHERE id = '${id}'`);

async function startPreview() {
  const port = await freePort();
  const child = spawn(process.execPath, [VITE, "preview", "--port", String(port), "--strictPort", "--host", "127.0.0.1"], {
    cwd: DEMO,
    env: { ...process.env, SYNCHRO_URL: server.origin },
    stdio: ["ignore", "pipe", "inherit"],
    detached: true,
  });
  child.stdout.resume();
  const origin = `http://127.0.0.1:${port}`;
  await until("vite preview to serve the demo", async () => (await fetch(origin)).ok, 30000);
  return { origin, stop: () => stopGroup(child, 5000) };
}

async function openBoard(user) {
  const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  // What the status bar showed as sync progress, as the person watching it saw it.
  await context.addInitScript(() => {
    window.__progressSeen = [];
    new MutationObserver(() => {
      const t = document.querySelector('[data-testid="status-progress"]')?.textContent;
      if (t && window.__progressSeen[window.__progressSeen.length - 1] !== t) window.__progressSeen.push(t);
    }).observe(document, { subtree: true, childList: true, characterData: true });
  });
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => {
    errors.push(e.message);
    console.log(`[${user} page error]`, e.message);
  });
  page.on("console", (m) => {
    // Requests failing while the context is offline are expected.
    if (m.type() === "error" && !/ERR_INTERNET_DISCONNECTED|Failed to load resource/.test(m.text())) console.log(`[${user}]`, m.text());
  });
  await page.goto(`${site.origin}/?user=${user}`);
  users[user] = { context, page, errors };
  return users[user];
}

const text = (page, id) => page.getByTestId(id).first().textContent();
const titles = (page) => page.getByTestId("task-title").allTextContents();
const taskRow = (page, id) => page.locator(`[data-testid="task"][data-id="${id}"]`);
const taskId = (page, title) => page.getByTestId("task").filter({ has: page.getByTestId("task-title").getByText(title, { exact: true }) }).getAttribute("data-id");
const connected = (page) => until("the page to be connected", async () => (await text(page, "status-connection")) === "connected");

async function rename(page, id, title) {
  const row = taskRow(page, id);
  await row.getByTestId("task-rename").click();
  await row.getByTestId("task-rename-input").fill(title);
  await row.getByTestId("task-rename-save").click();
}

async function shot(page, state) {
  await page.screenshot({ path: path.join(ARTIFACTS, `${state}.png`), fullPage: true });
}

// --- the stack -------------------------------------------------------------------------

const SEED = ["Write the press release", "Book the venue", "Order the cake"];

before(async () => {
  if (!fs.existsSync(VITE)) throw new Error(`${VITE} is missing: run \`npm install\` in ${DEMO}`);
  if (!fs.existsSync(path.join(ROOT, "npm/wasm/synchro_client_bg.wasm"))) throw new Error("npm/wasm/ is missing: run scripts/build-npm.sh");
  if (!fs.existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing (apt-get install chromium)`);
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  for (const f of fs.readdirSync(ARTIFACTS)) if (f.endsWith(".png")) fs.rmSync(path.join(ARTIFACTS, f));
  const building = run(process.execPath, [VITE, "build", "--logLevel", "warn"], { cwd: DEMO });
  server = await startServer();
  await building;
  // The board as it is in PostgreSQL before anyone opens it.
  await psql(`INSERT INTO app.projects (id, name, budget) VALUES ('p-launch', 'Launch', 12500.50), ('p-ops', 'Ops', NULL);
    INSERT INTO app.tasks (id, project_id, title, position) VALUES
      ('t-1', 'p-launch', '${SEED[0]}', 0), ('t-2', 'p-launch', '${SEED[1]}', 1), ('t-3', 'p-launch', '${SEED[2]}', 2),
      ('t-4', 'p-ops', 'Rotate the keys', 0)`);
  site = await startPreview();
  const { chromium } = await import("playwright-core");
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
});

after(async () => {
  await browser?.close();
  await site?.stop();
  await server?.stop();
});

// --- the steps -------------------------------------------------------------------------

test("the token endpoint mints tokens for alice and bob only", async () => {
  const ok = await fetch(`${site.origin}/demo/token?user=alice`);
  assert.equal(ok.status, 200);
  const { token } = await ok.json();
  const claims = JSON.parse(Buffer.from(token.split(".")[1], "base64url"));
  assert.equal(claims.sub, "alice");
  assert.ok(claims.exp > Date.now() / 1000 && claims.exp <= Date.now() / 1000 + 3600, `exp ${claims.exp}`);
  assert.equal((await fetch(`${site.origin}/demo/token?user=mallory`)).status, 400);
});

test("alice and bob both see the board", async () => {
  for (const user of ["alice", "bob"]) {
    const { page } = await openBoard(user);
    await connected(page);
    await until(`${user}'s board`, async () => JSON.stringify(await titles(page)) === JSON.stringify(SEED));
    assert.deepEqual(await page.getByTestId("project-name").allTextContents(), ["Launch", "Ops"]);
    assert.equal(await page.locator('[data-testid="user-picker"] [aria-current="page"]').textContent(), user);
    assert.notEqual(await text(page, "status-last-synced"), "never");
    assert.equal(await text(page, "status-pending"), "0");
    assert.equal(await text(page, "status-error"), "none");
    assert.equal(await text(page, "status-schema"), "v1");
    const seen = await page.evaluate(() => window.__progressSeen);
    assert.ok(seen.some((t) => /^\S+: \d+( of \d+)? rows$/.test(t)), `the status bar showed sync progress: ${JSON.stringify(seen)}`);
    await shot(page, `board-${user}`);
  }
});

test("alice and bob share one browser profile (a database each); alice's second tab goes through her first", async () => {
  const context = await browser.newContext();
  try {
    const pages = [];
    for (const user of ["alice", "bob", "alice"]) {
      const page = await context.newPage();
      page.on("pageerror", (e) => assert.fail(`${user}: ${e.message}`));
      await page.goto(`${site.origin}/?user=${user}`);
      pages.push(page);
    }
    for (const page of pages) {
      await connected(page);
      await until("the board", async () => JSON.stringify(await titles(page)) === JSON.stringify(SEED));
    }
    const holders = await Promise.all(pages.map((p) => p.getByText(/this tab holds the database|through another tab/).textContent()));
    assert.deepEqual(holders, ["this tab holds the database", "this tab holds the database", "through another tab"]);
    await shot(pages[2], "second-tab");
  } finally {
    await context.close();
  }
});

test("alice adds a task and bob sees it", async () => {
  const { alice, bob } = users;
  await alice.page.getByTestId("new-task-title").fill("Send the invitations");
  await alice.page.getByTestId("add-task").click();
  await until("bob to see alice's task", async () => (await titles(bob.page)).includes("Send the invitations"));
  const id = await taskId(bob.page, "Send the invitations");
  assert.equal(await psql(`SELECT project_id || ' ' || title || ' ' || done FROM app.tasks WHERE id = '${id}'`), "p-launch Send the invitations false");
  await until("alice's write to be answered", async () => (await text(alice.page, "status-pending")) === "0");
  await shot(bob.page, "task-added");
});

test("alice edits offline: the writes wait, then converge when she is back online", async () => {
  const { alice, bob } = users;
  await alice.context.setOffline(true);
  await taskRow(alice.page, "t-2").getByTestId("task-done").click();
  await rename(alice.page, "t-1", "Write the launch post");
  await until("alice's two writes to be pending while offline", async () => (await text(alice.page, "status-pending")) === "2" && (await text(alice.page, "status-connection")) === "offline");
  // Her page shows her edits at once; the server and bob have none of them.
  // (The live query re-renders just after the pending count changes: wait for it.)
  await until("alice's edits on her page", async () => (await taskRow(alice.page, "t-2").getAttribute("data-done")) === "true" && (await taskRow(alice.page, "t-1").getByTestId("task-title").textContent()) === "Write the launch post");
  assert.equal(await psql("SELECT title || ' ' || (SELECT done FROM app.tasks WHERE id = 't-2') FROM app.tasks WHERE id = 't-1'"), `${SEED[0]} false`);
  assert.equal(await taskRow(bob.page, "t-1").getByTestId("task-title").textContent(), SEED[0]);
  assert.equal(await text(alice.page, "status-error"), "network_error");
  await shot(alice.page, "offline-pending");

  await alice.context.setOffline(false);
  await until("alice to be back online with nothing pending", async () => (await text(alice.page, "status-pending")) === "0" && (await text(alice.page, "status-connection")) === "connected");
  assert.equal(await psql("SELECT title || ' ' || (SELECT done FROM app.tasks WHERE id = 't-2') FROM app.tasks WHERE id = 't-1'"), "Write the launch post true");
  await until("bob to see alice's offline edits", async () => (await taskRow(bob.page, "t-1").getByTestId("task-title").textContent()) === "Write the launch post" && (await taskRow(bob.page, "t-2").getAttribute("data-done")) === "true");
  assert.equal(await alice.page.getByTestId("issue").count(), 0, "no conflict or rejection");
  await shot(alice.page, "online-converged");
});

test("bob's offline rename of a task alice renamed meanwhile is a conflict, shown in his panel", async () => {
  const { alice, bob } = users;
  await bob.context.setOffline(true);
  await rename(bob.page, "t-3", "Order a bigger cake");
  await until("bob's rename to be pending while offline", async () => (await text(bob.page, "status-pending")) === "1" && (await text(bob.page, "status-connection")) === "offline");
  await rename(alice.page, "t-3", "Order two cakes");
  await until("alice's rename to reach PostgreSQL", async () => (await dbTitle("t-3")) === "Order two cakes");

  await bob.context.setOffline(false);
  const issue = bob.page.locator('[data-testid="issue"][data-key="t-3"]');
  await until("bob's conflict in his panel", () => issue.count());
  assert.equal(await issue.getAttribute("data-state"), "conflict");
  assert.match(await issue.textContent(), /rename "Order the cake" to "Order a bigger cake"/);
  // His write was not applied: his board shows the server's row again, as does the panel.
  await until("bob's board to show alice's title", async () => (await taskRow(bob.page, "t-3").getByTestId("task-title").textContent()) === "Order two cakes");
  assert.equal(await issue.getByTestId("issue-now").textContent(), "Order two cakes");
  assert.equal(await dbTitle("t-3"), "Order two cakes");
  await until("bob to have nothing pending", async () => (await text(bob.page, "status-pending")) === "0");
  assert.equal(await alice.page.getByTestId("issue").count(), 0, "alice's write was applied");
  await shot(bob.page, "conflict");
});

test("a title longer than the server's CHECK allows is rejected for good, shown in the panel", async () => {
  const { alice, bob } = users;
  const long = "An overly long title ".repeat(12).trim(); // 251 characters; the limit is 200
  await rename(alice.page, "t-2", long);
  const issue = alice.page.locator('[data-testid="issue"][data-key="t-2"]');
  await until("alice's rejected write in her panel", () => issue.count());
  assert.equal(await issue.getAttribute("data-state"), "rejected_terminal");
  assert.equal(await issue.getAttribute("data-code"), "constraint_violation");
  // The local row returns to what the server has; nothing of it reached PostgreSQL or bob.
  await until("alice's board to show the server's title again", async () => (await taskRow(alice.page, "t-2").getByTestId("task-title").textContent()) === SEED[1]);
  assert.equal(await dbTitle("t-2"), SEED[1]);
  assert.equal(await taskRow(bob.page, "t-2").getByTestId("task-title").textContent(), SEED[1]);
  await until("alice to have nothing pending", async () => (await text(alice.page, "status-pending")) === "0");
  await shot(alice.page, "rejected");
});

test("alice adds a project with a budget and deletes a task; bob sees both", async () => {
  const { alice, bob } = users;
  await alice.page.getByTestId("new-project-name").fill("Marketing");
  await alice.page.getByTestId("new-project-budget").fill("2500.50");
  await alice.page.getByTestId("add-project").click();
  await until("bob to see alice's project", async () => JSON.stringify(await bob.page.getByTestId("project-name").allTextContents()) === JSON.stringify(["Launch", "Marketing", "Ops"]));
  // The typed budget went as canonical decimal text into numeric(12,2).
  assert.equal(await psql("SELECT budget FROM app.projects WHERE name = 'Marketing'"), "2500.50");
  assert.equal(await alice.page.locator('[data-testid="project"].selected [data-testid="project-name"]').textContent(), "Marketing");

  await alice.page.getByTestId("project").filter({ hasText: "Launch" }).click();
  const id = await taskId(alice.page, "Send the invitations");
  await taskRow(alice.page, id).getByTestId("task-delete").click();
  await until("bob to see the task gone", async () => !(await titles(bob.page)).includes("Send the invitations"));
  assert.equal(await psql(`SELECT count(*) FROM app.tasks WHERE id = '${id}'`), "0");
  // Alice's own board can show her delete after bob's does: a live session runs the app's
  // queries between two rounds, not during one (see the closing note of 2026-12-02).
  await until("both boards alike", async () => JSON.stringify(await titles(alice.page)) === JSON.stringify(await titles(bob.page)));
  await shot(bob.page, "project-added-task-deleted");
});

test("an incompatible schema change stops both boards until each installs the new schema", async () => {
  const { alice, bob } = users;
  // Retiring a synced field is Class 4: clients on the old schema cannot follow it.
  const { stdout } = await run(SERVER_BIN, ["registry", "reconfigure", "--database-url", as("synchro_dev_operator"), "--schema", "app", "--relation", "tasks", "--retire", "assignee"]);
  const plan = JSON.parse(stdout);
  assert.equal(plan.class, "class_4", stdout);
  assert.equal(plan.schema_version, 2, stdout);
  // No row changes: the server ends the boards' events streams with `schema_changed` and
  // each connects at once (well before its 30 s safety poll).
  for (const { page } of [alice, bob]) {
    await until("the upgrade banner", async () => (await page.getByTestId("upgrade-banner").count()) === 1, 20000);
    assert.equal(await text(page, "status-phase"), "upgrade_required");
    assert.match(await text(page, "upgrade-action"), /requestSchemaReset\(\)/);
    // The local data stays readable while stopped.
    assert.ok((await titles(page)).includes("Write the launch post"));
  }
  await shot(alice.page, "upgrade-required");

  await alice.page.getByTestId("upgrade-reset").click();
  await until("alice's board to be live on schema v2", async () => (await text(alice.page, "status-phase")) === "live" && (await text(alice.page, "status-schema")) === "v2");
  assert.equal(await alice.page.getByTestId("upgrade-banner").count(), 0);
  await until("alice's rebuilt board", async () => (await titles(alice.page)).includes("Order two cakes"));
  // She writes again; bob, still on the old schema, has not reset yet.
  await alice.page.getByTestId("new-task-title").fill("After the upgrade");
  await alice.page.getByTestId("add-task").click();
  await until("alice's task to reach PostgreSQL", async () => (await psql("SELECT count(*) FROM app.tasks WHERE title = 'After the upgrade'")) === "1");
  assert.equal(await text(bob.page, "status-phase"), "upgrade_required");
  assert.ok(!(await titles(bob.page)).includes("After the upgrade"));
  await shot(alice.page, "upgraded");

  await bob.page.getByTestId("upgrade-reset").click();
  await until("bob's board on schema v2 with alice's new task", async () => (await text(bob.page, "status-schema")) === "v2" && (await text(bob.page, "status-phase")) === "live" && (await titles(bob.page)).includes("After the upgrade"));
  await shot(bob.page, "upgraded-bob");
});

test("no page error in either board", () => {
  for (const [user, { errors }] of Object.entries(users)) assert.deepEqual(errors, [], `${user}'s page errors`);
});
