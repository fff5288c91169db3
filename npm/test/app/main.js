// The test app: a client over the database named by ?db= (default "board"), with its
// tokens from the test (window.mintToken, exposed by Playwright), and two live queries.
import { createClient, SynchroError } from "@synchro/client";

const q = new URLSearchParams(location.search);
window.tokenAsks = 0;
const client = createClient({
  // ?url=: the server itself, from another origin than the page (CORS).
  url: q.get("url") || "/",
  name: q.get("db") || "board",
  token: async () => {
    window.tokenAsks++;
    // ?token=: exactly this token (one the server refuses).
    return q.get("token") || window.mintToken(q.get("user") || "alice");
  },
  // No safety poll within a test: every change must arrive through the events stream.
  clientVersion: q.get("v") || undefined,
  // ?seed=/seeds/<name>: a new database starts from that portable seed.
  seed: q.get("seed") || undefined,
  // ?bundled=1: the manifest the test put in window.bundledSchema, as an app bundles it.
  schema: q.get("bundled") ? window.bundledSchema : undefined,
  // ?conflicts=rebase_disjoint: the opt-in conflict policy.
  conflicts: q.get("conflicts") || undefined,
  live: { backoffMinMs: 200, backoffMaxMs: 1000, safetyPollMs: 600000 },
});
window.client = client;
window.SynchroError = SynchroError;
window.statuses = [];
client.onStatus((s) => window.statuses.push(s));
window.mutationEvents = [];
client.onMutation((m) => window.mutationEvents.push(m));
window.tasks = null;
window.taskDeliveries = 0;
client.watch("SELECT id, title, done FROM tasks ORDER BY id", [], (rows) => {
  window.tasks = rows;
  window.taskDeliveries++;
  window.taskDeliveredAt = performance.timeOrigin + performance.now();
});
// A live query with a parameter.
window.p2Tasks = null;
client.watch("SELECT id FROM tasks WHERE project_id = ? ORDER BY id", ["p2"], (rows) => (window.p2Tasks = rows.map((r) => r.id)), (e) => (window.p2Error = e.code));
window.projects = null;
window.projectDeliveries = 0;
client.watch("SELECT id, name FROM projects ORDER BY id", [], (rows) => {
  window.projects = rows;
  window.projectDeliveries++;
});
document.getElementById("state").textContent = "ready";
