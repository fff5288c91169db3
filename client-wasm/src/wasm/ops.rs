//! What both JS classes (`SynchroClient`, and `LiveSession` between two requests) do with
//! a client: read-only queries and the tables they read, the schema state, local writes, and
//! the queue's mutations.

use js_sys::{Array, Object, Reflect};
use synchro_protocol::json::Json;
use synchro_protocol::value::TypedValue;
use wasm_bindgen::prelude::*;

use super::convert::{
    client_error, js_error, js_to_json, mutation_js, set, sql_param, sql_to_js, storage_error,
    strings,
};
use super::fetch::FetchTransport;
use crate::engine::Client;
use crate::error::StorageError;
use crate::natural::natural;
use crate::store::{LocalWrite, Operation};

/// Runs a read-only query; rows come back as objects keyed by column name (INTEGER as a
/// number when it is a safe integer, otherwise a BigInt; BLOB as Uint8Array). Writes to
/// synced tables go through the engine, never through this.
pub(super) fn query(
    client: &Client<FetchTransport>,
    sql: &str,
    params: Option<Array>,
) -> Result<Array, JsValue> {
    let conn = client.storage().connection();
    let mut statement = conn
        .prepare(sql)
        .map_err(|e| storage_error(StorageError::Sqlite(e)))?;
    if !statement.readonly() {
        return Err(js_error(
            "invalid_request",
            "query runs read-only statements only",
            false,
        ));
    }
    let values = params
        .map(|a| a.to_vec())
        .unwrap_or_default()
        .iter()
        .map(sql_param)
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = statement.column_names().map(str::to_owned).collect();
    let mut rows = statement
        .query(rusqlite::params_from_iter(values))
        .map_err(|e| storage_error(StorageError::Sqlite(e)))?;
    let out = Array::new();
    while let Some(r) = rows
        .next()
        .map_err(|e| storage_error(StorageError::Sqlite(e)))?
    {
        let o = Object::new();
        for (i, name) in names.iter().enumerate() {
            let v = r
                .get_ref(i)
                .map_err(|e| storage_error(StorageError::Sqlite(e)))?;
            set(&o, name, sql_to_js(v));
        }
        out.push(&o);
    }
    Ok(out)
}

/// See [`super::SynchroClient::read_tables`].
pub(super) fn read_tables(client: &Client<FetchTransport>, sql: &str) -> Result<JsValue, JsValue> {
    let sqlite = |e| storage_error(StorageError::Sqlite(e));
    let conn = client.storage().connection();
    if !conn.prepare(sql).map_err(sqlite)?.readonly() {
        return Err(js_error(
            "invalid_request",
            "query runs read-only statements only",
            false,
        ));
    }
    let mut roots = std::collections::HashMap::new();
    let mut schema = conn
        .prepare("SELECT rootpage, tbl_name FROM main.sqlite_schema WHERE rootpage > 0")
        .map_err(sqlite)?;
    let mut rows = schema.query([]).map_err(sqlite)?;
    while let Some(r) = rows.next().map_err(sqlite)? {
        roots.insert(
            r.get::<_, i64>(0).map_err(sqlite)?,
            r.get::<_, String>(1).map_err(sqlite)?,
        );
    }
    roots.insert(1, "sqlite_schema".to_owned());
    // EXPLAIN's columns: addr, opcode, p1, p2, p3, p4, p5, comment.
    let mut explain = conn.prepare(&format!("EXPLAIN {sql}")).map_err(sqlite)?;
    // The program does not depend on the parameters' values: bind NULL to each.
    for i in 1..=explain.parameter_count() {
        explain
            .raw_bind_parameter(i, rusqlite::types::Null)
            .map_err(sqlite)?;
    }
    let mut ops = explain.raw_query();
    let mut tables = std::collections::BTreeSet::new();
    while let Some(r) = ops.next().map_err(sqlite)? {
        let opcode: String = r.get(1).map_err(sqlite)?;
        match opcode.as_str() {
            "OpenRead" | "ReopenIdx" => {
                let (root, db): (i64, i64) = (r.get(3).map_err(sqlite)?, r.get(4).map_err(sqlite)?);
                match roots.get(&root) {
                    Some(name) if db == 0 => {
                        tables.insert(name.clone());
                    }
                    // Another attached database, or a table the schema does not name.
                    _ => return Ok(JsValue::NULL),
                }
            }
            "VOpen" => return Ok(JsValue::NULL),
            _ => {}
        }
    }
    Ok(strings(tables).into())
}

/// See [`super::SynchroClient::schema`].
pub(super) fn schema(client: &Client<FetchTransport>) -> JsValue {
    let o = Object::new();
    set(&o, "state", client.state().as_str().into());
    set(
        &o,
        "version",
        (client.manifest().map_or(0, |m| m.schema_version) as f64).into(),
    );
    set(
        &o,
        "action",
        client
            .last_action()
            .map_or(JsValue::NULL, |a| JsValue::from(a.as_str())),
    );
    o.into()
}

/// Writes to the synced table `table` and queues the intent in one transaction.
/// `operation` is `insert`, `update` or `delete`; `pk` and the values of `columns` (an
/// object keyed by field name, in the order the fields should be recorded; a `null` is
/// a present null) are wire values (int64 and decimal as strings). Resolves to the
/// mutation ID; with `mutation_id`, at most once under it ([`Client::write_once`]).
pub(super) fn write(
    client: &mut Client<FetchTransport>,
    table: &str,
    operation: &str,
    pk: &JsValue,
    columns: &JsValue,
    mutation_id: Option<&str>,
) -> Result<String, JsValue> {
    let bad = |what: &str| js_error("invalid_value", what, false);
    let manifest = client
        .manifest()
        .cloned()
        .ok_or_else(|| js_error("local_schema_error", "no schema is installed", false))?;
    let t = manifest
        .tables
        .iter()
        .find(|t| t.name == *table)
        .ok_or_else(|| js_error("unknown_table", "no such synced table", false))?;
    let key_spec = &t.primary_key().spec;
    let key = TypedValue::from_wire(key_spec, &natural(key_spec.ty, js_to_json(pk)?))
        .map_err(|_| bad("the key does not match its type"))?;
    let mut values = Vec::new();
    if !columns.is_undefined() && !columns.is_null() {
        let Json::Object(members) = js_to_json(columns)? else {
            return Err(bad("columns must be an object"));
        };
        for (name, value) in members {
            let f = t
                .fields
                .iter()
                .find(|f| f.name == name)
                .ok_or_else(|| bad(&format!("no such field: {name}")))?;
            let v = TypedValue::from_wire(&f.spec, &natural(f.spec.ty, value)).map_err(|_| {
                bad(&format!(
                    "field {name}: the value is not a {}",
                    f.spec.ty.as_str()
                ))
            })?;
            values.push((f.field_id.clone(), v));
        }
    }
    let operation = Operation::parse(operation)
        .ok_or_else(|| bad("operation must be insert, update or delete"))?;
    let table_id = t.table_id.clone();
    let w = LocalWrite {
        table_id: &table_id,
        operation,
        pk: &key,
        columns: &values,
    };
    match mutation_id {
        Some(id) => client.write_once(&w, id),
        None => client.write(&w),
    }
    .map_err(|e| match &e {
        // The app's names, not field IDs (which stay in the queue and on the wire).
        crate::error::ClientError::Storage(
            StorageError::InvalidValue { field_id } | StorageError::MissingValue { field_id },
        ) => match t.fields.iter().find(|f| f.field_id == *field_id) {
            Some(f) => bad(&e.to_string().replace(field_id.as_str(), &f.name)),
            None => client_error(e),
        },
        _ => client_error(e),
    })
}

/// The resolved mutations, read (as `mutations` gives them) and cleared at one step, so a
/// caller that reports state changes learns the last state of each one it clears.
pub(super) fn clear_resolved(client: &mut Client<FetchTransport>) -> Result<Array, JsValue> {
    let resolved: Array = mutations(client)?
        .iter()
        .filter(|m| {
            Reflect::get(m, &"state".into())
                .ok()
                .and_then(|s| s.as_string())
                .is_some_and(|s| s != "pending")
        })
        .collect();
    let n = client.clear_resolved().map_err(client_error)?;
    debug_assert_eq!(n, resolved.length() as usize);
    Ok(resolved)
}

/// Every queued mutation in local order with its state (`pending`, `applied`,
/// `conflict`, `rejected_terminal`), for inspection.
pub(super) fn mutations(client: &Client<FetchTransport>) -> Result<Array, JsValue> {
    let out = Array::new();
    for q in client.storage().mutations().map_err(storage_error)? {
        let outcome = client
            .storage()
            .outcome(&q.mutation.mutation_id)
            .map_err(storage_error)?;
        out.push(&mutation_js(&q, outcome, client.manifest()));
    }
    Ok(out)
}
