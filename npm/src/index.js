// @synchro/client: the main-thread API. One tab of the origin (elected with Web Locks)
// runs the dedicated worker that holds the database on OPFS; every other tab reaches it
// over a BroadcastChannel. Leadership moves when the leader's tab closes; requests it had
// not answered are sent again to the next leader.

/** Every failure: a stable `code` and whether trying again can help. */
export class SynchroError extends Error {
  constructor({ code, message, retryable, reason, status }) {
    super(message || code);
    this.name = "SynchroError";
    this.code = code || "internal_error";
    this.retryable = Boolean(retryable);
    if (reason) this.reason = reason;
    if (status) this.status = status;
  }
}

const TERMINAL = new Set(["applied", "conflict", "rejected_terminal"]);

function fail(code, message, retryable = false) {
  return new SynchroError({ code, message, retryable });
}

/** A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, the version, the variant, randomness. */
function uuidv7() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  let ms = Date.now();
  for (let i = 5; i >= 0; i--) {
    b[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  b[6] = 0x70 | (b[6] & 0x0f);
  b[8] = 0x80 | (b[8] & 0x3f);
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** Creates the client for the database `name` (one per name per origin; tabs share it). */
export function createClient(options) {
  return new SynchroClient(options);
}

function same(a, b) {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== "object") return false;
  if (a instanceof Uint8Array || b instanceof Uint8Array) {
    if (!(a instanceof Uint8Array && b instanceof Uint8Array) || a.length !== b.length) return false;
    return a.every((x, i) => x === b[i]);
  }
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => same(a[k], b[k]));
}

function derived(s, leader) {
  return Object.freeze({
    ...s,
    connected: s.phase === "live",
    syncing: s.phase === "connecting" || s.phase === "syncing" || s.progress !== null,
    offline: s.phase === "offline",
    leader,
  });
}

class SynchroClient {
  constructor(options = {}) {
    const { url, token, name = "synchro", localMigrations = [], clientVersion, live, seed, schema, conflicts } = options;
    if (typeof url !== "string") throw fail("invalid_request", "createClient: url must be a string");
    if (typeof token !== "function") throw fail("invalid_request", "createClient: token must be a function returning a token (or a promise of one)");
    if (typeof name !== "string" || name === "") throw fail("invalid_request", "createClient: name must be a non-empty string");
    if (seed !== undefined && seed !== null && typeof seed !== "string") throw fail("invalid_request", "createClient: seed must be the URL of a portable seed");
    if (typeof navigator === "undefined" || !navigator.locks || typeof BroadcastChannel === "undefined") {
      throw fail("unsupported_browser", "this browser lacks Web Locks or BroadcastChannel");
    }
    this._open = {
      name: `${name}.db`,
      // Each database's worker holds its own OPFS pool (a pool is exclusive to one worker).
      opfsDirectory: `.synchro-${encodeURIComponent(name)}`,
      url: new URL(url, globalThis.location ? location.href : undefined).href,
      localMigrations,
      clientVersion,
      live,
      // A portable seed for a new database, absolute like the server's URL.
      seed: seed ? new URL(seed, globalThis.location ? location.href : undefined).href : undefined,
      // The app's bundled manifest (synchro-server codegen manifest) for a new database.
      schema,
      conflicts,
    };
    this._tokenFn = token;
    this._token = null;
    this._tokenAt = 0; // when the cached token was asked for
    this._tab = crypto.randomUUID();
    this._leader = null; // the leader tab's ID, once known
    this._worker = null; // ours, while we lead
    this._workerReady = false;
    this._pending = new Map(); // request id -> {method, args, resolve, reject, sentTo}
    this._nextId = 0;
    this._workerCalls = new Map(); // worker request id -> answer(message)
    this._nextWorkerId = 0;
    this._statusListeners = new Set();
    this._mutationListeners = new Set();
    this._changeListeners = new Set();
    this._watches = new Set();
    this._closed = false;
    this._raw = {
      phase: "starting",
      progress: null,
      lastSyncedAt: null,
      lastError: null,
      schema: { state: "fresh", version: 0, action: null },
      upgrade: null,
      pendingWrites: 0,
      seed: null,
    };
    this._status = derived(this._raw, false);
    this._channel = new BroadcastChannel(`synchro:${name}`);
    this._channel.onmessage = (e) => this._onChannel(e.data);
    this._abort = new AbortController();
    navigator.locks
      .request(`synchro:${name}`, { signal: this._abort.signal }, () => this._lead())
      .catch(() => {});
    this._channel.postMessage({ kind: "hello", from: this._tab });
    this._onOnline = () => this.syncNow().catch(() => {});
    globalThis.addEventListener?.("online", this._onOnline);
    this._onHide = () => {
      if (this._worker) this._channel.postMessage({ kind: "bye", id: this._tab });
    };
    globalThis.addEventListener?.("pagehide", this._onHide);
  }

  /** The current status (a new frozen object on every change). */
  get status() {
    return this._status;
  }

  /** Calls `callback(status)` now and on every change; returns the unsubscribe function. */
  onStatus(callback) {
    this._statusListeners.add(callback);
    callback(this._status);
    return () => this._statusListeners.delete(callback);
  }

  /** Calls `callback(mutation)` when a queued mutation's state changes. */
  onMutation(callback) {
    this._mutationListeners.add(callback);
    return () => this._mutationListeners.delete(callback);
  }

  /** A mutation the server answered with a conflict (the local write was not applied). */
  onConflict(callback) {
    return this.onMutation((m) => m.state === "conflict" && callback(m));
  }

  /** A mutation the server refused for good (authorization, validation). */
  onRejected(callback) {
    return this.onMutation((m) => m.state === "rejected_terminal" && callback(m));
  }

  /** Calls `callback(tables)` with the names of the tables each committed change touched. */
  onChange(callback) {
    this._changeListeners.add(callback);
    return () => this._changeListeners.delete(callback);
  }

  /** Runs a read-only query; resolves to the rows as objects keyed by column name. */
  query(sql, params = []) {
    return this._call("query", [sql, params]);
  }

  /**
   * A live query: `callback(rows)` with the first result, then again whenever a table the
   * query reads changed and the result differs. Returns the function that stops it.
   */
  watch(sql, params, callback, onError) {
    if (typeof params === "function") [params, callback, onError] = [[], params, callback];
    const w = { sql, params: params || [], callback, onError, tables: undefined, last: undefined, running: false, again: false, stopped: false };
    this._watches.add(w);
    this._run(w);
    return () => {
      w.stopped = true;
      this._watches.delete(w);
    };
  }

  // Each write carries its mutation ID, chosen here: a request re-sent to the next leader
  // (its first one closed, maybe after committing it) is then queued at most once.

  /** Queues a local insert; resolves to the mutation ID once it is durable. */
  insert(table, key, values) {
    return this._call("write", [table, "insert", key, values ?? {}, uuidv7()]);
  }

  /** Queues a local update of the given fields; resolves to the mutation ID. */
  update(table, key, values) {
    return this._call("write", [table, "update", key, values ?? {}, uuidv7()]);
  }

  /** Queues a local delete; resolves to the mutation ID. */
  delete(table, key) {
    return this._call("write", [table, "delete", key, null, uuidv7()]);
  }

  /** Every queued mutation in local order, with its state and the server's outcome. */
  mutations() {
    return this._call("mutations", []);
  }

  /**
   * Resolves when the mutation reached a final state (applied, conflict, rejected_terminal);
   * rejects with `unknown_mutation` when the queue has no such mutation.
   */
  async outcome(mutationId) {
    const done = new Promise((resolve, reject) => {
      const stop = this.onMutation((m) => {
        if (m.mutationId === mutationId && TERMINAL.has(m.state)) {
          stop();
          resolve(m);
        }
      });
      this.mutations().then(
        (all) => {
          const m = all.find((x) => x.mutationId === mutationId);
          if (!m) {
            stop();
            reject(fail("unknown_mutation", "no queued mutation has this ID"));
          } else if (TERMINAL.has(m.state)) {
            stop();
            resolve(m);
          }
        },
        (e) => {
          stop();
          reject(e);
        },
      );
    });
    return done;
  }

  /**
   * Clears every resolved mutation (applied, conflict, rejected_terminal) and its outcome from
   * the local queue; resolves to how many. Pending writes stay. The queue keeps resolved ones
   * for inspection until this is called.
   */
  clearResolved() {
    return this._call("clearResolved", []);
  }

  /** Asks for a sync round now (also done when the browser comes back online). */
  syncNow() {
    return this._call("syncNow", []);
  }

  /**
   * While `status.phase` is `upgrade_required` because of the schema's history, after the
   * app was upgraded: install the server's current schema and rebuild (queued writes and
   * local-only tables are kept).
   */
  requestSchemaReset() {
    return this._call("requestSchemaReset", []);
  }

  /** Stops syncing in this tab (the next tab takes over the database, if any). */
  async close() {
    if (this._closed) return;
    this._closed = true;
    globalThis.removeEventListener?.("online", this._onOnline);
    globalThis.removeEventListener?.("pagehide", this._onHide);
    this._watches.clear();
    if (this._worker) {
      await new Promise((resolve) => this._toWorker("close", [], resolve));
      this._worker.terminate();
      this._worker = null;
      this._channel.postMessage({ kind: "bye", id: this._tab });
      this._release?.();
    }
    this._abort.abort();
    this._channel.close();
    for (const p of this._pending.values()) p.reject(fail("closed", "the client was closed"));
    this._pending.clear();
  }

  // --- requests ---------------------------------------------------------------------

  _call(method, args) {
    if (this._closed) return Promise.reject(fail("closed", "the client was closed"));
    return new Promise((resolve, reject) => {
      const id = ++this._nextId;
      const p = { method, args, resolve, reject, sentTo: null };
      this._pending.set(id, p);
      this._dispatch(id, p);
    });
  }

  _answer(id, m) {
    const p = this._pending.get(id);
    if (!p) return;
    this._pending.delete(id);
    if (m.ok) p.resolve(m.value);
    else p.reject(new SynchroError(m.error));
  }

  _dispatch(id, p) {
    if (this._worker && this._workerReady) {
      p.sentTo = this._tab;
      this._toWorker(p.method, p.args, (m) => this._answer(id, m));
    } else if (this._leader && this._leader !== this._tab) {
      p.sentTo = this._leader;
      this._channel.postMessage({ kind: "req", to: this._leader, from: this._tab, id, method: p.method, args: p.args });
    }
    // Otherwise it waits for a leader (see _newLeader).
  }

  _newLeader(id) {
    this._leader = id;
    for (const [rid, p] of this._pending) if (p.sentTo !== id) this._dispatch(rid, p);
  }

  _toWorker(method, args, answer) {
    const id = ++this._nextWorkerId;
    this._workerCalls.set(id, answer);
    this._worker.postMessage({ id, method, args });
  }

  // --- leadership ---------------------------------------------------------------------

  async _lead() {
    if (this._closed) return;
    // Written out in full so bundlers (Vite, webpack 5) see and bundle the worker.
    const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module", name: "synchro" });
    this._worker = worker;
    worker.onmessage = (e) => this._onWorker(e.data);
    worker.onerror = (e) => {
      this._setStatus({ phase: "error", lastError: { code: "worker_failed", message: e.message || "the synchro worker failed to start", retryable: false } });
    };
    const opened = await new Promise((resolve) => this._toWorker("open", [this._open], resolve));
    if (!opened.ok) {
      this._setStatus({ phase: "error", lastError: opened.error });
      for (const [rid, p] of this._pending) {
        this._pending.delete(rid);
        p.reject(new SynchroError(opened.error));
      }
    } else {
      this._workerReady = true;
    }
    this._channel.postMessage({ kind: "leader", id: this._tab, status: this._raw });
    this._newLeader(this._tab);
    // Hold the lock until this client closes (or the tab goes away).
    await new Promise((resolve) => (this._release = resolve));
  }

  _onWorker(m) {
    if (m.event === undefined) {
      const answer = this._workerCalls.get(m.id);
      this._workerCalls.delete(m.id);
      answer?.(m);
      return;
    }
    if (m.event === "token") {
      const fresh = this._token === null;
      this._getToken().then(
        (token) => this._worker?.postMessage({ tokenReply: m.id, token, fresh }),
        (e) => this._worker?.postMessage({ tokenReply: m.id, error: String(e?.message || e) }),
      );
      return;
    }
    this._onEvent(m);
    this._channel.postMessage({ kind: "event", ...m });
  }

  async _getToken() {
    if (this._token === null) {
      const t = await this._tokenFn();
      if (typeof t !== "string") throw fail("invalid_token", "the token function must return a string");
      this._token = t;
      this._tokenAt = Date.now();
    }
    return this._token;
  }

  _onChannel(m) {
    if (this._closed) return;
    const leading = this._worker !== null;
    switch (m.kind) {
      case "hello":
        if (leading && this._workerReady) this._channel.postMessage({ kind: "leader", id: this._tab, status: this._raw });
        break;
      case "leader":
        if (!leading) {
          this._setStatus(m.status);
          this._newLeader(m.id);
        }
        break;
      case "bye":
        if (m.id === this._leader) this._leader = null;
        break;
      case "req":
        if (leading && m.to === this._tab) {
          const reply = (a) => this._channel.postMessage({ kind: "res", to: m.from, id: m.id, ok: a.ok, value: a.value, error: a.error });
          if (this._workerReady) this._toWorker(m.method, m.args, reply);
          else reply({ ok: false, error: { code: "not_open", message: "the database did not open", retryable: true } });
        }
        break;
      case "res":
        if (m.to === this._tab) this._answer(m.id, m);
        break;
      case "event":
        if (!leading) this._onEvent(m);
        break;
    }
  }

  // --- events -------------------------------------------------------------------------

  _onEvent(m) {
    if (m.event === "status") this._setStatus(m.status);
    else if (m.event === "changed") this._changed(m.tables);
    else if (m.event === "mutation") for (const f of this._mutationListeners) f(m.mutation);
  }

  _setStatus(raw) {
    const before = this._raw;
    this._raw = { ...before, ...raw };
    // Ask again after a 401, but at most once per 5 s: the other requests in flight with the
    // old token are refused too, and each would otherwise ask once more.
    if (raw.lastError && raw.lastError.status === 401 && !(Date.now() - this._tokenAt < 5000)) this._token = null;
    if (before.schema.version !== this._raw.schema.version) {
      for (const w of this._watches) w.tables = undefined; // tables may have changed shape
      this._changed(null);
    }
    this._status = derived(this._raw, this._worker !== null);
    for (const f of this._statusListeners) f(this._status);
  }

  _changed(tables) {
    if (tables) for (const f of this._changeListeners) f(tables);
    for (const w of this._watches) {
      if (!tables || w.tables === undefined || w.tables === null || w.tables.some((t) => tables.includes(t))) this._run(w);
    }
  }

  async _run(w) {
    if (w.running) {
      w.again = true;
      return;
    }
    w.running = true;
    try {
      do {
        w.again = false;
        if (w.tables === undefined) w.tables = await this._call("readTables", [w.sql]);
        const rows = await this._call("query", [w.sql, w.params]);
        if (w.stopped) return;
        if (w.last === undefined || !same(rows, w.last)) {
          w.last = rows;
          w.callback(rows);
        }
      } while (w.again && !w.stopped);
    } catch (e) {
      if (!w.stopped) (w.onError || console.error)(e);
    } finally {
      w.running = false;
    }
  }
}
