//! Portable seed export, the exporter's side (spec 001 "Snapshot-bound portable seed
//! export", "Seed verification and artifact publication"): [`export`] runs the seed
//! functions of `sql/install/55_seed.sql` in one SERIALIZABLE READ ONLY DEFERRABLE
//! transaction of a seed login, and [`verify`] checks what they returned before anything is
//! published (checks 1 to 7 of the spec); [`write_artifact`] writes the SQLite file with the
//! client's own store and publishes it only after [`verify_artifact`] (checks 8 to 10)
//! passed on it.
//!
//! The scope digests are computed here, with the protocol core, from the rows the export's
//! own snapshot holds (a first pass, `synchro_seed_scope_rows`), and bound by the database
//! into the export manifest, the page tokens and the receipts; the pages (the second pass)
//! are then verified against them: every row digest recomputed, the identities strictly
//! ordered with no gap, each scope's cardinality and digest, each receipt's bindings.
//! Errors name no scope, key or value.

use std::collections::BTreeSet;

use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity, ScopeDigester};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::seed::{
    ExportManifest, ExportScope, SeedPage, SeedReceipt, SnapshotBoundary,
};
use tokio_postgres::{Client, IsolationLevel};

/// Why an export produced nothing.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// A seed function refused (its typed code and reason; `seed_export_transaction_required`,
    /// `invalid_seed_export`, `seed_export_state`, `invalid_seed_page_token`), or the login
    /// may not run them (`seed_export_forbidden`, `not_a_seed_login`).
    #[error("the database refused the export: {code} ({reason})")]
    Refused {
        /// The refusal's code.
        code: String,
        /// Its reason.
        reason: String,
    },
    /// What the database returned does not verify: nothing may be published.
    #[error("the export does not verify: {0}")]
    Verification(&'static str),
    /// The database could not be read.
    #[error("{0}")]
    Database(String),
}

impl From<tokio_postgres::Error> for SeedError {
    fn from(e: tokio_postgres::Error) -> SeedError {
        if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
            // The login is not a member of synchro_seed: what the operator must fix.
            return SeedError::Refused {
                code: "seed_export_forbidden".into(),
                reason: "not_a_seed_login".into(),
            };
        }
        if let Some(d) = e.as_db_error() {
            let reason = d
                .detail()
                .and_then(|t| Json::parse(t).ok())
                .and_then(|v| v.get("reason").and_then(Json::as_str).map(str::to_owned));
            if let Some(reason) = reason {
                return SeedError::Refused {
                    code: d.message().to_owned(),
                    reason,
                };
            }
        }
        SeedError::Database(crate::install::describe_for_log(&e))
    }
}

fn unverified(what: &'static str) -> SeedError {
    SeedError::Verification(what)
}

/// One verified seed row.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRecord {
    /// The table.
    pub table_id: String,
    /// The key's wire value.
    pub pk: Json,
    /// The complete row, keyed by field ID.
    pub row: Json,
    /// Its opaque server version (the local compare-and-swap base).
    pub server_version: String,
    /// Its row digest, recomputed.
    pub digest: [u8; 32],
}

/// One verified scope: its entry of the export manifest, its rows in identity order and its
/// continuation receipt.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedScope {
    /// The manifest entry.
    pub scope: ExportScope,
    /// The rows, in unsigned canonical row-identity order.
    pub records: Vec<SeedRecord>,
    /// The `sc1.` receipt.
    pub receipt: String,
}

/// An export whose every check passed.
#[derive(Debug, Clone)]
pub struct VerifiedExport {
    /// The schema manifest the rows are under.
    pub manifest: Manifest,
    /// The export manifest.
    pub export: ExportManifest,
    /// Its hash.
    pub export_manifest_hash: [u8; 32],
    /// The scopes, in the export manifest's order.
    pub scopes: Vec<VerifiedScope>,
}

/// What one scope's pages were: each page's token as presented and the page as returned.
#[derive(Debug, Clone)]
pub struct ScopePages {
    /// The scope.
    pub scope_id: String,
    /// (token, page as parsed), in the order they were fetched.
    pub pages: Vec<(String, Json)>,
}

/// How far an export is (for a progress line).
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Rows read in this pass so far.
    pub rows: u64,
    /// Rows in all the scopes.
    pub total: u64,
    /// 1: digests, 2: pages.
    pub pass: u8,
}

/// What an export returned, before [`verify`].
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The served schema manifest (check 1 passed).
    pub manifest: Manifest,
    /// The sealed export manifest (its hash checked).
    pub export: ExportManifest,
    /// Each scope's pages.
    pub pages: Vec<ScopePages>,
}

/// Exports `scopes` (declared portable) with pages of `page_limit` records, on `db` (a seed
/// login's connection), and verifies everything before returning it. `progress` is called
/// after each scope of the first pass and each page of the second.
pub async fn export(
    db: &mut Client,
    scopes: &[String],
    page_limit: u32,
    progress: impl FnMut(Progress),
) -> Result<VerifiedExport, SeedError> {
    let f = fetch(db, scopes, page_limit, progress).await?;
    verify(f.manifest, f.export, scopes, &f.pages)
}

/// The database side of [`export`]: both passes in one transaction, nothing verified
/// beyond the served manifest's hash and the export manifest's.
pub async fn fetch(
    db: &mut Client,
    scopes: &[String],
    page_limit: u32,
    mut progress: impl FnMut(Progress),
) -> Result<Fetched, SeedError> {
    let tx = db
        .build_transaction()
        .isolation_level(IsolationLevel::Serializable)
        .read_only(true)
        .deferrable(true)
        .start()
        .await?;
    let facts: String = tx
        .query_one(
            "SELECT synchro.synchro_seed_export_begin($1, $2)::text",
            &[&scopes, &(page_limit as i32)],
        )
        .await?
        .get(0);
    let facts = Json::parse(&facts).map_err(|_| unverified("the export's facts are not JSON"))?;
    let manifest = served_manifest(&tx, &facts).await?;
    let Some(Json::Array(entries)) = facts.get("scopes") else {
        return Err(unverified("the export's facts have no scopes"));
    };
    let order: Vec<String> = entries
        .iter()
        .map(|e| e.get("scope_id").and_then(Json::as_str).map(str::to_owned))
        .collect::<Option<_>>()
        .ok_or(unverified("a scope of the facts has no ID"))?;
    let total = entries
        .iter()
        .filter_map(|e| e.get("cardinality").and_then(Json::as_str))
        .filter_map(|c| c.parse::<u64>().ok())
        .sum();

    // Pass 1: each scope's digest from the rows of this snapshot.
    let (mut digests, mut counts) = (Vec::new(), Vec::new());
    let mut done = 0;
    for scope in &order {
        let rows = tx
            .query(
                "SELECT table_id, pk, row_json, server_version FROM synchro.synchro_seed_scope_rows($1)",
                &[scope],
            )
            .await?;
        let mut digested = Vec::with_capacity(rows.len());
        for r in &rows {
            let record = record(&manifest, r.get(0), r.get(1), r.get(2), r.get(3))?;
            let identity = identity(&manifest, &record)?;
            digested.push((identity, record.digest));
        }
        let d = scope_digest(&manifest.schema_hash(), scope, &mut digested, false)
            .map_err(|_| unverified("a scope holds one row twice"))?;
        digests.push(hex::encode(d.digest));
        counts.push(rows.len() as i64);
        done += rows.len() as u64;
        progress(Progress {
            rows: done,
            total,
            pass: 1,
        });
    }
    let sealed: String = tx
        .query_one(
            "SELECT synchro.synchro_seed_export_seal($1, $2)::text",
            &[&digests, &counts],
        )
        .await?
        .get(0);
    let sealed = Json::parse(&sealed).map_err(|_| unverified("the sealed export is not JSON"))?;
    let export = ExportManifest::from_json(sealed.get("manifest").unwrap_or(&Json::Null))
        .map_err(|_| unverified("the export manifest does not parse"))?;
    let hash = export.hash();
    if sealed.get("export_manifest_hash").and_then(Json::as_str) != Some(&hex::encode(hash)) {
        return Err(unverified("the export manifest does not match its hash"));
    }

    // Pass 2: every page of every scope, each token as the database issued it.
    let mut pages = Vec::with_capacity(order.len());
    let mut done = 0;
    for scope in &order {
        let mut token = sealed
            .get("page_tokens")
            .and_then(|t| t.get(scope))
            .and_then(Json::as_str)
            .ok_or(unverified("a scope has no first page token"))?
            .to_owned();
        let mut fetched = ScopePages {
            scope_id: scope.clone(),
            pages: Vec::new(),
        };
        loop {
            let text: String = tx
                .query_one("SELECT synchro.synchro_seed_page($1)", &[&token])
                .await?
                .get(0);
            let page = Json::parse(&text).map_err(|_| unverified("a page is not JSON"))?;
            let next = page
                .get("next_page_token")
                .and_then(Json::as_str)
                .map(str::to_owned);
            if let Some(Json::Array(records)) = page.get("records") {
                done += records.len() as u64;
            }
            fetched.pages.push((token, page));
            progress(Progress {
                rows: done,
                total,
                pass: 2,
            });
            match next {
                Some(t) => token = t,
                None => break,
            }
        }
        pages.push(fetched);
    }
    tx.commit().await?;
    Ok(Fetched {
        manifest,
        export,
        pages,
    })
}

/// Check 1: the schema manifest the facts name, whose body must match its declared hash.
async fn served_manifest(
    tx: &tokio_postgres::Transaction<'_>,
    facts: &Json,
) -> Result<Manifest, SeedError> {
    let version: i64 = facts
        .get("schema_version")
        .and_then(Json::as_str)
        .and_then(|v| v.parse().ok())
        .ok_or(unverified("the facts have no schema version"))?;
    let hash = facts
        .get("schema_hash")
        .and_then(Json::as_str)
        .ok_or(unverified("the facts have no schema hash"))?;
    let row = tx
        .query_opt(
            "SELECT body, schema_hash FROM synchro.synchro_manifest_history() WHERE schema_version = $1",
            &[&version],
        )
        .await?
        .ok_or(unverified("the served manifest is not in the history"))?;
    let manifest = Manifest::parse(row.get(0))
        .map_err(|_| unverified("the served manifest does not validate"))?;
    if manifest.schema_hash_hex() != hash || row.get::<_, &str>(1) != hash {
        return Err(unverified(
            "the served manifest does not match its schema hash",
        ));
    }
    Ok(manifest)
}

/// Check 4 for one row: a supported table, a key of its type, an opaque version, and a row
/// digest that recomputes over that version.
fn record(
    manifest: &Manifest,
    table_id: &str,
    pk: &str,
    row: &str,
    server_version: &str,
) -> Result<SeedRecord, SeedError> {
    let pk = Json::parse(pk).map_err(|_| unverified("a key is not JSON"))?;
    let row = Json::parse(row).map_err(|_| unverified("a row is not JSON"))?;
    if server_version.is_empty() {
        return Err(unverified("a row has no server version"));
    }
    let d = row_digest(manifest, table_id, &pk, &row, server_version)
        .map_err(|_| unverified("a row does not match its table"))?;
    Ok(SeedRecord {
        table_id: table_id.to_owned(),
        pk,
        row,
        server_version: server_version.to_owned(),
        digest: d.digest,
    })
}

fn identity(manifest: &Manifest, r: &SeedRecord) -> Result<RowIdentity, SeedError> {
    let table = manifest
        .table(&r.table_id)
        .ok_or(unverified("a row names an unknown table"))?;
    let key = synchro_protocol::value::TypedValue::from_wire(&table.primary_key().spec, &r.pk)
        .map_err(|_| unverified("a key does not match its type"))?;
    RowIdentity::new(table, &key).map_err(|_| unverified("a key cannot form a row identity"))
}

/// Checks 2 to 7 of spec 001 over what an export returned: the scope set is exactly the one
/// requested; every page is bound to this export, schema, scope, generations, boundary and
/// the next ordinal expected; every row recomputes its digest; identities strictly ordered
/// with no page missing; each scope's cardinality and digest as the export manifest says;
/// each receipt bound to the same schema, scope, generations, boundary, cardinality and
/// digest.
pub fn verify(
    manifest: Manifest,
    export: ExportManifest,
    requested: &[String],
    pages: &[ScopePages],
) -> Result<VerifiedExport, SeedError> {
    let hash = export.hash();
    // Check 2: the exact scope set.
    let requested_set: BTreeSet<&str> = requested.iter().map(String::as_str).collect();
    let exported: Vec<&str> = export.scopes.iter().map(|s| s.scope_id.as_str()).collect();
    if requested_set.len() != requested.len()
        || exported.iter().copied().collect::<BTreeSet<_>>() != requested_set
        || exported.len() != requested.len()
    {
        return Err(unverified("the exported scopes are not the requested ones"));
    }
    if manifest.schema_hash() != export.schema_hash
        || manifest.schema_version != export.schema_version
    {
        return Err(unverified("the export is of another schema"));
    }
    if pages.len() != export.scopes.len() {
        return Err(unverified("a scope's pages are missing"));
    }
    let mut scopes = Vec::with_capacity(export.scopes.len());
    for (scope, fetched) in export.scopes.iter().zip(pages) {
        if fetched.scope_id != scope.scope_id {
            return Err(unverified("pages of another scope"));
        }
        scopes.push(verify_scope(&manifest, &export, scope, fetched)?);
    }
    Ok(VerifiedExport {
        manifest,
        export,
        export_manifest_hash: hash,
        scopes,
    })
}

/// Checks 3 to 7 for one scope.
fn verify_scope(
    manifest: &Manifest,
    export: &ExportManifest,
    scope: &ExportScope,
    fetched: &ScopePages,
) -> Result<VerifiedScope, SeedError> {
    let limit = export.page_limit;
    // What every page token and the receipt of this scope must bind.
    let binding = export.binding(scope);
    let mut digester =
        ScopeDigester::new(&manifest.schema_hash(), &scope.scope_id, scope.cardinality)
            .map_err(|_| unverified("a scope digest cannot start"))?;
    let mut records = Vec::with_capacity(scope.cardinality as usize);
    let mut last: Option<RowIdentity> = None;
    let mut receipt = None;
    for (i, (token, page)) in fetched.pages.iter().enumerate() {
        if receipt.is_some() {
            return Err(unverified("a page follows the final page"));
        }
        // Check 3: the page's bindings.
        let bound = SeedPage::read_unverified(token)
            .map_err(|_| unverified("a page token does not read"))?;
        let expected_ordinal = i as u64 * limit;
        if bound.binding != binding
            || bound.page_limit != limit
            || bound.next_row_ordinal != expected_ordinal
        {
            return Err(unverified(
                "a page is not bound to this export at its ordinal",
            ));
        }
        let Some(Json::Array(items)) = page.get("records") else {
            return Err(unverified("a page has no records"));
        };
        for item in items {
            let text_of = |name| item.get(name).and_then(Json::as_str);
            let (Some(table_id), Some(pk), Some(row), Some(version)) = (
                text_of("table_id"),
                item.get("pk"),
                item.get("row"),
                text_of("server_version"),
            ) else {
                return Err(unverified("a record lacks a member"));
            };
            // Check 4: the row, its version and its digest.
            if version.is_empty() {
                return Err(unverified("a row has no server version"));
            }
            let d = row_digest(manifest, table_id, pk, row, version)
                .map_err(|_| unverified("a row does not match its table"))?;
            // Check 5: strictly ordered identities.
            if last.as_ref().is_some_and(|l| l >= &d.identity) {
                return Err(unverified("rows are not in strict identity order"));
            }
            digester
                .add(&d.identity, &d.digest)
                .map_err(|_| unverified("a scope holds more rows than its cardinality"))?;
            last = Some(d.identity);
            records.push(SeedRecord {
                table_id: table_id.to_owned(),
                pk: pk.clone(),
                row: row.clone(),
                server_version: version.to_owned(),
                digest: d.digest,
            });
        }
        let full = items.len() as u64 == limit;
        match (page.get("next_page_token"), page.get("receipt")) {
            (Some(Json::String(_)), None) if full => {}
            (None, Some(Json::String(r))) => receipt = Some(r.clone()),
            _ => {
                return Err(unverified(
                    "a page ends neither with a full page nor a receipt",
                ))
            }
        }
    }
    // Check 5 (no page missing) and 6: cardinality and digest.
    let receipt = receipt.ok_or(unverified("the scope's final page is missing"))?;
    if records.len() as u64 != scope.cardinality {
        return Err(unverified("a scope's rows are not its cardinality"));
    }
    let digest = digester
        .finish()
        .map_err(|_| unverified("a scope's rows are not its cardinality"))?;
    if Checksum(digest.digest) != scope.checksum {
        return Err(unverified("a scope's rows do not match its digest"));
    }
    // Check 7: the receipt's bindings.
    let r = SeedReceipt::read_unverified(&receipt)
        .map_err(|_| unverified("a receipt does not read"))?;
    if r.binding != binding || r.cardinality != scope.cardinality || r.checksum != scope.checksum {
        return Err(unverified("a receipt does not match its scope"));
    }
    Ok(VerifiedScope {
        scope: scope.clone(),
        records,
        receipt,
    })
}

/// The evidence of a published artifact (spec 001 check 10), written beside it as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// SHA-256 of the artifact's bytes (hex).
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
    /// The schema reference.
    pub schema_version: u64,
    /// The schema hash (hex).
    pub schema_hash: String,
    /// (scope, cardinality, digest hex), in byte order of the scopes.
    pub scopes: Vec<(String, u64, String)>,
    /// The export the receipts name (one per artifact).
    pub export_id: String,
    /// The stream generation of the export.
    pub stream_generation: u64,
    /// Where the export's snapshot ends (every scope's receipt names it).
    pub boundary: SnapshotBoundary,
}

impl Evidence {
    /// The evidence as JSON (the export's identity and boundary as its receipts name them).
    pub fn to_json(&self) -> serde_json::Value {
        let boundary: serde_json::Value = serde_json::from_str(
            &synchro_protocol::jcs::to_output_string(&self.boundary.to_json()),
        )
        .expect("a boundary is JSON");
        serde_json::json!({
            "sha256": self.sha256,
            "bytes": self.bytes,
            "schema": {"version": self.schema_version, "hash": self.schema_hash},
            "export_id": self.export_id,
            "stream_generation": self.stream_generation,
            "scopes": self.scopes.iter().map(|(s, n, d)| serde_json::json!({
                "scope_id": s, "cardinality": n, "digest": d, "boundary": boundary,
            })).collect::<Vec<_>>(),
        })
    }
}

fn artifact_error(e: synchro_client::store::StorageError) -> SeedError {
    match e {
        synchro_client::store::StorageError::Verification(what)
        | synchro_client::store::StorageError::Seed(what) => SeedError::Verification(what),
        other => SeedError::Database(format!("the artifact: {other}")),
    }
}

/// Writes a verified export as a seed artifact at `out` (spec 001 checks 8 to 10): a fresh
/// SQLite database written with the client's own store beside it (`<out>.tmp`), closed off
/// its write-ahead log, then checked as a recipient would ([`verify_artifact`]); only when
/// every check passed is it renamed to `out` and its evidence written to
/// [`evidence_path`]`(out)`. Any failure removes the temporary file and publishes nothing.
pub fn write_artifact(
    export: &VerifiedExport,
    out: &std::path::Path,
) -> Result<Evidence, SeedError> {
    let tmp = sidecar(out, ".tmp");
    remove_with_sidecars(&tmp);
    let result = (|| {
        // The exporter checked every row digest (check 4): the install reuses them, and the
        // artifact is checked again from its values below (check 9).
        let rows: Vec<Vec<synchro_client::store::seed::SeedRow<'_>>> = export
            .scopes
            .iter()
            .map(|s| {
                s.records
                    .iter()
                    .map(|r| synchro_client::store::seed::SeedRow {
                        table_id: &r.table_id,
                        pk: &r.pk,
                        row: &r.row,
                        server_version: &r.server_version,
                        digest: Some(r.digest),
                    })
                    .collect()
            })
            .collect();
        let scopes: Vec<synchro_client::store::seed::SeedScope<'_>> = export
            .scopes
            .iter()
            .zip(&rows)
            .map(|(s, rows)| synchro_client::store::seed::SeedScope {
                rows,
                receipt: &s.receipt,
            })
            .collect();
        let mut storage =
            synchro_client::store::Storage::create_artifact(&tmp).map_err(artifact_error)?;
        storage
            .install_seed(&export.manifest, &scopes)
            .map_err(artifact_error)?;
        storage.close_as_artifact().map_err(artifact_error)?;
        let evidence = verify_artifact(&tmp)?;
        let expected: Vec<(String, u64, String)> = export
            .scopes
            .iter()
            .map(|s| {
                (
                    s.scope.scope_id.clone(),
                    s.scope.cardinality,
                    hex::encode(s.scope.checksum.0),
                )
            })
            .collect();
        if evidence.scopes != expected || evidence.schema_hash != export.manifest.schema_hash_hex()
        {
            return Err(unverified("the artifact does not hold the export"));
        }
        std::fs::rename(&tmp, out).map_err(|e| SeedError::Database(format!("publishing: {e}")))?;
        std::fs::write(evidence_path(out), format!("{:#}\n", evidence.to_json()))
            .map_err(|e| SeedError::Database(format!("writing the evidence: {e}")))?;
        Ok(evidence)
    })();
    if result.is_err() {
        remove_with_sidecars(&tmp);
    }
    result
}

/// Checks a seed artifact offline, as its recipient would (spec 001 checks 9 and 10): it
/// opens read-only, passes SQLite's integrity check, holds no queued mutation and no
/// cursor, every row digest recomputes from its values and version, each scope digests to
/// its receipt, and no WAL or shared-memory file is beside it. Returns its evidence.
pub fn verify_artifact(path: &std::path::Path) -> Result<Evidence, SeedError> {
    for suffix in ["-wal", "-shm", "-journal"] {
        if sidecar(path, suffix).exists() {
            return Err(unverified("the artifact has a sidecar file"));
        }
    }
    let bytes = std::fs::read(path).map_err(|e| SeedError::Database(format!("reading: {e}")))?;
    let (summary, manifest, binding) = {
        let storage =
            synchro_client::store::Storage::open_read_only(path).map_err(artifact_error)?;
        let summary = storage.verify_seed().map_err(artifact_error)?;
        let manifest = storage
            .active_schema()
            .map_err(artifact_error)?
            .ok_or(unverified("the artifact has no schema"))?;
        // The export's identity and boundary, as its receipts (all of one export) name them.
        let mut bindings = storage
            .seed_receipts()
            .map_err(artifact_error)?
            .into_iter()
            .map(|(_, r)| {
                SeedReceipt::read_unverified(&r)
                    .map(|r| r.binding)
                    .map_err(|_| unverified("a receipt does not read"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let binding = bindings
            .pop()
            .ok_or(unverified("the artifact has no scope"))?;
        if bindings.iter().any(|b| {
            (&b.export_id, b.stream_generation, &b.snapshot_boundary)
                != (
                    &binding.export_id,
                    binding.stream_generation,
                    &binding.snapshot_boundary,
                )
        }) {
            return Err(unverified(
                "the artifact's receipts are of different exports",
            ));
        }
        (summary, manifest, binding)
    };
    for suffix in ["-wal", "-shm"] {
        if sidecar(path, suffix).exists() {
            return Err(unverified("the artifact needs a sidecar file"));
        }
    }
    use sha2::Digest as _;
    Ok(Evidence {
        sha256: hex::encode(sha2::Sha256::digest(&bytes)),
        bytes: bytes.len() as u64,
        schema_version: manifest.schema_version,
        schema_hash: manifest.schema_hash_hex(),
        scopes: summary
            .scopes
            .into_iter()
            .map(|(s, n, d)| (s, n, hex::encode(d)))
            .collect(),
        export_id: binding.export_id,
        stream_generation: binding.stream_generation,
        boundary: binding.snapshot_boundary,
    })
}

/// Where the evidence of the artifact `out` goes: `board.seed.sqlite` → `board.seed.json`.
pub fn evidence_path(out: &std::path::Path) -> std::path::PathBuf {
    match out.extension().and_then(|e| e.to_str()) {
        Some("sqlite") => out.with_extension("json"),
        _ => sidecar(out, ".json"),
    }
}

/// `path` with `suffix` appended to its file name.
fn sidecar(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    std::path::PathBuf::from(name)
}

fn remove_with_sidecars(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(sidecar(path, suffix));
    }
}
