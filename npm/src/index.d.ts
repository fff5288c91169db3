/**
 * A written value: decimal as a string; int64 as a string, a BigInt or a safe-integer number;
 * boolean as true/false or 1/0 (what a read gives); datetime as a Date or its ISO text; bytes
 * as a Uint8Array.
 */
export type Value = string | number | bigint | boolean | null | Date | Uint8Array | { [k: string]: unknown } | unknown[];
/** A row as `query` returns it: INTEGER a number when safe, else a BigInt; BLOB a Uint8Array. */
export type Row = Record<string, string | number | bigint | null | Uint8Array>;
/** A JSON value (a json field's value in a write). */
export type Json = string | number | boolean | null | Json[] | { [k: string]: Json };

/**
 * The types of one synced table: its key, a row as read, and the values of an insert and an
 * update. `synchro-server codegen typescript` writes a `Schema` of them for every table.
 */
export interface TableTypes {
  key: Value;
  row: object;
  insert: object;
  update: object;
}
/** Table name -> its types. */
export type SchemaTypes = { [table: string]: TableTypes };
/** Without a generated schema: any table name, key and values. */
export type AnySchema = { [table: string]: { key: Value; row: Row; insert: Record<string, Value>; update: Record<string, Value> } };

export interface ClientOptions {
  /** The sync server (or edge gateway), absolute or relative to the page. */
  url: string;
  /** Returns a bearer token; asked again after the server answered 401. */
  token: () => string | Promise<string>;
  /** The database's name (one OPFS database per name per origin). Default "synchro". */
  name?: string;
  /** SQL for the app's local-only tables, one entry per version (1..N), applied in order. */
  localMigrations?: string[];
  /** The app's runtime version presented on connect (SemVer 2.0.0). */
  clientVersion?: string;
  /**
   * A portable seed (`synchro-server seed export`, served at `/seeds/{name}`), absolute or
   * relative to the page. Used only when the database is new: it is downloaded into OPFS,
   * every row and scope digest is checked before anything is used, and the first connect
   * continues from the seed instead of downloading its scopes again. On the server's
   * origin it is fetched with the bearer token. See `status.seed` for what happened.
   */
  seed?: string;
  /**
   * The served schema bundled with the app (`synchro-server codegen manifest --out
   * src/synchro.manifest.json`, then `import schema from "./synchro.manifest.json"`): a new
   * database installs it at once, so a first visit offline can write (and queries see the
   * tables) before the first connect; connect then moves it to the server's current schema
   * as usual. A manifest whose hash does not verify is refused (`invalid_schema`).
   */
  schema?: object;
  /**
   * What happens to an offline update the server's row moved past: "keep" (the default: the
   * server's row stands and the write is a `conflict`), or "rebase_disjoint": when the fields
   * the write changed are ones the server did not change since the row it was made on, the
   * write is queued again on the server's current row (a new mutation, which the server still
   * decides; the conflict's outcome names it as `rebased_as`).
   */
  conflicts?: "keep" | "rebase_disjoint";
  /** Live session tuning (milliseconds). */
  live?: { safetyPollMs?: number; backoffMinMs?: number; backoffMaxMs?: number; streamIdleMs?: number };
}

export interface Progress {
  phase: string;
  scope: string | null;
  pages: number;
  rows: number;
  totalRows?: number;
}

export interface StatusError {
  code: string;
  status?: number | null;
  retryable: boolean;
  message?: string;
  retryInMs?: number;
}

export interface Status {
  /**
   * starting, connecting, syncing, live, offline (the network failed: retrying),
   * upgrade_required, error (lastError.code: cors_refused, unauthorized, forbidden, or a local
   * failure; the client keeps trying and leaves the phase once a round works), stopped.
   */
  phase: "starting" | "connecting" | "syncing" | "live" | "offline" | "upgrade_required" | "error" | "stopped";
  connected: boolean;
  syncing: boolean;
  offline: boolean;
  /** Whether this tab holds the database (the others reach it through this one). */
  leader: boolean;
  /** The running pull or rebuild, page by page. */
  progress: Progress | null;
  /** When the client last caught up with the server (ms since the epoch). */
  lastSyncedAt: number | null;
  lastError: StatusError | null;
  /** The engine state, installed schema version and the last connect's schema action. */
  schema: { state: string; version: number; action: string | null };
  /** Set while phase is upgrade_required: why, and what the app should do. */
  upgrade: { reason: "client_runtime" | "schema_history"; action: string } | null;
  /** Local writes not yet answered by the server. */
  pendingWrites: number;
  /**
   * What opening with `seed` did: installed (with each scope's rows), skipped (the database
   * existed) or refused (a corrupt, tampered or unreachable seed: nothing of it was used and
   * the scopes download as usual); null without a seed.
   */
  seed:
    | { status: "installed"; scopes: { scope: string; rows: number }[] }
    | { status: "skipped" }
    | { status: "refused"; code: string; message: string }
    | null;
}

export interface Mutation {
  mutationId: string;
  batchId: string;
  localOrder: number;
  /** The table's name. */
  table: string;
  pk: unknown;
  operation: "insert" | "update" | "delete";
  baseVersion: string | null;
  clientVersion: number;
  /** The written fields by name, in their wire form (an int64 as a string, a datetime as
   * `YYYY-MM-DDTHH:MM:SS.ffffffZ`); null for a delete. */
  values: { [field: string]: unknown } | null;
  authoredSchema: { version: number; hash: string };
  /**
   * The server's outcome once answered, with fields by name: `code` and `message` for a
   * rejection, the server's row (`row`, for a conflict the row that won), `incompatible_fields`.
   */
  outcome: Record<string, unknown> | null;
  state: "pending" | "applied" | "conflict" | "rejected_terminal";
}

export class SynchroError extends Error {
  /** A stable code: network_error, unauthorized, unknown_table, invalid_value, write_too_large, closed, ... */
  readonly code: string;
  /** Whether trying again later can succeed. */
  readonly retryable: boolean;
  /** For upgrade_required: client_runtime or schema_history. */
  readonly reason?: string;
}

/**
 * A client. With the generated `Schema` (`createClient<Schema>(...)`), `insert`, `update` and
 * `delete` take only its table names, keys and values, and `query<TasksRow>(...)` types rows.
 */
export interface SynchroClient<S extends SchemaTypes = AnySchema> {
  readonly status: Status;
  onStatus(callback: (status: Status) => void): () => void;
  query<R = Row>(sql: string, params?: Value[]): Promise<R[]>;
  watch<R = Row>(sql: string, params: Value[], callback: (rows: R[]) => void, onError?: (e: SynchroError) => void): () => void;
  insert<T extends keyof S & string>(table: T, key: S[T]["key"], values: S[T]["insert"]): Promise<string>;
  update<T extends keyof S & string>(table: T, key: S[T]["key"], values: S[T]["update"]): Promise<string>;
  delete<T extends keyof S & string>(table: T, key: S[T]["key"]): Promise<string>;
  mutations(): Promise<Mutation[]>;
  /** Settles once the mutation is final; rejects with `unknown_mutation` for an ID the queue does not hold. */
  outcome(mutationId: string): Promise<Mutation>;
  /** Clears every resolved mutation (and its outcome) from the local queue; resolves to how many. Pending ones stay. */
  clearResolved(): Promise<number>;
  onMutation(callback: (m: Mutation) => void): () => void;
  onConflict(callback: (m: Mutation) => void): () => void;
  onRejected(callback: (m: Mutation) => void): () => void;
  onChange(callback: (tables: string[]) => void): () => void;
  syncNow(): Promise<void>;
  requestSchemaReset(): Promise<void>;
  close(): Promise<void>;
}

export function createClient<S extends SchemaTypes = AnySchema>(options: ClientOptions): SynchroClient<S>;
