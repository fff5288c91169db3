//! Local client benchmarks that run the same code natively and in the browser (feature
//! `bench`): verified pull application against a raw insert of the same rows into the same
//! SQLite in one transaction (measured in the same run), and a Class 2 replace over a large
//! table (the migration transaction, which keeps the rows and digests them again under the
//! target schema).
//!
//! Pages and checksums are prepared before timing with `synchro_protocol::digest`; the
//! timed part is only what a client does when pages arrive. The clock is injected
//! (`Instant` natively, `performance.now()` in a worker).

use std::collections::BTreeSet;

use rusqlite::params;
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::value::{Scalar, TypedValue};

use crate::engine::{Client, ClientError, SchemaActionKind};
use crate::store::{Storage, StorageError};
use crate::transport::{Response, Transport, TransportError};

const SCOPE: &str = "bench";

fn items_table(extra: &str) -> String {
    format!(
        r#"{{"table_id":"tbl_items","relation_id":"rel_items","name":"items","composition":"multi_scope","primary_key_field_id":"f1","lifecycle":{{"created_at_field_id":null,"updated_at_field_id":null,"deleted_at_field_id":null}},"fields":[{{"field_id":"f1","name":"id","type":"int","nullable":false,"writable":false}},{{"field_id":"f2","name":"val","type":"int","nullable":true,"writable":true}},{{"field_id":"f3","name":"name","type":"string","nullable":true,"writable":true}},{{"field_id":"f4","name":"score","type":"float","nullable":true,"writable":true}},{{"field_id":"f5","name":"flag","type":"boolean","nullable":true,"writable":true}}{extra}],"indexes":[]}}"#
    )
}

/// The benchmark manifest: `items(id int, val int, name text, score float, flag boolean)`.
pub fn items_manifest() -> Manifest {
    Manifest::parse(&format!(
        r#"{{"schema_version":1,"parent_schema":null,"transition_class":"initial","compatibility_floor":1,"tables":[{}]}}"#,
        items_table("")
    ))
    .expect("a valid manifest")
}

/// Its Class 2 successor: one more nullable field.
pub fn items_manifest_v2(parent: &Manifest) -> Manifest {
    Manifest::parse(&format!(
        r#"{{"schema_version":2,"parent_schema":{{"version":1,"hash":"{}"}},"transition_class":"class_2","compatibility_floor":1,"tables":[{}]}}"#,
        parent.schema_hash_hex(),
        items_table(r#",{"field_id":"f6","name":"note","type":"string","nullable":true,"writable":true}"#)
    ))
    .expect("a valid manifest")
}

fn row_json(id: i64) -> String {
    format!(
        r#"{{"f1":{id},"f2":{},"f3":"item {id}","f4":{}.5,"f5":{}}}"#,
        id % 1000,
        id % 97,
        id % 2 == 0
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Pull pages of `page` upserts covering rows `0..rows`, the last one terminal with the
/// scope checksum.
pub fn pull_pages(m: &Manifest, rows: i64, page: i64) -> Vec<Json> {
    let table = m.table("tbl_items").expect("items");
    let mut entries = Vec::new();
    let mut pages = Vec::new();
    let mut changes = Vec::new();
    for id in 0..rows {
        let pk = Json::Number(id.to_string());
        let row = Json::parse(&row_json(id)).expect("row JSON");
        let version = (id + 1).to_string();
        let d = row_digest(m, "tbl_items", &pk, &row, &version).expect("digest");
        let key = TypedValue::from_wire(&table.primary_key().spec, &pk).expect("key");
        entries.push((RowIdentity::new(table, &key).expect("identity"), d.digest));
        changes.push(format!(
            r#"{{"scope_id":"{SCOPE}","table_id":"tbl_items","pk":{id},"op":"upsert","row":{},"server_version":"{version}","row_checksum":{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{}"}}}}"#,
            row_json(id),
            hex(&d.digest)
        ));
        if changes.len() as i64 == page || id == rows - 1 {
            let last = id == rows - 1;
            let mut text = format!(
                r#"{{"protocol_version":3,"scope_set_version":1,"scope_updates":{{"added":[],"removed":[]}},"changes":[{}],"has_more":{},"scope_cursor_updates":{{"{SCOPE}":"c{id}"}},"rebuild_scopes":[]"#,
                changes.join(","),
                !last
            );
            if last {
                let d = scope_digest(&m.schema_hash(), SCOPE, &mut entries, false).expect("scope");
                text.push_str(&format!(
                    r#","checksums":{{"{SCOPE}":{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{}"}}}}"#,
                    hex(&d.digest)
                ));
            }
            text.push('}');
            pages.push(Json::parse(&text).expect("page JSON"));
            changes.clear();
        }
    }
    pages
}

/// Applies `pages` with full verification; returns the seconds taken.
pub fn time_apply(
    storage: &mut Storage,
    m: &Manifest,
    pages: Vec<Json>,
    now: &dyn Fn() -> f64,
) -> Result<f64, StorageError> {
    let assigned = BTreeSet::from([SCOPE.to_owned()]);
    let start = now();
    for p in pages {
        storage.apply_pull(m, p, &assigned)?;
    }
    let secs = now() - start;
    let (_, rebuild) = storage.scope_state(SCOPE)?.unwrap_or((None, true));
    if rebuild {
        return Err(StorageError::Verification(
            "the benchmark scope did not verify",
        ));
    }
    Ok(secs)
}

/// Applies an empty terminal page carrying `last`'s checksums again (what every idle pull
/// costs the client: the scope digest recomputed from the local rows); returns seconds.
pub fn time_terminal(
    storage: &mut Storage,
    m: &Manifest,
    last: &Json,
    now: &dyn Fn() -> f64,
) -> Result<f64, StorageError> {
    let checksums = last.get("checksums").cloned().unwrap_or(Json::Null);
    let page = Json::Object(vec![
        ("protocol_version".into(), Json::Number("3".into())),
        ("scope_set_version".into(), Json::Number("1".into())),
        (
            "scope_updates".into(),
            Json::Object(vec![
                ("added".into(), Json::Array(vec![])),
                ("removed".into(), Json::Array(vec![])),
            ]),
        ),
        ("changes".into(), Json::Array(vec![])),
        ("has_more".into(), Json::Bool(false)),
        ("scope_cursor_updates".into(), Json::Object(vec![])),
        ("rebuild_scopes".into(), Json::Array(vec![])),
        ("checksums".into(), checksums),
    ]);
    let assigned = BTreeSet::from([SCOPE.to_owned()]);
    let start = now();
    let applied = storage.apply_pull(m, page, &assigned)?;
    let secs = now() - start;
    if !applied.verified.contains(SCOPE) {
        return Err(StorageError::Verification(
            "the benchmark scope did not verify",
        ));
    }
    Ok(secs)
}

/// Inserts the same rows raw in one transaction (the baseline); returns the seconds taken.
pub fn time_raw_insert(
    storage: &mut Storage,
    rows: i64,
    now: &dyn Fn() -> f64,
) -> Result<f64, StorageError> {
    let start = now();
    let tx = storage.conn_mut().transaction()?;
    {
        let mut q =
            tx.prepare("INSERT INTO items (id, val, name, score, flag) VALUES (?, ?, ?, ?, ?)")?;
        for id in 0..rows {
            q.execute(params![
                id,
                id % 1000,
                format!("item {id}"),
                (id % 97) as f64 + 0.5,
                id % 2 == 0
            ])?;
        }
    }
    tx.commit()?;
    Ok(now() - start)
}

/// Answers connect with `replace` to a fixed manifest (reissuing the presented cursor).
struct Replace(Manifest);

impl Transport for Replace {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        assert_eq!(path, "/sync/connect", "the replace benchmark only connects");
        let req = Json::parse(&body).map_err(|_| TransportError("bad request".into()))?;
        let cursors = match req.get("scope_cursors") {
            Some(Json::Object(m)) => m
                .iter()
                .map(|(k, _)| format!(r#""{k}":"reissued""#))
                .collect::<Vec<_>>()
                .join(","),
            _ => String::new(),
        };
        let added = if cursors.is_empty() {
            format!(r#""{SCOPE}""#)
        } else {
            String::new()
        };
        let text = format!(
            r#"{{"protocol_version":3,"client_generation":1,"scope_set_version":1,"scope_updates":{{"added":[{added}],"removed":[]}},"schema":{{"version":{},"hash":"{}","action":"replace"}},"schema_definition":{},"scope_cursor_updates":{{{cursors}}}}}"#,
            self.0.schema_version,
            self.0.schema_hash_hex(),
            to_output_string(&self.0.definition_json())
        );
        Ok(Response {
            status: 200,
            body: Json::parse(&text).map_err(|_| TransportError("bad response".into()))?,
            scope_rows: None,
        })
    }
}

/// Sets up a client at v1 holding `rows` verified rows, then times the Class 2 replace to
/// v2 through the engine's connect (journal, DDL, digests of every kept row, cursors).
/// Returns (seconds, rows kept).
pub async fn time_class2_replace(
    open: impl Fn() -> Result<Storage, StorageError>,
    rows: i64,
    now: &dyn Fn() -> f64,
) -> Result<(f64, i64), String> {
    let v1 = items_manifest();
    let v2 = items_manifest_v2(&v1);
    let e = |e: ClientError| e.to_string();
    let mut c = Client::open(
        open().map_err(|e| e.to_string())?,
        Replace(v1.clone()),
        || [1; 16],
    )
    .map_err(e)?;
    c.connect().await.map_err(e)?;
    let mut storage = c.into_storage();
    // Fill v1 directly (the rows a client would hold after syncing): rows, versions,
    // provenance, a verified cursor. Their digests are placeholders: the replace
    // recomputes every one under v2 anyway.
    let row = |id: i64| {
        let values = [
            Scalar::Int(id as i32),
            Scalar::Int((id % 1000) as i32),
            Scalar::String(format!("item {id}")),
            Scalar::Float((id % 97) as f64 + 0.5),
            Scalar::Boolean(id % 2 == 0),
        ];
        let values = values
            .into_iter()
            .map(|s| TypedValue::from_scalar(s).expect("a valid value"))
            .collect();
        (values, (id + 1).to_string())
    };
    storage
        .seed_synced_rows(&v1, "tbl_items", SCOPE, (0..rows).map(row))
        .map_err(|e| e.to_string())?;
    let mut c = Client::open(storage, Replace(v2), || [1; 16]).map_err(e)?;
    let start = now();
    let (action, _) = c.connect().await.map_err(e)?;
    let secs = now() - start;
    if action != SchemaActionKind::Replace || c.manifest().map(|m| m.schema_version) != Some(2) {
        return Err("the replace did not install v2".into());
    }
    let kept = c.storage().digested_rows().map_err(|e| e.to_string())?;
    Ok((secs, kept))
}

/// Runs everything and returns printable lines.
pub async fn run(
    open: impl Fn() -> Result<Storage, StorageError>,
    rows: i64,
    replace_rows: i64,
    now: &dyn Fn() -> f64,
) -> Result<Vec<String>, String> {
    let m = items_manifest();
    let pages = pull_pages(&m, rows, 1000);
    let last = pages.last().expect("pages").clone();
    let s = |e: StorageError| e.to_string();
    let mut applied = open().map_err(s)?;
    applied.install(&m).map_err(s)?;
    let apply_secs = time_apply(&mut applied, &m, pages, now).map_err(s)?;
    let terminal_secs = time_terminal(&mut applied, &m, &last, now).map_err(s)?;
    drop(applied);
    let mut raw = open().map_err(s)?;
    raw.install(&m).map_err(s)?;
    let raw_secs = time_raw_insert(&mut raw, rows, now).map_err(s)?;
    drop(raw);
    let (replace_secs, kept) = time_class2_replace(&open, replace_rows, now).await?;
    Ok(vec![
        format!(
            "verified pull apply: {rows} rows in {:.3} s = {:.0} rows/s",
            apply_secs,
            rows as f64 / apply_secs
        ),
        format!(
            "raw insert (one transaction, same SQLite): {:.0} rows/s",
            rows as f64 / raw_secs
        ),
        format!("ratio verified/raw: {:.3}x", raw_secs / apply_secs),
        format!(
            "terminal verification of the {rows}-row scope (an idle pull): {:.1} ms",
            terminal_secs * 1000.0
        ),
        format!(
            "Class 2 replace of a {replace_rows}-row table: {:.3} s ({kept} rows kept and digested again, nothing downloaded)",
            replace_secs
        ),
    ])
}
