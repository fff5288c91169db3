//! Conversions between JS values and the crate's: errors as JS `Error` objects with a
//! stable `code`, SQL parameters and results, wire JSON, and a queued mutation as the object
//! `mutations()` gives.

use js_sys::{Array, Object, Reflect, Uint8Array};
use rusqlite::types::{Value, ValueRef};
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::{ClientError, StorageError};
use crate::natural::named;
use crate::store::QueuedMutation;

pub(super) fn js_error(code: &str, message: &str, retryable: bool) -> JsValue {
    let e = js_sys::Error::new(message);
    let _ = Reflect::set(&e, &"code".into(), &code.into());
    let _ = Reflect::set(&e, &"retryable".into(), &retryable.into());
    e.into()
}

pub(super) fn client_error(e: ClientError) -> JsValue {
    let error = js_error(e.code(), &e.to_string(), e.retryable());
    if let Some(reason) = e.upgrade_reason() {
        let _ = Reflect::set(&error, &"reason".into(), &reason.as_str().into());
    }
    error
}

pub(super) fn storage_error(e: StorageError) -> JsValue {
    js_error(e.code(), &e.to_string(), false)
}

pub(super) fn set(o: &Object, k: &str, v: JsValue) {
    let _ = Reflect::set(o, &k.into(), &v);
}

/// A wire value as the JS value `JSON.parse` gives for its text.
pub(super) fn json_to_js(v: &Json) -> JsValue {
    js_sys::JSON::parse(&to_output_string(v)).unwrap_or(JsValue::NULL)
}

pub(super) fn strings(items: impl IntoIterator<Item = String>) -> Array {
    items.into_iter().map(JsValue::from).collect()
}

/// A query parameter: null or undefined, a boolean (0 or 1), a string, a BigInt (64-bit), a
/// number (REAL) or a Uint8Array (BLOB).
pub(super) fn sql_param(p: &JsValue) -> Result<Value, JsValue> {
    Ok(if p.is_null() || p.is_undefined() {
        Value::Null
    } else if let Some(b) = p.as_bool() {
        Value::Integer(i64::from(b))
    } else if let Some(s) = p.as_string() {
        Value::Text(s)
    } else if p.is_bigint() {
        let v = i64::try_from(p.clone().unchecked_into::<js_sys::BigInt>())
            .map_err(|_| js_error("invalid_value", "a BigInt parameter is out of range", false))?;
        Value::Integer(v)
    } else if let Some(f) = p.as_f64() {
        Value::Real(f)
    } else if p.is_instance_of::<Uint8Array>() {
        Value::Blob(p.clone().unchecked_into::<Uint8Array>().to_vec())
    } else {
        return Err(js_error(
            "invalid_value",
            "an unsupported parameter type",
            false,
        ));
    })
}

/// A result column's value: INTEGER as a number when it is a safe integer, otherwise a
/// BigInt; BLOB as Uint8Array.
pub(super) fn sql_to_js(v: ValueRef<'_>) -> JsValue {
    match v {
        ValueRef::Null => JsValue::NULL,
        ValueRef::Integer(i) if i.unsigned_abs() < (1 << 53) => (i as f64).into(),
        ValueRef::Integer(i) => js_sys::BigInt::from(i).into(),
        ValueRef::Real(f) => f.into(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
        ValueRef::Blob(b) => Uint8Array::from(b).into(),
    }
}

/// A JS value as wire JSON (through `JSON.stringify`).
pub(super) fn js_to_json(v: &JsValue) -> Result<Json, JsValue> {
    let bad = || js_error("invalid_value", "a value is not JSON", false);
    let text = js_sys::JSON::stringify(v)
        .map_err(|_| bad())?
        .as_string()
        .ok_or_else(bad)?;
    Json::parse(&text).map_err(|_| bad())
}

/// A queued mutation as `mutations()` gives it, with its stored outcome (JSON text), in the
/// app's names (`manifest`'s): `table`, `values` by field name, the outcome's fields by name.
pub(super) fn mutation_js(
    q: &QueuedMutation,
    outcome: Option<String>,
    manifest: Option<&Manifest>,
) -> Object {
    let m = &q.mutation;
    let table = manifest.and_then(|mf| mf.tables.iter().find(|t| t.table_id == m.table_id));
    let name_of = |id: &str| {
        table.and_then(|t| {
            t.fields
                .iter()
                .find(|f| f.field_id == id)
                .map(|f| f.name.as_str())
        })
    };
    let o = Object::new();
    set(&o, "mutationId", m.mutation_id.clone().into());
    set(&o, "batchId", q.batch_id.clone().into());
    set(&o, "localOrder", (m.local_order as f64).into());
    set(
        &o,
        "table",
        table
            .map_or(m.table_id.as_str(), |t| t.name.as_str())
            .into(),
    );
    set(&o, "pk", json_to_js(&m.pk));
    set(&o, "operation", m.operation.as_str().into());
    set(
        &o,
        "baseVersion",
        m.base_version.clone().map_or(JsValue::NULL, JsValue::from),
    );
    set(&o, "clientVersion", (m.client_version as f64).into());
    set(
        &o,
        "values",
        if m.operation.as_str() == "delete" {
            JsValue::NULL
        } else {
            json_to_js(&Json::Object(
                m.columns
                    .iter()
                    .map(|c| {
                        let name = name_of(&c.field_id).unwrap_or(&c.field_id);
                        (name.to_owned(), c.value.clone())
                    })
                    .collect(),
            ))
        },
    );
    set(&o, "authoredSchema", {
        let a = Object::new();
        set(&a, "version", (m.authored_schema.version as f64).into());
        set(&a, "hash", m.authored_schema.hash.clone().into());
        a.into()
    });
    set(
        &o,
        "outcome",
        outcome
            .and_then(|t| Json::parse(&t).ok())
            .map_or(JsValue::NULL, |j| json_to_js(&named(j, &name_of))),
    );
    set(&o, "state", q.state.as_str().into());
    o
}
