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
//! Sessions are bounded per client: a new rebuild of a scope replaces the client's earlier
//! session of it, and a client may have at most `Config::max_rebuild_sessions_per_client`
//! sessions in progress (over that, 503 `temporary_unavailable` with reason
//! `too_many_rebuild_sessions`) and, besides its first, at most
//! `Config::max_rebuild_bytes_per_client` of stored records (reason
//! `too_much_rebuild_storage`); both are checked before the snapshot is read and again when
//! the session is stored. A session is built by at most [`BUILDS`] requests of a server at
//! once (each holds its scope's rows in memory while it renders them). Pages are bounded in
//! bytes as pull's are (`Config::max_page_bytes`, at least one record), and the stored chunks
//! hold about [`CHUNK_BYTES`] each, so a page of large rows is cut short and its memory
//! follows the bound. Serving the final page completes a session: its rows are dropped and
//! a later continuation of it restarts; so does one of a session idle for the
//! `rebuild_session_idle_minutes` setting (10), whose rows compaction drops.

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

/// Handles one rebuild request for an authenticated user; returns the 200 body's text and
/// the session's row count (the scope's cardinality at its snapshot, which the
/// `x-synchro-scope-rows` header tells the client for its progress).
///
/// The phases: the gates, the scope's stream bindings, the session (a new one, or the one a
/// continuation names), its page checked against the session's bindings, then the page's
/// end (a continuation token, or the final cursor and checksum, completing the session).
pub(crate) async fn rebuild(
    state: &AppState,
    user_id: &str,
    req: RebuildRequest,
) -> Result<(String, u64), ApiError> {
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
    let page = session_page(state, db, user_id, &req, &session_id, from, current).await?;
    // None: a concurrent request completed the session (its records are gone) after its
    // header was read, or compaction ended it for idleness.
    let records = page
        .records(req.limit as i64, state.config.max_page_bytes)
        .ok_or_else(|| restart(&req.scope_id))?;
    let next = page.first + records.len() as i64;
    let has_more = next < page.row_count;
    let end = if has_more {
        continuation(state, user_id, &req, session_id, next)
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
    tracing::info!(status = 200, has_more, "rebuild");
    let text = RenderedRebuildPage {
        scope_id: &req.scope_id,
        records: &records,
        end: &end,
    }
    .to_output_string();
    Ok((text, page.row_count.max(0) as u64))
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
    let others = db
        .query_one(
            "SELECT sessions, bytes FROM synchro.synchro_rebuild_sessions_in_progress($1, $2, $3, $4)",
            &[
                &user_id,
                &req.client_id,
                &(req.client_generation as i64),
                &req.scope_id,
            ],
        )
        .await?;
    let (sessions, bytes): (i64, i64) = (others.get(0), others.get(1));
    if sessions >= i64::from(state.config.max_rebuild_sessions_per_client) {
        return Err(refused(state, "too_many_rebuild_sessions"));
    }
    if sessions > 0 && bytes as u64 >= state.config.max_rebuild_bytes_per_client {
        return Err(refused(state, "too_much_rebuild_storage"));
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
    /// The chunks holding the page's records (`first_ordinal, records`).
    chunks: Vec<tokio_postgres::Row>,
    /// The page's first ordinal.
    first: i64,
    /// Records in the whole session.
    row_count: i64,
    /// The stream watermark of the session's snapshot.
    watermark: u64,
    /// The scope checksum of the session's snapshot (hex), computed when it started.
    checksum: String,
    /// The stream and membership generations the session was built under.
    stream_generation: u64,
    membership_generation: u64,
}

/// Reads the session and its page from `from`; a session bound to another principal is 400,
/// one bound to another client generation or schema (or gone) restarts.
async fn session_page(
    state: &AppState,
    db: &tokio_postgres::Client,
    user_id: &str,
    req: &RebuildRequest,
    session_id: &str,
    from: i32,
    current: &Manifest,
) -> Result<SessionPage, ApiError> {
    // The session and its page in one round trip (a page of a session that does not match
    // is read for nothing and dropped).
    let limit = req.limit as i32;
    let max_bytes = state.config.max_page_bytes as i64;
    let (session_params, page_params): ([&(dyn ToSql + Sync); 1], [&(dyn ToSql + Sync); 4]) =
        ([&session_id], [&session_id, &from, &limit, &max_bytes]);
    let (s, rows) = futures_util::join!(
        db.query_opt(
            "SELECT * FROM synchro.synchro_rebuild_session($1)",
            &session_params,
        ),
        db.query(
            "SELECT first_ordinal, records FROM synchro.synchro_rebuild_page($1, $2, $3, $4)",
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
    // A session completes against the stream and membership generations it was built under
    // (spec 003 staged backfill, step 5: the prior generation is retained for the rebuild
    // sessions in flight; its stored rows are that retention): its final cursor binds them,
    // so a membership generation activated meanwhile stales it at the next pull (the scope
    // rebuilds again under the new rule), and a lineage reset's bridge lets it resume. Another
    // client generation or schema restarts it.
    if bound_generation != req.client_generation
        || s.get::<_, String>(4) != current.schema_hash_hex()
    {
        return Err(restart(&req.scope_id));
    }
    Ok(SessionPage {
        chunks,
        first: i64::from(from),
        row_count: i64::from(s.get::<_, i32>(8)),
        watermark: s.get::<_, i64>(7) as u64,
        checksum: s.get::<_, String>(9),
        stream_generation: s.get::<_, i64>(5) as u64,
        membership_generation: s.get::<_, i64>(6) as u64,
    })
}

/// The end of a page with more after it: the token for the next page.
fn continuation(
    state: &AppState,
    user_id: &str,
    req: &RebuildRequest,
    session_id: String,
    next: i64,
) -> RebuildEnd {
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
        stream_generation: page.stream_generation,
        membership_generation: page.membership_generation,
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
    // The scope's rows are in memory from the snapshot until they are stored.
    let _building = state
        .rebuild_builds
        .acquire()
        .await
        .map_err(|_| ApiError::unavailable())?;
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
    let max_bytes = i64::try_from(state.config.max_rebuild_bytes_per_client).unwrap_or(i64::MAX);
    let total: i64 = rendered.chunks.iter().map(|c| c.text.len() as i64).sum();
    let db = state.db.get().await?;
    let created = db
        .query_one(
            "SELECT session_id, refused FROM synchro.synchro_rebuild_create($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
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
                &total,
                &max_sessions,
                &max_bytes,
            ],
        )
        .await?;
    let id = match created.get::<_, Option<String>>(0) {
        Some(id) => id,
        None if created.get::<_, Option<&str>>(1) == Some("too_much_rebuild_storage") => {
            return Err(refused(state, "too_much_rebuild_storage"))
        }
        None => return Err(refused(state, "too_many_rebuild_sessions")),
    };
    // The chunks follow in batches of about APPEND_BYTES (one statement per batch), each
    // batch's chunks freed once stored.
    let mut chunks = rendered.chunks.into_iter().peekable();
    while chunks.peek().is_some() {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(c) =
            chunks.next_if(|c| batch.is_empty() || bytes + c.text.len() <= APPEND_BYTES)
        {
            bytes += c.text.len();
            batch.push(c);
        }
        let (firsts, counts, sizes, texts) = columns(&batch);
        db.execute(
            "SELECT synchro.synchro_rebuild_append($1, $2, $3, $4, $5)",
            &[&id, &firsts, &counts, &sizes, &texts],
        )
        .await?;
    }
    Ok(id)
}

/// Bytes of chunks stored by one statement at most (besides one larger chunk alone).
const APPEND_BYTES: usize = 8 << 20;

/// Requests of one server building a session at once (each holds its scope's rows in
/// memory, and renders them on every core).
pub const BUILDS: usize = 2;

/// Records per stored chunk of a session at most: a page of small rows reads one or two.
const CHUNK_ROWS: usize = 1000;
/// A chunk ends once its records reach this many bytes (a larger record is a chunk of its
/// own), so a page of large rows reads little more than the page bound.
const CHUNK_BYTES: usize = 1 << 20;

/// One stored chunk: the records from ordinal `first` on, separated by newlines.
struct Chunk {
    first: i32,
    count: i32,
    text: String,
}

/// A snapshot's rows as a session holds them.
struct Rendered {
    /// The rows' record texts in canonical row-identity order, in chunks.
    chunks: Vec<Chunk>,
    /// How many records.
    row_count: i32,
    /// The scope digest of all of them.
    checksum: Checksum,
}

/// Chunks as the arrays `synchro_rebuild_append` takes: first ordinals, record counts, byte
/// counts, texts.
fn columns(chunks: &[Chunk]) -> (Vec<i32>, Vec<i32>, Vec<i32>, Vec<&str>) {
    let firsts = chunks.iter().map(|c| c.first).collect();
    let counts = chunks.iter().map(|c| c.count).collect();
    let bytes = chunks
        .iter()
        .map(|c| i32::try_from(c.text.len()).unwrap_or(i32::MAX))
        .collect();
    let texts = chunks.iter().map(|c| c.text.as_str()).collect();
    (firsts, counts, bytes, texts)
}

impl SessionPage {
    /// At most `limit` of the page's records from the chunks that hold them, ending once
    /// they reach `max_bytes` (at least one record); `None` when the chunks do not hold the
    /// page's first record or are not contiguous (a session completed or ended meanwhile).
    fn records(&self, limit: i64, max_bytes: usize) -> Option<Vec<&str>> {
        page_records(&self.chunks, self.first, limit, max_bytes, self.row_count)
    }
}

/// The records from ordinal `first` on (at most `limit`, ending once they reach `max_bytes`,
/// at least one) from the chunks that hold them (`first_ordinal, records` rows, in order); an
/// empty page at the end of the session. `None` when the first chunk does not hold `first`,
/// or a chunk does not start where the one before it ended.
fn page_records(
    chunks: &[tokio_postgres::Row],
    first: i64,
    limit: i64,
    max_bytes: usize,
    row_count: i64,
) -> Option<Vec<&str>> {
    let parts: Vec<(i64, &str)> = chunks
        .iter()
        .map(|c| (i64::from(c.get::<_, i32>(0)), c.get::<_, &str>(1)))
        .collect();
    take_records(&parts, first, limit, max_bytes, row_count)
}

/// [`page_records`] over `(first ordinal, records)` pairs.
fn take_records<'a>(
    chunks: &[(i64, &'a str)],
    first: i64,
    limit: i64,
    max_bytes: usize,
    row_count: i64,
) -> Option<Vec<&'a str>> {
    let mut out = Vec::new();
    if first >= row_count {
        return Some(out);
    }
    let last = (first + limit).min(row_count);
    let mut expected = chunks.first().map(|c| c.0).filter(|&f| f <= first)?;
    let mut bytes = 0usize;
    for &(start, text) in chunks {
        if start != expected {
            return None;
        }
        for (i, record) in text.split('\n').enumerate() {
            let ordinal = start + i as i64;
            expected = ordinal + 1;
            if ordinal < first {
                continue;
            }
            if ordinal >= last || (!out.is_empty() && bytes >= max_bytes) {
                return Some(out);
            }
            bytes += record.len();
            out.push(record);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Rows a rendering thread takes at least: fewer are rendered on one thread.
const RENDER_SPLIT: usize = 8192;

/// A row's identity, digest and record text.
type RenderedRow = (RowIdentity, [u8; 32], String);

/// Parses and digests each row of a snapshot (`table_id, pk, row_json, server_version`)
/// once: its record text (with its row digest) for the pages, in row-identity order, and the
/// scope digest of the whole snapshot for the final page. Runs off the async workers, on up
/// to one thread per core (100,000 rows take ~0.5 s of CPU). Each row is dropped once
/// rendered, so a scope of large rows is held about once, not twice.
async fn render(
    manifest: &Manifest,
    scope: &str,
    rows: Vec<tokio_postgres::Row>,
) -> Result<Rendered, ApiError> {
    let (manifest, scope) = (manifest.clone(), scope.to_owned());
    tokio::task::spawn_blocking(move || render_all(&manifest, &scope, rows))
        .await
        .map_err(|_| ApiError::integrity(Integrity::Render))?
}

fn render_all(
    manifest: &Manifest,
    scope: &str,
    rows: Vec<tokio_postgres::Row>,
) -> Result<Rendered, ApiError> {
    let integrity = |_| ApiError::integrity(Integrity::Digest);
    let count = rows.len();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(count / RENDER_SPLIT)
        .max(1);
    let parts: Vec<Vec<RenderedRow>> = if threads == 1 {
        vec![render_rows(manifest, rows)?]
    } else {
        let per = count.div_ceil(threads);
        let mut owned = Vec::with_capacity(threads);
        let mut rest = rows;
        while rest.len() > per {
            let tail = rest.split_off(per);
            owned.push(std::mem::replace(&mut rest, tail));
        }
        owned.push(rest);
        std::thread::scope(|s| {
            let running: Vec<_> = owned
                .into_iter()
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
    let mut keyed: Vec<(RowIdentity, [u8; 32])> = Vec::with_capacity(count);
    let mut rendered: Vec<([u8; 32], String)> = Vec::with_capacity(count);
    for (i, (identity, digest, text)) in parts.into_iter().flatten().enumerate() {
        let mut ordinal = [0u8; 32];
        ordinal[..8].copy_from_slice(&(i as u64).to_be_bytes());
        keyed.push((identity, ordinal));
        rendered.push((digest, text));
    }
    sort_by_identity(&mut keyed);
    let mut digester = ScopeDigester::new(&manifest.schema_hash(), scope, keyed.len() as u64)
        .map_err(integrity)?;
    let mut chunks: Vec<Chunk> = Vec::new();
    for (n, (identity, ordinal)) in keyed.iter().enumerate() {
        let i = u64::from_be_bytes(ordinal[..8].try_into().expect("8 bytes")) as usize;
        // Each record's own text is freed once it is in its chunk.
        let (digest, text) = std::mem::take(&mut rendered[i]);
        digester.add(identity, &digest).map_err(integrity)?;
        // Output JSON has no raw newline: it separates records.
        debug_assert!(!text.contains('\n'));
        match chunks.last_mut() {
            Some(c) if (c.count as usize) < CHUNK_ROWS && c.text.len() < CHUNK_BYTES => {
                c.text.push('\n');
                c.text.push_str(&text);
                c.count += 1;
            }
            _ => chunks.push(Chunk {
                first: i32::try_from(n).map_err(|_| ApiError::unavailable())?,
                count: 1,
                text: {
                    let mut t =
                        String::with_capacity((text.len() * CHUNK_ROWS).min(CHUNK_BYTES) + 1);
                    t.push_str(&text);
                    t
                },
            }),
        }
    }
    let checksum = Checksum(digester.finish().map_err(integrity)?.digest);
    let row_count = i32::try_from(keyed.len()).map_err(|_| ApiError::unavailable())?;
    Ok(Rendered {
        chunks,
        row_count,
        checksum,
    })
}

/// Each row's identity, digest and record text, in the rows' order (each row dropped once
/// rendered).
fn render_rows(
    manifest: &Manifest,
    rows: Vec<tokio_postgres::Row>,
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

/// A new session refused for its client's bounds (503, retryable once sessions end).
fn refused(state: &AppState, reason: &'static str) -> ApiError {
    ApiError::overloaded(reason, state.config.retry_after_seconds)
}

#[cfg(test)]
mod tests {
    use super::take_records;

    const CHUNKS: [(i64, &str); 3] = [(0, "a\nb\nc"), (3, "dddd"), (4, "e\nf")];

    #[test]
    fn a_page_takes_records_across_chunks_up_to_its_limit() {
        assert_eq!(
            take_records(&CHUNKS, 1, 4, usize::MAX, 6),
            Some(vec!["b", "c", "dddd", "e"])
        );
        assert_eq!(
            take_records(&CHUNKS[2..], 5, 10, usize::MAX, 6),
            Some(vec!["f"])
        );
        assert_eq!(take_records(&[], 6, 10, usize::MAX, 6), Some(vec![]));
    }

    #[test]
    fn a_page_ends_once_its_records_reach_the_byte_bound_holding_at_least_one() {
        // "b" and "c" (2 bytes) reach 2; "dddd" alone passes 1.
        assert_eq!(take_records(&CHUNKS, 1, 10, 2, 6), Some(vec!["b", "c"]));
        assert_eq!(take_records(&CHUNKS[1..], 3, 10, 1, 6), Some(vec!["dddd"]));
    }

    #[test]
    fn missing_or_gapped_chunks_are_refused() {
        // The first chunk must hold the page's first record.
        assert_eq!(take_records(&CHUNKS[1..], 2, 10, usize::MAX, 6), None);
        assert_eq!(take_records(&[], 2, 10, usize::MAX, 6), None);
        // A gap between chunks.
        assert_eq!(
            take_records(&[CHUNKS[0], CHUNKS[2]], 0, 10, usize::MAX, 6),
            None
        );
    }
}
