//! Benchmark workloads and kernels (feature `bench`), shared by the native benchmark
//! (`examples/digest_bench.rs`) and the wasm one (`bench/node-bench.mjs`) so both measure
//! exactly the same work. Timing is the caller's: this crate has no clock.
//!
//! Rows have 10 mixed-type fields (int64 key, string, int, decimal, float, boolean, datetime,
//! date, json, bytes). Inputs are generated from a caller-given seed by a fixed
//! xorshift generator, so every run and both targets see identical octets.

use sha2::{Digest, Sha256};

use crate::digest::{row_digest, row_digest_of_values, scope_digest, RowIdentity, ScopeDigester};
use crate::json::Json;
use crate::manifest::Manifest;
use crate::value::TypedValue;

/// The benchmark table's manifest (one table, 10 fields).
pub const MANIFEST: &str = r#"{"schema_version":1,"parent_schema":null,"transition_class":"initial",
"compatibility_floor":1,"tables":[{"table_id":"tbl_bench","relation_id":"rel_bench","name":"bench",
"composition":"multi_scope","primary_key_field_id":"f_id","lifecycle":{"created_at_field_id":"f_created",
"updated_at_field_id":null,"deleted_at_field_id":null},"fields":[
{"field_id":"f_id","name":"id","type":"int64","nullable":false,"writable":false},
{"field_id":"f_name","name":"name","type":"string","nullable":false,"writable":true},
{"field_id":"f_count","name":"count","type":"int","nullable":true,"writable":true},
{"field_id":"f_amount","name":"amount","type":"decimal","nullable":true,"writable":true,"precision":14,"scale":4},
{"field_id":"f_ratio","name":"ratio","type":"float","nullable":true,"writable":true},
{"field_id":"f_active","name":"active","type":"boolean","nullable":false,"writable":true},
{"field_id":"f_created","name":"created_at","type":"datetime","nullable":false,"writable":false},
{"field_id":"f_day","name":"day","type":"date","nullable":true,"writable":true},
{"field_id":"f_meta","name":"meta","type":"json","nullable":true,"writable":true},
{"field_id":"f_blob","name":"blob","type":"bytes","nullable":true,"writable":true}],"indexes":[]}]}"#;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Pre-generated inputs for every kernel.
pub struct Workload {
    manifest: Manifest,
    /// (pk wire JSON, row wire JSON, server version) per row.
    rows: Vec<(Json, Json, String)>,
    /// The same rows as validated values in field order.
    values: Vec<Vec<TypedValue>>,
    /// Each row's exact digest input (the raw SHA-256 baseline hashes these).
    row_inputs: Vec<Vec<u8>>,
    /// Scope entries in random order.
    entries: Vec<(RowIdentity, [u8; 32])>,
    /// The scope digest's exact input octets (baseline for the scope digest).
    scope_input: Vec<u8>,
}

impl Workload {
    /// Generates `rows` rows and a scope of `entries` entries from `seed`.
    pub fn new(rows: usize, entries: usize, seed: u64) -> Workload {
        let manifest = Manifest::parse(MANIFEST).expect("benchmark manifest is valid");
        let table = manifest.table("tbl_bench").expect("table");
        let mut rng = Rng(seed | 1);
        let mut row_list = Vec::with_capacity(rows);
        for i in 0..rows {
            let r = rng.next();
            let id = (r >> 1) as i64 - (1 << 61) + i as i64;
            let text = format!(
                r#"{{"f_id":"{id}","f_name":"customer {i} ✓ {r:x}","f_count":{count},"f_amount":"{amount}.{cents}",
                "f_ratio":{ratio},"f_active":{active},"f_created":"2026-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}Z",
                "f_day":"2025-{m:02}-{d:02}","f_meta":"{{\"k\":{k},\"tags\":[\"a\",\"b\"]}}","f_blob":"{blob}"}}"#,
                count = (r % 100_000) as i32 - 50_000,
                amount = r % 10_000_000,
                cents = 1 + r % 9,
                ratio = crate::jcs::format_f64((r % 1_000_000) as f64 / 1024.0 + 0.5),
                active = r % 2 == 0,
                m = 1 + r % 12,
                d = 1 + (r >> 8) % 28,
                h = (r >> 16) % 24,
                mi = (r >> 24) % 60,
                s = (r >> 32) % 60,
                us = (r >> 40) % 1_000_000,
                k = r % 1000,
                blob = ["AAECAwQFBgc", "3q2-7w", "", "_-8"][(r % 4) as usize],
            );
            let row = Json::parse(&text).expect("benchmark row parses");
            let pk = row.get("f_id").expect("key").clone();
            row_list.push((pk, row, format!("0/{:X}:{}", r >> 20, i % 97)));
        }
        let values = row_list
            .iter()
            .map(|(_, row, _)| {
                table
                    .fields
                    .iter()
                    .map(|f| TypedValue::from_wire(&f.spec, row.get(&f.field_id).expect("field")))
                    .collect::<crate::Result<Vec<_>>>()
                    .expect("benchmark row is valid")
            })
            .collect();
        let row_inputs = row_list
            .iter()
            .map(|(pk, row, v)| {
                row_digest(&manifest, "tbl_bench", pk, row, v)
                    .expect("benchmark row digests")
                    .input
            })
            .collect();
        let mut entry_list = Vec::with_capacity(entries);
        for i in 0..entries {
            let r = rng.next();
            let pk = TypedValue::from_scalar(crate::value::Scalar::Int64(
                (r >> 2) as i64 ^ (i as i64) << 40,
            ))
            .expect("int64");
            let id = RowIdentity::new(table, &pk).expect("identity");
            let mut d = [0u8; 32];
            for chunk in d.chunks_mut(8) {
                chunk.copy_from_slice(&rng.next().to_be_bytes());
            }
            entry_list.push((id, d));
        }
        entry_list.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        entry_list.dedup_by(|a, b| a.0 == b.0);
        let scope_input = scope_digest(
            &manifest.schema_hash(),
            "user:bench",
            &mut entry_list.clone(),
            true,
        )
        .expect("scope digest")
        .input
        .expect("recorded");
        // Hand the scope kernel its entries unsorted, as a server reading an index would not.
        let mut rng2 = Rng(seed.rotate_left(17) | 1);
        for i in (1..entry_list.len()).rev() {
            entry_list.swap(i, (rng2.next() % (i as u64 + 1)) as usize);
        }
        Workload {
            manifest,
            rows: row_list,
            values,
            row_inputs,
            entries: entry_list,
            scope_input,
        }
    }

    /// Number of rows.
    pub fn row_count(&self) -> usize {
        self.rows.len()
    }

    /// Number of scope entries.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// Total octets of all row-digest inputs.
    pub fn row_input_bytes(&self) -> usize {
        self.row_inputs.iter().map(Vec::len).sum()
    }

    /// Octets of the scope-digest input.
    pub fn scope_input_bytes(&self) -> usize {
        self.scope_input.len()
    }

    /// Row digests from parsed wire JSON: validate every value, encode, hash.
    pub fn row_digests_from_wire(&self) -> u8 {
        let mut acc = 0u8;
        for (pk, row, v) in &self.rows {
            let d = row_digest(&self.manifest, "tbl_bench", pk, row, v).expect("row digest");
            acc ^= d.digest[0];
        }
        acc
    }

    /// Row digests from already validated values: encode and hash.
    pub fn row_digests_from_values(&self) -> u8 {
        let table = &self.manifest.tables[0];
        let hash = self.manifest.schema_hash();
        let mut acc = 0u8;
        for (values, (_, _, v)) in self.values.iter().zip(&self.rows) {
            acc ^= row_digest_of_values(&hash, table, values, v)
                .expect("row digest")
                .digest[0];
        }
        acc
    }

    /// Baseline: raw SHA-256 of each row's exact digest input.
    pub fn raw_sha256_rows(&self) -> u8 {
        let mut acc = 0u8;
        for input in &self.row_inputs {
            acc ^= Sha256::digest(input)[0];
        }
        acc
    }

    /// A fresh unsorted copy of the scope entries (setup for
    /// [`Workload::scope_digest_with_sort`], not part of what is timed).
    pub fn unsorted_entries(&self) -> Vec<(RowIdentity, [u8; 32])> {
        self.entries.clone()
    }

    /// Scope digest of the whole scope, sorting the given unsorted entries in place first.
    pub fn scope_digest_with_sort(&self, entries: &mut [(RowIdentity, [u8; 32])]) -> u8 {
        scope_digest(&self.manifest.schema_hash(), "user:bench", entries, false)
            .expect("scope digest")
            .digest[0]
    }

    /// Scope digest streamed from entries already in identity order (an ordered index).
    pub fn scope_digest_presorted(&self, sorted: &[(RowIdentity, [u8; 32])]) -> u8 {
        let mut d = ScopeDigester::new(
            &self.manifest.schema_hash(),
            "user:bench",
            sorted.len() as u64,
        )
        .expect("digester");
        for (id, digest) in sorted {
            d.add(id, digest).expect("ordered entry");
        }
        d.finish().expect("complete").digest[0]
    }

    /// The entries in identity order (setup for [`Workload::scope_digest_presorted`]).
    pub fn sorted_entries(&self) -> Vec<(RowIdentity, [u8; 32])> {
        let mut e = self.entries.clone();
        e.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        e
    }

    /// Baseline: one raw SHA-256 over the scope digest's exact input octets.
    pub fn raw_sha256_scope(&self) -> u8 {
        Sha256::digest(&self.scope_input)[0]
    }
}
