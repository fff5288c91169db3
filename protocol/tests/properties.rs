//! Property tests: encode/validate round trips for every portable type, convergence of
//! equivalent spellings, and robustness of every parser against arbitrary input.
#![cfg(not(target_arch = "wasm32"))]

use proptest::prelude::*;
use synchro_protocol::digest::RowIdentity;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::types::{FieldSpec, PortableType};
use synchro_protocol::value::{canonical_float, Scalar, TypedValue};
use synchro_protocol::{decimal, jcs, semver};

fn wire(ty: PortableType, raw: &str) -> Result<TypedValue, synchro_protocol::Error> {
    let spec = match ty {
        PortableType::Decimal => FieldSpec::decimal(true, 1000, 500).unwrap(),
        _ => FieldSpec::new(ty, true).unwrap(),
    };
    TypedValue::from_wire_text(&spec, raw)
}

/// Validating the canonical wire text of a value gives back the same value and octets.
fn round_trip(v: &TypedValue) {
    let spec = match v.scalar() {
        Some(Scalar::Decimal(_)) => FieldSpec::decimal(true, 1000, 500).unwrap(),
        _ => FieldSpec::new(v.ty(), true).unwrap(),
    };
    let text = v.to_wire_text();
    let back = TypedValue::from_wire_text(&spec, &text).unwrap();
    assert_eq!(&back, v);
    assert_eq!(back.to_bytes(), v.to_bytes());
}

prop_compose! {
    fn date()(y in 1u32..=9999, m in 1u32..=12, d in 1u32..=28) -> String {
        format!("{y:04}-{m:02}-{d:02}")
    }
}
prop_compose! {
    fn time()(h in 0u32..24, m in 0u32..60, s in 0u32..60, us in 0u32..1_000_000) -> String {
        format!("{h:02}:{m:02}:{s:02}.{us:06}")
    }
}

/// Arbitrary JSON trees within the I-JSON number domain.
fn json_tree() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        (-9_007_199_254_740_991i64..=9_007_199_254_740_991)
            .prop_map(|i| Json::Number(i.to_string())),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite()
                && (f.fract() != 0.0 || f.abs() >= 1e21 || f.abs() < 9e15))
            .prop_map(|f| Json::Number(format!("{f:e}"))),
        ".*".prop_map(Json::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..6)
                .prop_map(|m| Json::Object(m.into_iter().collect())),
        ]
    })
}

/// Writes JSON with members in reverse order, numbers as given, and extra whitespace.
fn noisy(v: &Json, out: &mut String) {
    match v {
        Json::Object(m) => {
            out.push_str("{ ");
            for (i, (k, x)) in m.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                jcs::write_string(k, out);
                out.push_str(" :\t");
                noisy(x, out);
            }
            out.push_str(" }");
        }
        Json::Array(a) => {
            out.push_str("[ ");
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(" , ");
                }
                noisy(x, out);
            }
            out.push_str(" ]");
        }
        Json::String(s) => {
            // Escape every non-ASCII character as \u, a legal but non-canonical spelling.
            out.push('"');
            for u in s.encode_utf16() {
                match u {
                    0x22 => out.push_str("\\\""),
                    0x5c => out.push_str("\\\\"),
                    0x20..=0x7e => out.push(char::from(u as u8)),
                    _ => out.push_str(&format!("\\u{u:04X}")),
                }
            }
            out.push('"');
        }
        other => jcs::write_value(other, out).unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn int_round_trips(i in any::<i32>()) {
        let v = wire(PortableType::Int, &i.to_string()).unwrap();
        prop_assert_eq!(v.scalar(), Some(&Scalar::Int(i)));
        round_trip(&v);
    }

    #[test]
    fn int64_round_trips(i in any::<i64>()) {
        let v = wire(PortableType::Int64, &format!("\"{i}\"")).unwrap();
        prop_assert_eq!(v.scalar(), Some(&Scalar::Int64(i)));
        round_trip(&v);
    }

    #[test]
    fn float_round_trips_every_finite_bit_pattern(bits in any::<u64>()) {
        let f = f64::from_bits(bits);
        prop_assume!(f.is_finite());
        let text = jcs::format_f64(f);
        let v = wire(PortableType::Float, &text).unwrap();
        let expected = if f == 0.0 { 0 } else { bits };
        prop_assert_eq!(&v.to_bytes()[2..], &expected.to_be_bytes());
        prop_assert_eq!(canonical_float(&format!("{f:e}")).unwrap(), text);
        round_trip(&v);
    }

    #[test]
    fn decimal_spellings_converge(
        neg in any::<bool>(), int in "[0-9]{0,30}", frac in "[0-9]{0,30}", exp in -40i32..40, pad in 0usize..4
    ) {
        prop_assume!(!int.is_empty() || !frac.is_empty());
        let sign = if neg { "-" } else { "" };
        let plain = format!("{sign}{int}.{frac}");
        let canonical = decimal::canonicalize(&plain).unwrap();
        // The same value with trailing zeros, leading zeros, or the point moved into an
        // exponent converges on the same canonical text.
        let padded = format!("{sign}{}{int}.{frac}{}", "0".repeat(pad), "0".repeat(pad));
        prop_assert_eq!(decimal::canonicalize(&padded).unwrap(), canonical.clone());
        let shifted = format!("{sign}{int}{frac}e{}", -(frac.len() as i64));
        prop_assert_eq!(decimal::canonicalize(&shifted).unwrap(), canonical.clone());
        // Scaling by 10^exp and back is exact.
        let scaled = decimal::canonicalize(&format!("{plain}e{exp}")).unwrap();
        let back = decimal::canonicalize(&format!("{scaled}e{}", -exp)).unwrap();
        prop_assert_eq!(back, canonical.clone());
        // The canonical text is a valid wire value and a fixed point.
        prop_assert_eq!(decimal::validate_wire(&canonical, None).unwrap(), canonical.as_str());
        round_trip(&TypedValue::from_scalar(Scalar::Decimal(canonical)).unwrap());
    }

    #[test]
    fn string_and_bytes_round_trip(s in ".*", b in prop::collection::vec(any::<u8>(), 0..64)) {
        round_trip(&TypedValue::from_scalar(Scalar::String(s)).unwrap());
        round_trip(&TypedValue::from_scalar(Scalar::Bytes(b)).unwrap());
    }

    #[test]
    fn temporal_round_trips(d in date(), t in time()) {
        round_trip(&wire(PortableType::Date, &format!("\"{d}\"")).unwrap());
        round_trip(&wire(PortableType::Time, &format!("\"{t}\"")).unwrap());
        round_trip(&wire(PortableType::Datetime, &format!("\"{d}T{t}Z\"")).unwrap());
    }

    #[test]
    fn json_canonicalization_converges_and_is_idempotent(tree in json_tree()) {
        let canonical = jcs::to_canonical_string(&tree).unwrap();
        let mut n = String::new();
        noisy(&tree, &mut n);
        prop_assert_eq!(jcs::canonicalize(&n).unwrap(), canonical.clone());
        prop_assert_eq!(jcs::canonicalize(&canonical).unwrap(), canonical.clone());
        round_trip(&TypedValue::from_scalar(Scalar::Json(canonical)).unwrap());
    }

    #[test]
    fn semver_precedence_is_a_total_order(
        a in (0u64..3, 0u64..3, 0u64..3, prop::collection::vec("[0-9]|[1-9][0-9]{0,2}|[a-z-]{1,3}", 0..3)),
        b in (0u64..3, 0u64..3, 0u64..3, prop::collection::vec("[0-9]|[1-9][0-9]{0,2}|[a-z-]{1,3}", 0..3)),
    ) {
        let fmt = |v: &(u64, u64, u64, Vec<String>)| {
            let pre = if v.3.is_empty() { String::new() } else { format!("-{}", v.3.join(".")) };
            format!("{}.{}.{}{pre}", v.0, v.1, v.2)
        };
        let (x, y) = (fmt(&a), fmt(&b));
        let xy = semver::compare(&x, &y).unwrap();
        prop_assert_eq!(semver::compare(&y, &x).unwrap(), xy.reverse());
        prop_assert_eq!(semver::compare(&x, &format!("{x}+build.7")).unwrap(), std::cmp::Ordering::Equal);
        prop_assert_eq!(xy == std::cmp::Ordering::Equal, x == y);
    }

    #[test]
    fn row_identity_parses_back(k in ".*", i in any::<i64>()) {
        let m = Manifest::parse(r#"{"schema_version":1,"parent_schema":null,"transition_class":"initial",
          "compatibility_floor":1,"tables":[
          {"table_id":"a","relation_id":"ra","name":"a","composition":"single_scope","primary_key_field_id":"k",
           "lifecycle":{"created_at_field_id":null,"updated_at_field_id":null,"deleted_at_field_id":null},
           "fields":[{"field_id":"k","name":"k","type":"string","nullable":false,"writable":false}],"indexes":[]},
          {"table_id":"b","relation_id":"rb","name":"b","composition":"single_scope","primary_key_field_id":"k",
           "lifecycle":{"created_at_field_id":null,"updated_at_field_id":null,"deleted_at_field_id":null},
           "fields":[{"field_id":"k","name":"k","type":"int64","nullable":false,"writable":false}],"indexes":[]}]}"#).unwrap();
        for (table, value) in [("a", Scalar::String(k.clone())), ("b", Scalar::Int64(i))] {
            let id = RowIdentity::new(m.table(table).unwrap(), &TypedValue::from_scalar(value).unwrap()).unwrap();
            prop_assert_eq!(RowIdentity::from_bytes(id.as_bytes()).unwrap(), id.clone());
            let bytes = id.as_bytes();
            prop_assert!(RowIdentity::from_bytes(&bytes[..bytes.len() - 1]).is_err());
        }
    }

    // Arbitrary input never panics any parser of untrusted text.
    #[test]
    fn parsers_never_panic(s in "\\PC*", raw in prop::collection::vec(any::<u8>(), 0..96)) {
        let _ = Json::parse(&s);
        let _ = jcs::canonicalize(&s);
        let _ = decimal::canonicalize(&s);
        let _ = canonical_float(&s);
        let _ = semver::Version::parse(&s);
        let _ = Manifest::parse(&s);
        let _ = synchro_protocol::checksum::Checksum::parse(&s);
        let _ = RowIdentity::from_bytes(&raw);
        for ty in PortableType::ALL {
            let _ = wire(ty, &s);
        }
        let _ = synchro_protocol::conformance::eval_document(&s);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The compact-key sort orders exactly like a full octet comparison, including string
    /// keys that share long prefixes and keys that tie on the compact window.
    #[test]
    fn compact_identity_sort_equals_full_sort(
        keys in prop::collection::btree_set(prop_oneof![
            "[a-c]{0,3}",
            "prefix-shared-by-many-[a-c]{0,20}",
            "\\PC{0,24}",
        ], 256..700),
        seed in any::<u64>(),
    ) {
        let m = Manifest::parse(r#"{"schema_version":1,"parent_schema":null,"transition_class":"initial",
          "compatibility_floor":1,"tables":[
          {"table_id":"a","relation_id":"ra","name":"a","composition":"single_scope","primary_key_field_id":"k",
           "lifecycle":{"created_at_field_id":null,"updated_at_field_id":null,"deleted_at_field_id":null},
           "fields":[{"field_id":"k","name":"k","type":"string","nullable":false,"writable":false}],"indexes":[]}]}"#).unwrap();
        let t = m.table("a").unwrap();
        let mut entries: Vec<(RowIdentity, [u8; 32])> = keys
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                let id = RowIdentity::new(t, &TypedValue::from_scalar(Scalar::String(k)).unwrap()).unwrap();
                (id, [(i % 251) as u8; 32])
            })
            .collect();
        // Shuffle deterministically.
        let mut x = seed | 1;
        for i in (1..entries.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            entries.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut expected = entries.clone();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        synchro_protocol::digest::sort_by_identity(&mut entries);
        prop_assert_eq!(entries, expected);
    }
}
