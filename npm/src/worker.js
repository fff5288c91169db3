// The dedicated worker of the leader tab: it alone opens the database on OPFS (the
// sync-access-handle pool), runs the live session, and answers the tabs' requests.
// Messages from the page: {id, method, args}; answers: {id, ok, value} or {id, ok: false,
// error}; events: {event: "status" | "changed" | "mutation" | "token", ...}.
import init, { SynchroClient } from "../wasm/synchro_client.js";

let client = null; // the SynchroClient while no live session holds it
let live = null; // the running LiveSession
let options = null;
let closing = false;
const tokenWaiters = new Map();
let nextToken = 0;
// What the worker last saw of each queued mutation's state, to report changes once.
const states = new Map();

const post = (m) => self.postMessage(m);

function errorOf(e) {
  return {
    code: (e && e.code) || "internal_error",
    message: (e && e.message) || String(e),
    retryable: Boolean(e && e.retryable),
    reason: e && e.reason,
    status: e && e.status,
  };
}

// The token provider the engine calls before every request: asks the page.
function token() {
  return new Promise((resolve, reject) => {
    const id = ++nextToken;
    tokenWaiters.set(id, { resolve, reject });
    post({ event: "token", id });
  });
}

const status = {
  phase: "starting",
  progress: null,
  lastSyncedAt: null,
  lastError: null,
  schema: { state: "fresh", version: 0, action: null },
  upgrade: null,
  pendingWrites: 0,
};

function publish(patch) {
  Object.assign(status, patch);
  post({ event: "status", status: { ...status } });
}

// The mutations whose state changed since the last look; reports each change once.
async function reportMutations() {
  const all = live ? await live.mutations() : client ? client.mutations() : [];
  let pending = 0;
  for (const m of all) {
    if (m.state === "pending") pending++;
    if (states.get(m.mutationId) !== m.state) {
      const first = !states.has(m.mutationId);
      states.set(m.mutationId, m.state);
      if (!(first && m.state === "pending")) post({ event: "mutation", mutation: m });
    }
  }
  return pending;
}

// Counts the session's status reports, so a round's end that took a while to read is not
// published over a later report.
let statusSeq = 0;

// A round ended (live or offline): publishes the pending writes and the schema it ended on,
// with `phasePatch` unless a later status was reported meanwhile (a live phase goes out with
// its round's schema, so a status that says connected never shows the schema of before).
async function afterRound(phasePatch, seq) {
  try {
    const pendingWrites = await reportMutations();
    const schema = live ? await live.schema() : client.schema();
    const patch = { pendingWrites, schema };
    if (phasePatch.phase === "live") Object.assign(patch, { lastSyncedAt: Date.now(), progress: null });
    publish(seq === statusSeq ? { ...phasePatch, ...patch } : patch);
  } catch {
    // The session ended meanwhile; its end reports.
  }
}

// Whether the token of the latest request was just asked of the app (not a cached one).
let freshToken = false;

// A failure that waiting will not cure, as phase "error" with a code the app can show: a
// 403, a 401 for a token the app just issued, or a server that answers but does not allow
// this page's origin (told apart from being offline by asking its /ready with and without
// CORS). The session keeps trying at its pace and leaves the phase once a round works.
async function configurationError(e) {
  if (e.status === 403) return { code: "forbidden", message: "the server refuses this user (403)" };
  if (e.status === 401 && freshToken) {
    return { code: "unauthorized", message: "the server refuses a freshly issued token (401): check the key, issuer and audience it expects" };
  }
  if (e.code !== "network_error") return null;
  const ready = options.url.replace(/\/+$/, "") + "/ready";
  const reaches = (init) => fetch(ready, { cache: "no-store", ...init }).then(() => true, () => false);
  if ((await reaches({})) || !(await reaches({ mode: "no-cors" }))) return null;
  return { code: "cors_refused", message: `the server answers but does not allow the origin ${self.location.origin} (its --cors-origin)` };
}

function startLive() {
  const c = client;
  client = null;
  live = c.startLive(options.live || {}, async (s) => {
    const seq = ++statusSeq;
    const patch = { phase: s.status };
    if (s.status === "offline") {
      patch.lastError = { ...s.error, retryInMs: s.retryInMs };
      const config = await configurationError(s.error);
      if (seq !== statusSeq) return;
      if (config) Object.assign(patch, { phase: "error", lastError: { ...config, status: s.error.status, retryable: false, retryInMs: s.retryInMs } });
    }
    if (s.status === "live") patch.lastError = null;
    if (s.status === "live") {
      afterRound(patch, seq);
    } else {
      publish(patch);
      if (s.status === "offline") afterRound({}, seq);
    }
  });
  live.done.then((d) => {
    live = null;
    client = d.client;
    if (closing) return;
    if (d.end === "upgrade_required") {
      publish({
        phase: "upgrade_required",
        schema: client.schema(),
        upgrade: {
          reason: d.reason,
          action:
            d.reason === "client_runtime"
              ? "The server needs a newer version of this app: reload it once a newer version is deployed."
              : "The server's schema changed in a way this app version cannot follow: load the new app version, then call requestSchemaReset().",
        },
      });
    } else if (d.end === "error") {
      publish({ phase: "error", lastError: errorOf(d.error), schema: client.schema() });
    } else {
      publish({ phase: "stopped" });
    }
  });
}

async function open(o) {
  options = o;
  await init();
  // A new leader may find the previous leader's OPFS handles not yet released (its tab is
  // closing): retry for a while before giving up.
  let last;
  for (let attempt = 0; attempt < 60; attempt++) {
    try {
      client = await SynchroClient.open(o.name, o.url, token, o.localMigrations || [], {
        clientVersion: o.clientVersion,
        opfsDirectory: o.opfsDirectory,
        seed: o.seed,
        schema: o.schema,
        conflicts: o.conflicts,
      });
      break;
    } catch (e) {
      last = e;
      if (e && e.code === "invalid_client_version") throw e;
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  if (!client) throw last;
  client.subscribe((tables) => post({ event: "changed", tables: [...tables] }));
  // A download under way is phase syncing (not connecting) with its rows and, for a rebuild,
  // the scope's total.
  client.onProgress((p) => {
    const patch = { progress: { phase: p.phase, scope: p.scope, pages: p.pages, rows: p.rows, totalRows: p.totalRows } };
    if (status.phase === "connecting" || status.phase === "starting") patch.phase = "syncing";
    publish(patch);
  });
  for (const m of client.mutations()) states.set(m.mutationId, m.state);
  publish({ seed: client.seedOutcome(), schema: client.schema(), pendingWrites: [...states.values()].filter((s) => s === "pending").length });
  if (client.state() === "upgrade_required") {
    publish({
      phase: "upgrade_required",
      upgrade: {
        reason: "schema_history",
        action: "Load the new app version, then call requestSchemaReset().",
      },
    });
  } else {
    startLive();
  }
}

// Before the first schema is installed the synced tables do not exist yet: a query naming one
// reads no rows (a live query runs again once they exist) instead of failing.
const beforeSchema = (e) => status.schema.version === 0 && /no such table/.test((e && e.message) || "");

// BigInt values go as strings (the wire form of int64 and decimal), a Date as its ISO text
// (the client pads it to the datetime's six digits); bytes as base64url.
function wire(v) {
  if (typeof v === "bigint") return v.toString();
  if (v instanceof Date) return v.toJSON(); // ISO text (null for an invalid Date)
  if (v instanceof Uint8Array) {
    let s = "";
    for (const b of v) s += String.fromCharCode(b);
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }
  if (v && typeof v === "object" && !Array.isArray(v)) {
    const o = {};
    for (const [k, x] of Object.entries(v)) o[k] = wire(x);
    return o;
  }
  return v;
}

const methods = {
  open,
  async query(sql, params) {
    try {
      return await (live ? live.query(sql, params || []) : ready().query(sql, params || []));
    } catch (e) {
      if (beforeSchema(e)) return [];
      throw e;
    }
  },
  async readTables(sql) {
    try {
      return await (live ? live.readTables(sql) : ready().readTables(sql));
    } catch (e) {
      if (beforeSchema(e)) return null; // a live query then runs again on every change
      throw e;
    }
  },
  async write(table, operation, key, values, mutationId) {
    const args = [table, operation, wire(key), values == null ? null : wire(values), mutationId];
    const id = live ? await live.write(...args) : ready().write(...args);
    // A re-sent write the queue held already (from this worker or the previous leader's,
    // whose queue states were read at open) is not counted again.
    if (!states.has(id)) {
      states.set(id, "pending");
      publish({ pendingWrites: status.pendingWrites + 1 });
    }
    return id;
  },
  async mutations() {
    return live ? live.mutations() : ready().mutations();
  },
  async clearResolved() {
    const cleared = live ? await live.clearResolved() : ready().clearResolved();
    // Each cleared mutation's last state is reported if it was not yet (one resolved by the
    // round in flight), then forgotten.
    for (const m of cleared) {
      if (states.get(m.mutationId) !== m.state) post({ event: "mutation", mutation: m });
      states.delete(m.mutationId);
    }
    publish({ pendingWrites: [...states.values()].filter((s) => s === "pending").length });
    return cleared.length;
  },
  async syncNow() {
    if (live) live.syncNow();
  },
  async requestSchemaReset() {
    if (live) throw Object.assign(new Error("the schema can only be reset while an upgrade is required"), { code: "invalid_state", retryable: false });
    ready().requestSchemaReset();
    publish({ phase: "connecting", upgrade: null });
    startLive();
  },
  async close() {
    closing = true;
    if (live) {
      live.stop();
      const d = await live.done;
      client = d.client;
      live = null;
    }
    if (client) client.free();
    client = null;
    publish({ phase: "stopped" });
  },
};

function ready() {
  if (!client) throw Object.assign(new Error("the database is not open"), { code: "not_open", retryable: true });
  return client;
}

self.onmessage = async (e) => {
  const m = e.data;
  if (m.tokenReply !== undefined) {
    const w = tokenWaiters.get(m.tokenReply);
    tokenWaiters.delete(m.tokenReply);
    freshToken = Boolean(m.fresh);
    if (w) m.error ? w.reject(new Error(m.error)) : w.resolve(m.token);
    return;
  }
  try {
    const fn = methods[m.method];
    if (!fn) throw Object.assign(new Error("no such method"), { code: "invalid_request" });
    post({ id: m.id, ok: true, value: await fn(...(m.args || [])) });
  } catch (err) {
    post({ id: m.id, ok: false, error: errorOf(err) });
  }
};
