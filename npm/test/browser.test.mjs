// The package as an app meets it: a fresh Vite app installs the packed tarball, `vite build`
// builds it, and headless Chromium runs it against the real server on real PostgreSQL
// (harness.mjs). One stack and one build for all the steps, which run in order.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { TARGET, tarball, startStack, buildApp, shippedSize, preview, chromium, until } from "./harness.mjs";

let stack, app, site, browser, context;
// The lifetime of the tokens the test's pages get (seconds); a step shortens it.
let ttl = 3600;
const minted = [];

before(async () => {
  stack = await startStack();
  await stack.sql(`INSERT INTO app.projects (id, name) VALUES ('p1', 'Launch'), ('p2', 'Ops');
    INSERT INTO app.tasks (id, project_id, title) SELECT 't' || lpad(g::text, 3, '0'), 'p1', 'seed ' || g FROM generate_series(1, 50) g`);
  app = buildApp(path.join(TARGET, "npm-app"), tarball());
  site = await preview(app, stack.url);
  browser = await chromium();
  context = await browser.newContext();
  await context.exposeFunction("mintToken", async (user) => {
    const t = await stack.token(user, ttl);
    minted.push({ user, ttl });
    return t;
  });
});

after(async () => {
  await browser?.close();
  site?.stop();
  await stack?.stop();
});

async function open(query = "") {
  const page = await context.newPage();
  page.on("console", (m) => m.type() === "error" && !/no such table/.test(m.text()) && console.log("[page]", m.text()));
  page.on("response", (r) => r.status() >= 400 && console.log("[page] HTTP", r.status(), new URL(r.url()).pathname));
  page.on("pageerror", (e) => console.log("[page error]", e.message));
  await page.goto(`${site.origin}/${query}`);
  await page.waitForFunction(() => document.getElementById("state").textContent === "ready");
  return page;
}

const tasksOf = (page) => page.evaluate(() => window.tasks && window.tasks.map((t) => t.id));

let a; // the first tab

test("the built app ships at most 600 KB gzipped of JS and wasm", () => {
  const { total, files } = shippedSize(app);
  for (const [f, gz] of files) console.log(`  ${f}: ${(gz / 1024).toFixed(1)} KiB gzipped`);
  console.log(`  JS + wasm shipped: ${(total / 1024).toFixed(1)} KiB gzipped (budget 600 KB)`);
  assert.ok(files.some(([f]) => f.endsWith(".wasm")), "the wasm is an asset of the build");
  assert.ok(total <= 600 * 1000, `${total} bytes gzipped`);
});

test("a fresh tab syncs the board and its live query shows it", async () => {
  a = await open();
  await until("the first sync", () => a.evaluate(() => window.client.status.connected)).catch(async (e) => {
    console.log(JSON.stringify(await a.evaluate(() => window.statuses), null, 1));
    throw e;
  });
  await until("the seeded tasks", async () => (await tasksOf(a))?.length === 50);
  const s = await a.evaluate(() => window.client.status);
  assert.equal(s.leader, true);
  assert.equal(s.schema.version, 1);
  assert.ok(s.lastSyncedAt > 0);
  const progress = await a.evaluate(() => window.statuses.filter((x) => x.progress).map((x) => x.progress.phase));
  assert.ok(progress.length > 0, "progress was reported while syncing");
});

test("a server commit reaches the live query; a query reading another table is not delivered again", async () => {
  const before = await a.evaluate(() => ({ t: window.taskDeliveries, p: window.projectDeliveries }));
  await stack.sql(`INSERT INTO app.tasks (id, project_id, title) VALUES ('t100', 'p2', 'from the server')`);
  await until("the server's task", async () => (await tasksOf(a))?.includes("t100"));
  const after = await a.evaluate(() => ({ t: window.taskDeliveries, p: window.projectDeliveries }));
  assert.equal(after.t, before.t + 1, "one delivery for one commit");
  assert.equal(after.p, before.p, "the projects query got nothing: its result did not change");
  await stack.sql(`UPDATE app.projects SET name = 'Launch!' WHERE id = 'p1'`);
  await until("the renamed project", () => a.evaluate(() => window.projects?.find((p) => p.id === "p1")?.name === "Launch!"));
  assert.equal(await a.evaluate(() => window.taskDeliveries), after.t, "the tasks query got nothing");
});
