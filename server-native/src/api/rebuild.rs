//! `POST /sync/rebuild` (spec 001 terminal rules 5 and 6, spec 003 "Error and Action
//! Dispatch"): a snapshot-bound session that pages one scope's rows in canonical row-identity
//! order, then ends with `final_scope_cursor` and the scope `checksum` of exactly that
//! snapshot.
//!
//! The first request stores the scope's rows as of one REPEATABLE READ snapshot (with the
//! stream watermark of that snapshot) in a session; continuation tokens (HMAC, purpose
//! `rebuild`) name the session and the next ordinal. A session invalidated by a schema,
//! stream, membership or client-generation change, or by the scope's removal, answers
//! 409 `rebuild_restart_required`. Rebuild does not reconcile the assignment: a new request
//! for a scope outside the stored set is 400; a scope the user's current assignment no longer
//! holds (revoked since the client's last connect or pull) is 409 `rebuild_restart_required`
//! for a new request and a continuation alike, so no page of it is served after the
//! revocation, and the client connects again (which takes the scope away).
//!
//! Sessions are bounded per client (migration 25): a new rebuild of a scope replaces the
//! client's earlier session of it, and a client may have at most
//! `Config::max_rebuild_sessions_per_client` sessions in progress; over that, 503
//! `temporary_unavailable` with reason `too_many_rebuild_sessions`, checked before the
//! snapshot is read. Serving the final page completes a session: its rows are dropped and a
//! later continuation of it restarts.

use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::{row_digest, sort_by_identity, RowIdentity, ScopeDigester};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::token::{self, Principal, Purpose, ScopeCursor, ScopeStreamState};
use synchro_protocol::wire::{RebuildEnd, RebuildRecord, RebuildRequest, RenderedRebuildPage};

use tokio_postgres::types::ToSql;

use super::{still_current, ApiError, AppState, Gates, Integrity};

fn restart(scope: &str) -> ApiError {
    ApiError::rebuild_restart(scope)
}

/// Handles one rebuild request for an authenticated user; returns the 200 body's text.
///
/// The phases: the gates, the scope's stream bindings, the session (a new one, or the one a
/// continuation names), its page checked against the session's bindings, then the page's
/// end (a continuation token, or the final cursor and checksum, completing the session).
pub(crate) async fn rebuild(
    state: &AppState,
    user_id: &str,
    req: RebuildRequest,
) -> Result<String, ApiError> {
    // The current assignment is read alongside the gates (both only read): access ends
    // when the assignment does, not at the client's next connect.
    let (gated, assigned) = super::gates_and_assignment(
        state,
        user_id,
        &req.client_id,
        req.client_generation,
        &req.schema,
    )
    .await;
    let Gates {
        lineage,
        stored_assigned,
        stream,
    } = gated?;
    // Revoked since the client's last connect or pull: no new page of it (409: the client
    // connects again, which takes the scope away).
    let revoked = !assigned?.contains(&req.scope_id);
    let current = lineage
        .current()
        .expect("gates checked the current manifest");
    let db = state.db.get().await?;
    let db = &*db;
    let stream = scope_stream(db, &req.scope_id, stream).await?;
    let (session_id, from) = match &req.continuation {
        None => {
            if !stored_assigned.contains(&req.scope_id) {
                return Err(ApiError::invalid_request(
                    "the scope is not assigned to this client",
                ));
            }
            if revoked {
                return Err(restart(&req.scope_id));
            }
            let session = new_session(state, db, user_id, &req, &stream, current).await?;
            (session, 0)
        }
        Some(t) => {
            let resumed = resume(state, user_id, &req, t)?;
            if revoked || !stored_assigned.contains(&req.scope_id) {
                return Err(restart(&req.scope_id));
            }
            resumed
        }
    };
    let page = session_page(db, user_id, &req, &session_id, from, &stream, current).await?;
    // None: a concurrent request completed the session (its records are gone) after its
    // header was read.
    let records = page.records().ok_or_else(|| restart(&req.scope_id))?;
    let end = if page.has_more {
        continuation(state, user_id, &req, session_id, from)
    } else {
        finish(
            state,
            db,
            user_id,
            &req,
            &session_id,
            &page,
            &stream,
            current,
        )
        .await?
    };
    tracing::info!(status = 200, has_more = page.has_more, "rebuild");
    Ok(RenderedRebuildPage {
        scope_id: &req.scope_id,
        records: &records,
        end: &end,
    }
    .to_output_string())
}

/// The stream state bound to this scope: its own membership and retention generations bind
/// the session and its cursor.
async fn scope_stream(
    db: &tokio_postgres::Client,
    scope_id: &str,
    stream: ScopeStreamState,
) -> Result<ScopeStreamState, ApiError> {
    let scope_generations = db
        .query_one(
            "SELECT membership_generation, retention_generation FROM synchro.synchro_scope_retention(ARRAY[$1])",
            &[&scope_id],
        )
        .await?;
    Ok(ScopeStreamState {
        membership_generation: scope_generations.get::<_, i64>(0) as u64,
        retention_generation: scope_generations.get::<_, i64>(1) as u64,
        ..stream
    })
}

/// Starts a session for a new rebuild, within the client's cap of sessions in progress.
async fn new_session(
    state: &AppState,
    db: &tokio_postgres::Client,
    user_id: &str,
    req: &RebuildRequest,
    stream: &ScopeStreamState,
    current: &Manifest,
) -> Result<String, ApiError> {
    // Refused before the snapshot is read; start_session checks again atomically.
    let in_progress: i64 = db
        .query_one(
            "SELECT synchro.synchro_rebuild_sessions_in_progress($1, $2, $3, $4)",
            &[
                &user_id,
                &req.client_id,
                &(req.client_generation as i64),
                &req.scope_id,
            ],
        )
        .await?
        .get(0);
    if in_progress >= i64::from(state.config.max_rebuild_sessions_per_client) {
        return Err(too_many_sessions(state));
    }
    start_session(state, user_id, req, stream, current).await
}

/// The session and next ordinal a continuation token names (400 for a token that does not
/// open, or was issued for another scope, user or client).
fn resume(
    state: &AppState,
    user_id: &str,
    req: &RebuildRequest,
    token: &str,
) -> Result<(String, i32), ApiError> {
    let invalid = || ApiError::invalid_request("the continuation token is invalid");
    let payload = token::open(Purpose::RebuildContinuation, &state.cursor_keys, token)
        .map_err(|_| invalid())?;
    let field = |n: &str| payload.get(n).and_then(Json::as_str).map(str::to_owned);
    let (Some(session), Some(scope), Some(user), Some(client), Some(next)) = (
        field("session_id"),
        field("scope_id"),
        field("user_id"),
        field("client_id"),
        field("next_ordinal").and_then(|n| n.parse::<i32>().ok()),
    ) else {
        return Err(invalid());
    };
    if scope != req.scope_id || user != user_id || client != req.client_id {
        return Err(invalid());
    }
    Ok((session, next))
}

/// One page of a session, with what its end needs.
struct SessionPage {
    /// The chunks holding the page's records.
    chunks: Vec<tokio_postgres::Row>,
    /// The page's ordinals `first..last`.
    first: i64,
    last: i64,
    /// Records per chunk, and in the whole session.
    chunk_rows: i64,
    row_count: i64,
    has_more: bool,
    /// The stream watermark of the session's snapshot.
    watermark: u64,
    /// The scope checksum of the session's snapshot (hex), computed when it started.
    checksum: String,
}

/// Reads the session and its page from `from`; a session bound to another principal is 400,
/// one bound to another generation, schema, stream or membership (or gone) restarts.
async fn session_page(
    db: &tokio_postgres::Client,
    user_id: &str,
    req: &RebuildRequest,
    session_id: &str,
    from: i32,
    stream: &ScopeStreamState,
    current: &Manifest,
) -> Result<SessionPage, ApiError> {
    // The session and its page in one round trip (a page of a session that does not match
    // is read for nothing and dropped).
    let limit = req.limit as i32;
    let (session_params, page_params): ([&(dyn ToSql + Sync); 1], [&(dyn ToSql + Sync); 3]) =
        ([&session_id], [&session_id, &from, &limit]);
    let (s, rows) = futures_util::join!(
        db.query_opt(
            "SELECT * FROM synchro.synchro_rebuild_session($1)",
            &session_params,
        ),
        db.query(
            "SELECT chunk, records FROM synchro.synchro_rebuild_page($1, $2, $3)",
            &page_params,
        )
    );
    let s = s?.ok_or_else(|| restart(&req.scope_id))?;
    let chunks = rows?;
    let bound_generation = s.get::<_, i64>(2) as u64;
    if s.get::<_, String>(0) != user_id
        || s.get::<_, String>(1) != req.client_id
        || s.get::<_, String>(3) != req.scope_id
    {
        return Err(ApiError::invalid_request(
            "the continuation token is invalid",
        ));
    }
    if bound_generation != req.client_generation
        || s.get::<_, String>(4) != current.schema_hash_hex()
        || s.get::<_, i64>(5) as u64 != stream.stream_generation
        || s.get::<_, i64>(6) as u64 != stream.membership_generation
    {
        return Err(restart(&req.scope_id));
    }
    let (row_count, chunk_rows) = (i64::from(s.get::<_, i32>(8)), i64::from(s.get::<_, i32>(9)));
    let first = i64::from(from);
    let last = (first + req.limit as i64).min(row_count);
    Ok(SessionPage {
        chunks,
        first,
        last,
        chunk_rows,
        row_count,
        has_more: last < row_count,
        watermark: s.get::<_, i64>(7) as u64,
        checksum: s.get::<_, String>(10),
    })
}

/// The end of a page with more after it: the token for the next page.
fn continuation(
    state: &AppState,
    user_id: &str,
    req: &RebuildRequest,
    session_id: String,
    from: i32,
) -> RebuildEnd {
    let next = from + req.limit as i32;
    let t = token::sign(
        Purpose::RebuildContinuation,
        &state.cursor_keys,
        vec![
            ("kind".into(), Json::String("rebuild_continuation".into())),
            ("session_id".into(), Json::String(session_id)),
            ("scope_id".into(), Json::String(req.scope_id.clone())),
            ("user_id".into(), Json::String(user_id.to_owned())),
            ("client_id".into(), Json::String(req.client_id.clone())),
            ("next_ordinal".into(), Json::String(next.to_string())),
        ],
    );
    RebuildEnd::More { continuation: t }
}

/// The end of the final page: the scope cursor at the session's watermark and the
/// checksum of exactly its snapshot. Completes the session.
#[allow(clippy::too_many_arguments)]
async fn finish(
    state: &AppState,
    db: &tokio_postgres::Client,
    user_id: &str,
    req: &RebuildRequest,
    session_id: &str,
    page: &SessionPage,
    stream: &ScopeStreamState,
    current: &Manifest,
) -> Result<RebuildEnd, ApiError> {
    let checksum = hex::decode(&page.checksum)
        .ok()
        .and_then(|d| <[u8; 32]>::try_from(d).ok())
        .ok_or_else(|| ApiError::integrity(Integrity::StoredRow))?;
    // Complete: the records go; the header keeps pinning retention at the watermark.
    db.execute(
        "SELECT synchro.synchro_rebuild_complete($1)",
        &[&session_id],
    )
    .await?;
    let cursor = ScopeCursor {
        scope_id: req.scope_id.clone(),
        stream_generation: stream.stream_generation,
        membership_generation: stream.membership_generation,
        retention_generation: stream.retention_generation,
        position: page.watermark,
        schema_hash: current.schema_hash(),
        principal: Principal {
            user_id: user_id.to_owned(),
            client_id: req.client_id.clone(),
            client_generation: req.client_generation,
        },
        issued_at: super::rows::now_datetime(),
    };
    Ok(RebuildEnd::Final {
        final_scope_cursor: cursor.sign(&state.cursor_keys),
        checksum: Checksum(checksum),
    })
}

/// Stores the scope's rows as of one snapshot, in row-identity order, as a new session.
async fn start_session(
    state: &AppState,
    user_id: &str,
    req: &RebuildRequest,
    stream: &ScopeStreamState,
    manifest: &Manifest,
) -> Result<String, ApiError> {
    let mut snapshot_db = state.snapshot_db.lock().await?;
    let snap = snapshot_db
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    // (Both go out together, one round trip.)
    let (watermark, current_still) = futures_util::join!(
        snap.query_one(
            "SELECT effect_position FROM synchro.synchro_pull_watermark()",
            &[],
        ),
        still_current(state, &snap, manifest, &req.schema),
    );
    current_still?;
    let watermark: i64 = watermark?.get(0);
    let rows = snap
        .query(
            "SELECT table_id, pk, row_json, server_version FROM synchro.synchro_scope_rows($1)",
            &[&req.scope_id],
        )
        .await?;
    snap.commit().await?;
    drop(snapshot_db);
    let rendered = render(manifest, &req.scope_id, rows).await?;
    let max_sessions =
        i32::try_from(state.config.max_rebuild_sessions_per_client).unwrap_or(i32::MAX);
    let id: Option<String> = state
        .db
        .get()
        .await?
        .query_one(
            "SELECT synchro.synchro_rebuild_create($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
            &[
                &user_id,
                &req.client_id,
                &(req.client_generation as i64),
                &req.scope_id,
                &manifest.schema_hash_hex(),
                &(stream.stream_generation as i64),
                &(stream.membership_generation as i64),
                &watermark,
                &hex::encode(rendered.checksum.0),
                &rendered.row_count,
                &CHUNK_ROWS,
                &rendered.chunks,
                &max_sessions,
            ],
        )
        .await?
        .get(0);
    id.ok_or_else(|| too_many_sessions(state))
}

/// Records per stored chunk of a session: the largest page, so a page reads one or two.
const CHUNK_ROWS: i32 = 1000;

/// A snapshot's rows as a session holds them.
struct Rendered {
    /// The rows' record texts in canonical row-identity order, [`CHUNK_ROWS`] to a chunk,
    /// separated by newlines.
    chunks: Vec<String>,
    /// How many records.
    row_count: i32,
    /// The scope digest of all of them.
    checksum: Checksum,
}

impl SessionPage {
    /// The page's records from the chunks that hold them; `None` when a chunk is missing or
    /// does not hold the records its number says.
    fn records(&self) -> Option<Vec<&str>> {
        page_records(
            &self.chunks,
            self.first,
            self.last,
            self.chunk_rows,
            self.row_count,
        )
    }
}

/// The records of ordinals `first..last` from the chunks that hold them (`chunk, records`
/// rows, in order); `None` when a chunk is missing or does not hold the records its number
/// says.
fn page_records(
    chunks: &[tokio_postgres::Row],
    first: i64,
    last: i64,
    chunk_rows: i64,
    row_count: i64,
) -> Option<Vec<&str>> {
    let mut out = Vec::with_capacity((last - first).max(0) as usize);
    if first >= last {
        return Some(out);
    }
    for (next, c) in (first / chunk_rows..).zip(chunks) {
        if i64::from(c.get::<_, i32>(0)) != next {
            return None;
        }
        let start = next * chunk_rows;
        let mut held = 0;
        for (i, record) in c.get::<_, &str>(1).split('\n').enumerate() {
            held += 1;
            if (first..last).contains(&(start + i as i64)) {
                out.push(record);
            }
        }
        if held != (row_count - start).min(chunk_rows) {
            return None;
        }
    }
    (out.len() as i64 == last - first).then_some(out)
}

/// Rows a rendering thread takes at least: fewer are rendered on one thread.
const RENDER_SPLIT: usize = 8192;

/// A row's identity, digest and record text.
type RenderedRow = (RowIdentity, [u8; 32], String);

/// Parses and digests each row of a snapshot (`table_id, pk, row_json, server_version`)
/// once: its record text (with its row digest) for the pages, in row-identity order, and the
/// scope digest of the whole snapshot for the final page. Runs off the async workers, on up
/// to one thread per core (100,000 rows take ~0.5 s of CPU).
async fn render(
    manifest: &Manifest,
    scope: &str,
    rows: Vec<tokio_postgres::Row>,
) -> Result<Rendered, ApiError> {
    let (manifest, scope) = (manifest.clone(), scope.to_owned());
    tokio::task::spawn_blocking(move || render_all(&manifest, &scope, &rows))
        .await
        .map_err(|_| ApiError::integrity(Integrity::Render))?
}

fn render_all(
    manifest: &Manifest,
    scope: &str,
    rows: &[tokio_postgres::Row],
) -> Result<Rendered, ApiError> {
    let integrity = |_| ApiError::integrity(Integrity::Digest);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(rows.len() / RENDER_SPLIT)
        .max(1);
    let parts: Vec<Vec<RenderedRow>> = if threads == 1 {
        vec![render_rows(manifest, rows)?]
    } else {
        let per = rows.len().div_ceil(threads);
        std::thread::scope(|s| {
            let running: Vec<_> = rows
                .chunks(per)
                .map(|part| s.spawn(|| render_rows(manifest, part)))
                .collect();
            running
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(ApiError::integrity(Integrity::Render)))
                })
                .collect::<Result<_, _>>()
        })?
    };
    // Sorted by identity with the ordinal riding in the digest slot.
    let mut keyed: Vec<(RowIdentity, [u8; 32])> = Vec::with_capacity(rows.len());
    let mut rendered: Vec<([u8; 32], String)> = Vec::with_capacity(rows.len());
    for (i, (identity, digest, text)) in parts.into_iter().flatten().enumerate() {
        let mut ordinal = [0u8; 32];
        ordinal[..8].copy_from_slice(&(i as u64).to_be_bytes());
        keyed.push((identity, ordinal));
        rendered.push((digest, text));
    }
    sort_by_identity(&mut keyed);
    let mut digester = ScopeDigester::new(&manifest.schema_hash(), scope, keyed.len() as u64)
        .map_err(integrity)?;
    let mut chunks = Vec::new();
    for (n, (identity, ordinal)) in keyed.iter().enumerate() {
        let i = u64::from_be_bytes(ordinal[..8].try_into().expect("8 bytes")) as usize;
        // Each record's own text is freed once it is in its chunk.
        let (digest, text) = std::mem::take(&mut rendered[i]);
        digester.add(identity, &digest).map_err(integrity)?;
        // Output JSON has no raw newline: it separates records.
        debug_assert!(!text.contains('\n'));
        if n % CHUNK_ROWS as usize == 0 {
            chunks.push(String::with_capacity(text.len() * CHUNK_ROWS as usize + 1));
        } else {
            chunks.last_mut().expect("a chunk").push('\n');
        }
        chunks.last_mut().expect("a chunk").push_str(&text);
    }
    let checksum = Checksum(digester.finish().map_err(integrity)?.digest);
    let row_count = i32::try_from(keyed.len()).map_err(|_| ApiError::unavailable())?;
    Ok(Rendered {
        chunks,
        row_count,
        checksum,
    })
}

/// Each row's identity, digest and record text, in the rows' order.
fn render_rows(
    manifest: &Manifest,
    rows: &[tokio_postgres::Row],
) -> Result<Vec<RenderedRow>, ApiError> {
    let stored = |_| ApiError::integrity(Integrity::StoredRow);
    let integrity = |_| ApiError::integrity(Integrity::Digest);
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let (table_id, pk, row_json, version): (&str, &str, &str, &str) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let (key, identity) = super::rows::key_identity(manifest, table_id, pk)?;
        let pk = key.to_wire();
        let row = Json::parse(row_json).map_err(stored)?;
        let d = row_digest(manifest, table_id, &pk, &row, version).map_err(integrity)?;
        let record = RebuildRecord {
            table_id: table_id.to_owned(),
            pk,
            row,
            server_version: version.to_owned(),
            row_checksum: Checksum(d.digest),
        };
        out.push((identity, d.digest, record.to_output_string()));
    }
    Ok(out)
}

fn too_many_sessions(state: &AppState) -> ApiError {
    ApiError::overloaded(
        "too_many_rebuild_sessions",
        state.config.retry_after_seconds,
    )
}
