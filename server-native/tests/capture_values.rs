//! PostgreSQL output (through real pgoutput decoding) to canonical wire values, with every
//! portable type and the values a portable type cannot hold.

use synchro_protocol::types::{FieldSpec, PortableType};
use synchro_server::capture::pgoutput::{decode, Message, Value};
use synchro_server::capture::values::{text_to_wire, ValueSource, SESSION_SETTINGS};
use synchro_server::connect_db;
use synchro_server::pg_harness::TempCluster;

fn spec(ty: PortableType) -> FieldSpec {
    match ty {
        PortableType::Decimal => FieldSpec::decimal(true, 12, 4).unwrap(),
        _ => FieldSpec::new(ty, true).unwrap(),
    }
}

#[tokio::test]
async fn every_type_through_pgoutput_becomes_its_canonical_wire_value() {
    let cluster = TempCluster::start().unwrap();
    let db = connect_db(&cluster.admin_url()).await.unwrap();
    db.batch_execute(
        "CREATE TABLE v (id int PRIMARY KEY, s text, i int4, small int2, b int8, n numeric(12,4), f8 float8,
           f4 float4, ok bool, ts timestamptz, d date, tm time, j jsonb, js json, raw bytea, u uuid);
         CREATE PUBLICATION p FOR TABLE v;",
    )
    .await
    .unwrap();
    db.batch_execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        .await
        .unwrap();
    db.batch_execute(
        "INSERT INTO v VALUES (1, 'héllo', -2147483648, -32768, 9223372036854775807, 12.5000, 0.1, 1.1, true,
           '2024-03-01 01:00:00.5+02', '2024-02-29', '23:59:59.999999', '{\"b\": 1, \"a\": [1.0, 2]}',
           '[1e2, \"x\"]', '\\x00ff', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11');
         INSERT INTO v (id, f8, tm, n) VALUES (2, 1e21, '00:00:00', -0.0001);",
    )
    .await
    .unwrap();
    // Hostile session settings: the decoding session overrides them.
    db.batch_execute(
        "SET TimeZone = 'Asia/Kolkata'; SET DateStyle = 'SQL, DMY'; SET extra_float_digits = 0;",
    )
    .await
    .unwrap();
    db.batch_execute(SESSION_SETTINGS).await.unwrap();
    let rows = db
        .query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL,
               'proto_version', '1', 'publication_names', 'p')",
            &[],
        )
        .await
        .unwrap();
    let mut types = Vec::new();
    let mut inserts = Vec::new();
    for r in &rows {
        match decode(r.get::<_, &[u8]>(0)).unwrap() {
            Message::Relation { columns, .. } => {
                types = columns.iter().map(|c| c.type_oid).collect()
            }
            Message::Insert { new, .. } => inserts.push(new),
            _ => {}
        }
    }
    use PortableType::*;
    let portable = [
        Int, String, Int, Int, Int64, Decimal, Float, Float, Boolean, Datetime, Date, Time, Json,
        Json, Bytes, String,
    ];
    let wire = |row: &[Value]| -> Vec<std::string::String> {
        row.iter()
            .zip(portable)
            .zip(&types)
            .map(|((v, ty), oid)| match v {
                Value::Text(t) => text_to_wire(&spec(ty), &ValueSource::Scalar(*oid), t)
                    .unwrap()
                    .to_wire_text(),
                Value::Null => "null".into(),
                Value::Unchanged => panic!("unchanged in an insert"),
            })
            .collect()
    };
    assert_eq!(
        wire(&inserts[0]),
        [
            "1",
            "\"héllo\"",
            "-2147483648",
            "-32768",
            "\"9223372036854775807\"",
            "\"12.5\"",
            "0.1",
            "1.100000023841858",
            "true",
            "\"2024-02-29T23:00:00.500000Z\"",
            "\"2024-02-29\"",
            "\"23:59:59.999999\"",
            "\"{\\\"a\\\":[1,2],\\\"b\\\":1}\"",
            "\"[100,\\\"x\\\"]\"",
            "\"AP8\"",
            "\"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\"",
        ]
    );
    let second = wire(&inserts[1]);
    assert_eq!(
        (second[5].as_str(), second[6].as_str(), second[11].as_str()),
        ("\"-0.0001\"", "1e+21", "\"00:00:00.000000\"")
    );
}

#[tokio::test]
async fn unrepresentable_source_values_are_errors() {
    let cluster = TempCluster::start().unwrap();
    let db = connect_db(&cluster.admin_url()).await.unwrap();
    db.batch_execute(SESSION_SETTINGS).await.unwrap();
    use PortableType::*;
    let cases = [
        ("'NaN'::numeric", Decimal, 1700u32),
        ("'Infinity'::numeric", Decimal, 1700),
        ("123456789.5::numeric", Decimal, 1700),
        ("'Infinity'::float8", Float, 701),
        ("'NaN'::float4", Float, 700),
        ("'infinity'::timestamptz", Datetime, 1184),
        ("'0044-03-15 BC'::timestamptz", Datetime, 1184),
        ("'10000-01-01'::timestamptz", Datetime, 1184),
        ("'0001-01-01 BC'::date", Date, 1082),
        ("'24:00:00'::time", Time, 1083),
        ("'{\"a\":1,\"a\":2}'::json", Json, 114),
        ("'[1e400]'::json", Json, 114),
        ("'[12345678901234567890]'::jsonb", Json, 3802),
        ("2147483648::int8", Int, 20),
    ];
    for (expr, ty, oid) in cases {
        let text: std::string::String = db
            .query_one(&format!("SELECT ({expr})::text"), &[])
            .await
            .unwrap()
            .get(0);
        let got = text_to_wire(&spec(ty), &ValueSource::Scalar(oid), text.as_bytes());
        assert!(
            got.is_err(),
            "{expr} gave {:?}",
            got.map(|v| v.to_wire_text())
        );
        let msg = got.unwrap_err().to_string();
        assert!(!msg.contains(&text), "the error names no value: {msg}");
    }
}
