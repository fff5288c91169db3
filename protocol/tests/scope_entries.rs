//! `ScopeEntries` (ordered entries with kept SHA-256 states) against the formula: after any
//! sequence of inserts, removals and merged batches, its digest equals a fresh
//! `ScopeDigester` over a model of the same entries, and its contents equal the model's.
//! Scopes are large enough (several thousand entries of 40–90 octets) that digests resume
//! from kept states past the first checkpoint.
#![cfg(not(target_arch = "wasm32"))]

use std::collections::BTreeMap;

use proptest::prelude::*;
use synchro_protocol::digest::ScopeDigester;
use synchro_protocol::scope_entries::{ScopeEntries, CHECKPOINT};

/// The identity octets of entry `n`: distinct for distinct `n`, of varied length, ordered
/// differently from `n` in places (the octet order is what counts).
fn id(n: u32) -> Vec<u8> {
    let mut v = format!("row:{:05}", n ^ 0x15).into_bytes();
    v.resize(v.len() + (n as usize * 7919) % 50, b'a' + (n % 26) as u8);
    v.insert(0, (n % 3) as u8);
    v
}

fn digest_of(seed: u32) -> [u8; 32] {
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = (seed.wrapping_mul(2_654_435_761).rotate_left(i as u32) >> 3) as u8;
    }
    d
}

fn formula(schema: &[u8; 32], scope: &str, model: &BTreeMap<Vec<u8>, [u8; 32]>) -> [u8; 32] {
    let mut d = ScopeDigester::new(schema, scope, model.len() as u64).unwrap();
    for (k, v) in model {
        d.add_octets(k, v).unwrap();
    }
    d.finish().unwrap().digest
}

#[derive(Debug, Clone)]
enum Op {
    Set(u32, u32),
    Remove(u32),
    Batch(Vec<(u32, Option<u32>)>),
    Digest { other_scope: bool },
}

fn op(space: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..space, any::<u32>()).prop_map(|(n, d)| Op::Set(n, d)),
        2 => (0..space).prop_map(Op::Remove),
        2 => prop::collection::vec((0..space, prop::option::of(any::<u32>())), 0..60)
            .prop_map(Op::Batch),
        3 => any::<bool>().prop_map(|other_scope| Op::Digest { other_scope }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn digests_equal_the_formula_after_any_changes(
        initial in 0u32..4000,
        ops in prop::collection::vec(op(5000), 1..40),
    ) {
        let schema = [7u8; 32];
        let mut model: BTreeMap<Vec<u8>, [u8; 32]> =
            (0..initial).map(|n| (id(n * 5 / 4), digest_of(n))).collect();
        let mut entries = ScopeEntries::from_sorted(model.iter().map(|(k, v)| (k, *v))).unwrap();
        prop_assert_eq!(entries.digest(&schema, "s").unwrap(), formula(&schema, "s", &model));
        for op in ops {
            match op {
                Op::Set(n, d) => {
                    prop_assert_eq!(
                        entries.insert(&id(n), digest_of(d)),
                        model.insert(id(n), digest_of(d))
                    );
                }
                Op::Remove(n) => {
                    prop_assert_eq!(entries.remove(&id(n)), model.remove(&id(n)));
                }
                Op::Batch(changes) => {
                    for (n, c) in &changes {
                        match c {
                            Some(d) => model.insert(id(*n), digest_of(*d)),
                            None => model.remove(&id(*n)),
                        };
                    }
                    entries.apply(
                        changes
                            .into_iter()
                            .map(|(n, c)| (id(n), c.map(digest_of)))
                            .collect(),
                    );
                }
                Op::Digest { other_scope } => {
                    let scope = if other_scope { "other" } else { "s" };
                    prop_assert_eq!(
                        entries.digest(&schema, scope).unwrap(),
                        formula(&schema, scope, &model)
                    );
                }
            }
            prop_assert_eq!(entries.len(), model.len());
        }
        prop_assert_eq!(entries.digest(&schema, "s").unwrap(), formula(&schema, "s", &model));
        let held: Vec<(Vec<u8>, [u8; 32])> =
            entries.iter().map(|(k, v)| (k.to_vec(), v)).collect();
        let expected: Vec<(Vec<u8>, [u8; 32])> = model.into_iter().collect();
        prop_assert_eq!(held, expected);
    }
}

/// A change near the end of a large scope rehashes only the tail: the digest is still the
/// formula's (and the scope spans many checkpoints, so resumption is exercised).
#[test]
fn a_late_change_in_a_large_scope_still_digests_to_the_formula() {
    let schema = [1u8; 32];
    let mut model: BTreeMap<Vec<u8>, [u8; 32]> =
        (0..30_000).map(|n| (id(n), digest_of(n))).collect();
    let mut entries = ScopeEntries::from_sorted(model.iter().map(|(k, v)| (k, *v))).unwrap();
    let octets: usize = model.keys().map(|k| 8 + k.len() + 32).sum();
    assert!(octets > 20 * CHECKPOINT, "{octets} octets");
    assert_eq!(
        entries.digest(&schema, "s").unwrap(),
        formula(&schema, "s", &model)
    );
    let last = model.keys().next_back().unwrap().clone();
    for round in 0..3u32 {
        entries.insert(&last, digest_of(100_000 + round));
        model.insert(last.clone(), digest_of(100_000 + round));
        assert_eq!(
            entries.digest(&schema, "s").unwrap(),
            formula(&schema, "s", &model)
        );
    }
    // The first entry changed: every kept state is stale.
    let first = model.keys().next().unwrap().clone();
    entries.insert(&first, digest_of(7));
    model.insert(first, digest_of(7));
    assert_eq!(
        entries.digest(&schema, "s").unwrap(),
        formula(&schema, "s", &model)
    );
}

#[test]
fn out_of_order_and_duplicate_identities_are_refused() {
    let e = ScopeEntries::from_sorted([(b"b".to_vec(), [0; 32]), (b"a".to_vec(), [0; 32])]);
    assert!(e.unwrap_err().to_string().contains("out of order"));
    let e = ScopeEntries::from_sorted([(b"a".to_vec(), [0; 32]), (b"a".to_vec(), [1; 32])]);
    assert!(e.unwrap_err().to_string().contains("duplicate"));
    let mut empty = ScopeEntries::new();
    assert!(empty.digest(&[0; 32], "").is_err(), "an empty scope ID");
    assert_eq!(
        empty.digest(&[0; 32], "s").unwrap(),
        formula(&[0; 32], "s", &BTreeMap::new())
    );
}
