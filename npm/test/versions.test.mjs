// Two versions of one app on one server, each in its own browser profile (its own OPFS),
// both holding writes queued offline while the server's schema changes under them: a
// Class 2 change (a nullable column, `replace`), then a Class 3 change (a column with
// values, `rebuild_local`). The old app never names the new columns; the new one writes
// them. Nothing queued may be lost and both must end on the server's rows.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { TARGET, tarball, startStack, buildApp, preview, chromium, until } from "./harness.mjs";

let stack, site, browser;
const apps = {}; // name -> { context, page }

before(async () => {
  stack = await startStack();
  await stack.sql(`INSERT INTO app.projects (id, name) VALUES ('p1', 'Launch');
    INSERT INTO app.tasks (id, project_id, title) SELECT 't' || lpad(g::text, 3, '0'), 'p1', 'seed ' || g FROM generate_series(1, 20) g`);
  const app = buildApp(path.join(TARGET, "npm-app-versions"), tarball());
  site = await preview(app, stack.url);
  browser = await chromium();
  // The old app (1.0.0, user alice) and the new one (2.0.0, user bob): two profiles.
  for (const [name, user, version] of [["old", "alice", "1.0.0"], ["new", "bob", "2.0.0"]]) {
    const context = await browser.newContext();
    await context.exposeFunction("mintToken", (u) => stack.token(u, 3600));
    const page = await context.newPage();
    page.on("console", (m) => m.type() === "error" && !/no such table/.test(m.text()) && console.log(`[${name}]`, m.text()));
    page.on("pageerror", (e) => console.log(`[${name} error]`, e.message));
    await page.goto(`${site.origin}/?user=${user}&v=${version}`);
    await page.waitForFunction(() => document.getElementById("state").textContent === "ready");
    apps[name] = { context, page };
  }
});

after(async () => {
  await browser?.close();
  site?.stop();
  await stack?.stop();
});

const status = (name) => apps[name].page.evaluate(() => window.client.status);
const pendingOf = (name) => apps[name].page.evaluate(() => window.client.status.pendingWrites);

async function offline(name) {
  const { context, page } = apps[name];
  await context.setOffline(true);
  await until(`${name} offline`, async () => {
    await page.evaluate(() => window.client.syncNow());
    return page.evaluate(() => window.client.status.offline);
  });
}

async function online(name) {
  await apps[name].context.setOffline(false);
  await apps[name].page.evaluate(() => window.client.syncNow());
}

/** Queues `writes` ([table, key, row or patch, "insert" | "update"]) and returns their IDs. */
const queue = (name, writes) =>
  apps[name].page.evaluate(
    (writes) => Promise.all(writes.map(([op, table, key, v]) => window.client[op](table, key, v))),
    writes,
  );

const outcomes = (name, ids) =>
  apps[name].page.evaluate((ids) => Promise.all(ids.map((id) => window.client.outcome(id))).then((m) => m.map((x) => x.state)), ids);

const NOW = "2026-12-02T08:00:00.000000Z";
const row = (title) => ({ project_id: "p1", title, done: false, assignee: null, position: 0, updated_at: NOW });

async function dump(name) {
  const p = apps[name].page;
  console.log(name, JSON.stringify(await p.evaluate(() => ({ status: window.client.status, last: window.statuses.slice(-8) })), null, 1));
}

test("both apps sync version 1", async () => {
  for (const name of ["old", "new"]) {
    await until(`${name}'s first sync`, async () => (await apps[name].page.evaluate(() => window.tasks?.length)) === 20);
    await until(`${name} live`, async () => (await status(name)).phase === "live");
    // (The schema in status follows the round's end: the worker asks the session for it.)
    await until(`${name} on version 1`, async () => (await status(name)).schema.version === 1);
  }
});

test("a Class 2 change while both hold offline writes: replace for both, every write applied", async () => {
  await offline("old");
  await offline("new");
  const oldIds = await queue("old", [["update", "tasks", "t001", { title: "old app, offline" }], ["insert", "tasks", "t101", row("old app insert")]]);
  const newIds = await queue("new", [["update", "tasks", "t002", { title: "new app, offline" }], ["insert", "tasks", "t102", row("new app insert")]]);
  assert.equal(await pendingOf("old"), 2);
  assert.equal(await pendingOf("new"), 2);

  await stack.sql(`BEGIN; ALTER TABLE app.tasks ADD COLUMN note text;
    SELECT synchro.synchro_reconfigure_relation('app', 'tasks'); COMMIT;`);
  assert.match(await stack.publish(), /^published 2 class_2$/);
  await stack.sql(`UPDATE app.tasks SET note = 'from the server' WHERE id = 't003'`);

  // The new app comes back first, installs version 2 and writes the new column.
  await online("new");
  await until("the new app on version 2", async () => {
    const s = await status("new");
    return s.schema.version === 2 && s.schema.action === "replace" && s.connected;
  }, 60000).catch(async (e) => (await dump("new"), Promise.reject(e)));
  assert.deepEqual(await outcomes("new", newIds), ["applied", "applied"]);
  const [v2] = await queue("new", [["update", "tasks", "t004", { note: "new app, v2" }]]);
  assert.deepEqual(await outcomes("new", [v2]), ["applied"]);
  assert.deepEqual(await apps.new.page.evaluate(() => window.client.query("SELECT note FROM tasks WHERE id = 't003'")), [{ note: "from the server" }]);

  // The old app, offline all along, comes back with its version-1 writes.
  await online("old");
  await until("the old app on version 2", async () => {
    const s = await status("old");
    return s.schema.version === 2 && s.schema.action === "replace" && s.connected;
  }, 60000).catch(async (e) => (await dump("old"), Promise.reject(e)));
  assert.deepEqual(await outcomes("old", oldIds), ["applied", "applied"]);
  // It has the new app's note (a column it never names) and writes as it always did; the
  // note stays.
  await until("the new app's note in the old app's copy", async () =>
    (await apps.old.page.evaluate(() => window.client.query("SELECT note FROM tasks WHERE id = 't004'")))[0]?.note === "new app, v2");
  const [later] = await queue("old", [["update", "tasks", "t004", { title: "old app, after v2" }]]);
  assert.deepEqual(await outcomes("old", [later]), ["applied"]);
  assert.deepEqual(await stack.rows(`SELECT id, title, note FROM app.tasks WHERE id IN ('t001', 't002', 't004', 't101', 't102') ORDER BY id`), [
    { id: "t001", title: "old app, offline", note: null },
    { id: "t002", title: "new app, offline", note: null },
    { id: "t004", title: "old app, after v2", note: "new app, v2" },
    { id: "t101", title: "old app insert", note: null },
    { id: "t102", title: "new app insert", note: null },
  ]);
  // Both converge on the server's rows, the new app's note included in the old app's copy.
  for (const name of ["old", "new"]) {
    await until(`${name} converged`, async () => {
      const local = await apps[name].page.evaluate(() => window.client.query("SELECT title, note FROM tasks WHERE id = 't004'"));
      return local[0]?.title === "old app, after v2" && local[0]?.note === "new app, v2";
    });
  }
});

test("a Class 3 change while both hold offline writes: rebuild_local for both, the queue kept", async () => {
  await offline("old");
  await offline("new");
  const oldIds = await queue("old", [["update", "tasks", "t005", { title: "old app, before v3" }]]);
  const newIds = await queue("new", [["update", "tasks", "t006", { note: "new app, before v3" }]]);

  await stack.sql(`BEGIN; ALTER TABLE app.tasks ADD COLUMN priority integer; UPDATE app.tasks SET priority = 7 WHERE id = 't007';
    SELECT synchro.synchro_reconfigure_relation('app', 'tasks'); COMMIT;`);
  assert.match(await stack.publish(), /^published 3 class_3$/);
  await stack.sql(`UPDATE app.tasks SET title = 'server after v3' WHERE id = 't008'`);

  for (const [name, ids] of [["new", newIds], ["old", oldIds]]) {
    await online(name);
    await until(`${name} on version 3`, async () => {
      const s = await status(name);
      return s.schema.version === 3 && s.schema.action === "rebuild_local" && s.connected;
    }, 60000).catch(async (e) => (await dump(name), Promise.reject(e)));
    assert.deepEqual(await outcomes(name, ids), ["applied"], `${name}'s queued write`);
    await until(`${name} rebuilt with the new column's values`, async () => {
      const r = await apps[name].page.evaluate(() => window.client.query("SELECT id, priority, title FROM tasks WHERE id IN ('t007', 't008') ORDER BY id"));
      return r[0]?.priority === 7 && r[1]?.title === "server after v3";
    });
    assert.equal(await pendingOf(name), 0);
  }
  assert.deepEqual(await stack.rows(`SELECT id, title, note FROM app.tasks WHERE id IN ('t005', 't006') ORDER BY id`), [
    { id: "t005", title: "old app, before v3", note: null },
    { id: "t006", title: "seed 6", note: "new app, before v3" },
  ]);
});
