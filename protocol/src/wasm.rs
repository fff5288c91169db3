//! wasm-bindgen exports of the protocol core for JavaScript.
//!
//! Every failure is thrown as a real JS `Error` whose `code` property is the stable
//! [`crate::Error::code`], so callers branch on `err.code`, never on message text.

use wasm_bindgen::prelude::*;

use crate::json::Json;
use crate::manifest::Manifest;
use crate::types::FieldSpec;
use crate::value::TypedValue;
use crate::{conformance, decimal, digest, jcs, semver};

fn js_error(e: crate::Error) -> JsValue {
    let err = js_sys::Error::new(&e.to_string());
    err.set_name("SynchroProtocolError");
    // Setting a data property on a fresh Error object cannot fail.
    let _ = js_sys::Reflect::set(&err, &"code".into(), &e.code().into());
    err.into()
}

/// The crate version (equal to the npm package version).
#[wasm_bindgen]
pub fn version() -> String {
    crate::VERSION.to_owned()
}

/// Runs a conformance document (`{"cases":[...]}`) and returns `{"results":[...]}`.
#[wasm_bindgen(js_name = evalConformance)]
pub fn eval_conformance(document: &str) -> Result<String, JsValue> {
    conformance::eval_document(document).map_err(js_error)
}

/// RFC 8785 canonical form of a JSON text (I-JSON rules enforced).
#[wasm_bindgen(js_name = canonicalJson)]
pub fn canonical_json(text: &str) -> Result<String, JsValue> {
    jcs::canonicalize(text).map_err(js_error)
}

/// Canonical decimal text of a source spelling, optionally checked against precision/scale.
#[wasm_bindgen(js_name = canonicalDecimal)]
pub fn canonical_decimal(
    source: &str,
    precision: Option<u32>,
    scale: Option<u32>,
) -> Result<String, JsValue> {
    let spec = match precision {
        Some(p) => Some(crate::types::DecimalSpec::new(p, scale.unwrap_or(0)).map_err(js_error)?),
        None => None,
    };
    decimal::canonicalize_with(source, spec).map_err(js_error)
}

/// Typed-value octets of a raw wire JSON value for a field spec JSON
/// (`{"type","nullable","precision"?,"scale"?}`).
#[wasm_bindgen(js_name = typedValueBytes)]
pub fn typed_value_bytes(field_spec_json: &str, raw_json: &str) -> Result<Vec<u8>, JsValue> {
    let spec =
        FieldSpec::from_json(&Json::parse(field_spec_json).map_err(js_error)?).map_err(js_error)?;
    Ok(TypedValue::from_wire_text(&spec, raw_json)
        .map_err(js_error)?
        .to_bytes())
}

/// The schema hash (64 lowercase hex) of a manifest JSON text, after full validation.
#[wasm_bindgen(js_name = schemaHash)]
pub fn schema_hash(manifest_json: &str) -> Result<String, JsValue> {
    Ok(Manifest::parse(manifest_json)
        .map_err(js_error)?
        .schema_hash_hex())
}

/// The row digest (64 lowercase hex) of a complete row.
#[wasm_bindgen(js_name = rowDigest)]
pub fn row_digest(
    manifest_json: &str,
    table_id: &str,
    pk_json: &str,
    row_json: &str,
    server_version: &str,
) -> Result<String, JsValue> {
    let m = Manifest::parse(manifest_json).map_err(js_error)?;
    let pk = Json::parse(pk_json).map_err(js_error)?;
    let row = Json::parse(row_json).map_err(js_error)?;
    let d = digest::row_digest(&m, table_id, &pk, &row, server_version).map_err(js_error)?;
    Ok(hex::encode(d.digest))
}

/// SemVer 2.0.0 precedence of `a` against `b`: -1, 0 or 1.
#[wasm_bindgen(js_name = semverCompare)]
pub fn semver_compare(a: &str, b: &str) -> Result<i32, JsValue> {
    Ok(semver::compare(a, b).map_err(js_error)? as i32)
}

/// The benchmark workload for JS timing (feature `bench`; see bench/node-bench.mjs).
#[cfg(feature = "bench")]
#[wasm_bindgen]
pub struct BenchWorkload {
    inner: crate::bench::Workload,
    sorted: Vec<(crate::digest::RowIdentity, [u8; 32])>,
    scratch: Vec<(crate::digest::RowIdentity, [u8; 32])>,
}

#[cfg(feature = "bench")]
#[wasm_bindgen]
impl BenchWorkload {
    /// Generates the workload (same octets as the native benchmark for the same seed).
    #[wasm_bindgen(constructor)]
    pub fn new(rows: usize, entries: usize, seed: u64) -> BenchWorkload {
        let inner = crate::bench::Workload::new(rows, entries, seed);
        let sorted = inner.sorted_entries();
        BenchWorkload {
            inner,
            sorted,
            scratch: Vec::new(),
        }
    }
    /// Number of rows.
    #[wasm_bindgen(js_name = rowCount)]
    pub fn row_count(&self) -> usize {
        self.inner.row_count()
    }
    /// Number of scope entries.
    #[wasm_bindgen(js_name = entryCount)]
    pub fn entry_count(&self) -> usize {
        self.inner.entry_count()
    }
    /// Total row-digest input octets.
    #[wasm_bindgen(js_name = rowInputBytes)]
    pub fn row_input_bytes(&self) -> usize {
        self.inner.row_input_bytes()
    }
    /// Scope-digest input octets.
    #[wasm_bindgen(js_name = scopeInputBytes)]
    pub fn scope_input_bytes(&self) -> usize {
        self.inner.scope_input_bytes()
    }
    /// Kernel: row digests from wire JSON.
    #[wasm_bindgen(js_name = rowDigestsFromWire)]
    pub fn row_digests_from_wire(&self) -> u8 {
        self.inner.row_digests_from_wire()
    }
    /// Kernel: row digests from validated values.
    #[wasm_bindgen(js_name = rowDigestsFromValues)]
    pub fn row_digests_from_values(&self) -> u8 {
        self.inner.row_digests_from_values()
    }
    /// Baseline: raw SHA-256 over the row-digest inputs.
    #[wasm_bindgen(js_name = rawSha256Rows)]
    pub fn raw_sha256_rows(&self) -> u8 {
        self.inner.raw_sha256_rows()
    }
    /// Setup (untimed): a fresh unsorted copy for [`BenchWorkload::scope_digest_with_sort`].
    #[wasm_bindgen(js_name = prepareUnsorted)]
    pub fn prepare_unsorted(&mut self) {
        self.scratch = self.inner.unsorted_entries();
    }
    /// Kernel: scope digest including the sort of the prepared copy.
    #[wasm_bindgen(js_name = scopeDigestWithSort)]
    pub fn scope_digest_with_sort(&mut self) -> u8 {
        self.inner.scope_digest_with_sort(&mut self.scratch)
    }
    /// Kernel: scope digest over presorted entries.
    #[wasm_bindgen(js_name = scopeDigestPresorted)]
    pub fn scope_digest_presorted(&self) -> u8 {
        self.inner.scope_digest_presorted(&self.sorted)
    }
    /// Baseline: raw SHA-256 over the scope-digest input.
    #[wasm_bindgen(js_name = rawSha256Scope)]
    pub fn raw_sha256_scope(&self) -> u8 {
        self.inner.raw_sha256_scope()
    }
}
