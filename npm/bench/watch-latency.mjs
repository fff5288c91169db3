// Benchmark: from a server commit to the `watch` callback in the browser that shows it.
// The test app (test/app, built from the packed tarball) in headless Chromium against the
// real server on real PostgreSQL (test/harness.mjs). Prints p50/p99 in milliseconds; asserts
// nothing. `node bench/watch-latency.mjs [commits=100]`.
import path from "node:path";
import { TARGET, tarball, startStack, buildApp, preview, chromium, until } from "../test/harness.mjs";

const commits = Number(process.argv[2] || 100);
const stack = await startStack();
await stack.sql(`INSERT INTO app.projects (id, name) VALUES ('p1', 'Bench')`);
const app = buildApp(path.join(TARGET, "npm-bench-app"), tarball());
const site = await preview(app, stack.url);
const browser = await chromium();
try {
  const context = await browser.newContext();
  await context.exposeFunction("mintToken", (user) => stack.token(user, 3600));
  const page = await context.newPage();
  await page.goto(`${site.origin}/`);
  await until("the first sync", () => page.evaluate(() => window.client?.status.connected && window.tasks !== null), 60000);
  await page.evaluate(() => window.client.onChange(() => (window.changedAt = performance.timeOrigin + performance.now())));
  const latencies = [];
  const changed = [];
  for (let i = 0; i < commits; i++) {
    const id = `b${String(i).padStart(5, "0")}`;
    await stack.sql(`INSERT INTO app.tasks (id, project_id, title) VALUES ('${id}', 'p1', 'bench ${i}')`);
    const committed = Date.now(); // the COMMIT was acknowledged just before
    await until(`commit ${i} in the live query`, () => page.evaluate((id) => window.tasks.some((t) => t.id === id), id), 30000);
    const [shown, ch] = await page.evaluate(() => [window.taskDeliveredAt, window.changedAt]);
    latencies.push(shown - committed);
    changed.push(ch - committed);
  }
  latencies.sort((a, b) => a - b);
  changed.sort((a, b) => a - b);
  if (process.env.DEBUG) console.log("changed p50", changed[changed.length >> 1]);
  const at = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))];
  console.log(`commit -> watch callback, ${commits} commits one at a time (Chromium, vite preview proxy):`);
  console.log(`  p50 ${at(0.5).toFixed(1)} ms   p99 ${at(0.99).toFixed(1)} ms   min ${latencies[0].toFixed(1)} ms   max ${latencies.at(-1).toFixed(1)} ms`);
} finally {
  await browser.close();
  site.stop();
  await stack.stop();
}
