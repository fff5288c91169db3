//! The storage layer on real SQLite: every portable type round-trips through the storage
//! class the spec's mapping table names, install is all-or-nothing and refuses a second
//! schema, and a stored value that no longer fits its field is reported without its value.

use synchro_testkit::manifests as common;
use synchro_testkit::target;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

use common::{decimal, field, manifest, table};
use synchro_client::storage::{Storage, StorageError};
use synchro_protocol::manifest::Manifest;
use synchro_protocol::value::{Scalar, TypedValue};

fn kinds() -> Manifest {
    manifest(
        1,
        None,
        "initial",
        1,
        &[table(
            "tbl_kinds",
            "kinds",
            "multi_scope",
            &[
                field("f01", "id", "int64", false, false),
                field("f02", "name", "string", true, true),
                field("f03", "small", "int", true, true),
                decimal("f04", "amount", 38, 5, true),
                field("f05", "ratio", "float", true, true),
                field("f06", "flag", "boolean", true, true),
                field("f07", "at", "datetime", true, true),
                field("f08", "day", "date", true, true),
                field("f09", "clock", "time", true, true),
                field("f10", "doc", "json", true, true),
                field("f11", "blob", "bytes", true, true),
            ],
            &[],
        )],
    )
}

fn v(s: Scalar) -> TypedValue {
    TypedValue::from_scalar(s).unwrap()
}

fn row(id: i64) -> Vec<(String, TypedValue)> {
    vec![
        ("f01".into(), v(Scalar::Int64(id))),
        ("f02".into(), v(Scalar::String("naïve ☃ \u{0}".into()))),
        ("f03".into(), v(Scalar::Int(i32::MIN))),
        (
            "f04".into(),
            v(Scalar::Decimal(
                "-123456789012345678901234567890.12345".into(),
            )),
        ),
        ("f05".into(), v(Scalar::Float(1.7976931348623157e308))),
        ("f06".into(), v(Scalar::Boolean(true))),
        (
            "f07".into(),
            v(Scalar::Datetime("2026-11-30T12:34:56.123456Z".into())),
        ),
        ("f08".into(), v(Scalar::Date("2026-11-30".into()))),
        ("f09".into(), v(Scalar::Time("23:59:59.999999".into()))),
        ("f10".into(), v(Scalar::Json(r#"{"a":[1,2.5,"x"]}"#.into()))),
        ("f11".into(), v(Scalar::Bytes(vec![0, 255, 0, 7]))),
    ]
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn every_type_round_trips_through_its_declared_storage_class() {
    let path = target::fresh_path("kinds").await;
    let m = kinds();
    let mut db = Storage::open(&path).unwrap();
    assert!(db.active_schema().unwrap().is_none());
    db.install(&m).unwrap();
    for id in [i64::MIN, -1, 0, i64::MAX] {
        db.put_row(&m, "tbl_kinds", &row(id)).unwrap();
    }
    drop(db);

    // Reopened: the schema verifies and every value reads back exactly.
    let db = Storage::open(&path).unwrap();
    let active = db.active_schema().unwrap().unwrap();
    assert_eq!(active.schema_hash(), m.schema_hash());
    for id in [i64::MIN, -1, 0, i64::MAX] {
        let got = db
            .get_row(&m, "tbl_kinds", &v(Scalar::Int64(id)))
            .unwrap()
            .unwrap();
        assert_eq!(got, row(id));
    }
    assert!(db
        .get_row(&m, "tbl_kinds", &v(Scalar::Int64(42)))
        .unwrap()
        .is_none());
    // The storage classes of the mapping table, and int64 kept as a native 64-bit integer.
    let classes: Vec<String> = db
        .connection()
        .query_row(
            "SELECT typeof(id), typeof(name), typeof(small), typeof(amount), typeof(ratio), typeof(flag),
                    typeof(at), typeof(day), typeof(clock), typeof(doc), typeof(blob), id
               FROM kinds WHERE id = 9223372036854775807",
            [],
            |r| {
                let mut out: Vec<String> = (0..11).map(|i| r.get(i).unwrap()).collect();
                out.push(r.get::<_, i64>(11).unwrap().to_string());
                Ok(out)
            },
        )
        .unwrap();
    assert_eq!(
        classes,
        [
            "integer",
            "text",
            "integer",
            "text",
            "real",
            "integer",
            "text",
            "text",
            "text",
            "text",
            "blob",
            "9223372036854775807"
        ]
    );
    target::remove(&path);
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn install_is_all_or_nothing_and_happens_once() {
    let m = kinds();
    let mut db = target::fresh("t").await;
    // A name clash makes the install fail midway: nothing of it remains.
    db.connection()
        .execute_batch("CREATE TABLE kinds (x)")
        .unwrap();
    assert!(db.install(&m).is_err());
    assert!(db.active_schema().unwrap().is_none());
    let tables: i64 = db
        .connection()
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name LIKE '_synchro%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0);
    db.connection().execute_batch("DROP TABLE kinds").unwrap();
    db.install(&m).unwrap();
    let again = db.install(&m).unwrap_err();
    assert_eq!(again.code(), "local_schema_error");
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn values_that_do_not_fit_are_refused_on_write_and_detected_on_read() {
    let m = kinds();
    let mut db = target::fresh("t").await;
    db.install(&m).unwrap();
    // A 64-bit value for the int field: refused before anything is written.
    let mut bad = row(1);
    bad[2].1 = v(Scalar::Int64(1));
    let err = db.put_row(&m, "tbl_kinds", &bad).unwrap_err();
    assert_eq!(err.code(), "invalid_value");
    assert!(db
        .get_row(&m, "tbl_kinds", &v(Scalar::Int64(1)))
        .unwrap()
        .is_none());

    db.put_row(&m, "tbl_kinds", &row(1)).unwrap();
    // Stored text that is not canonical (a trailing zero on a decimal, a JSON object with
    // spaces, a date with a time) is integrity damage, reported by table and field only.
    for (column, damaged, field_id) in [
        ("amount", "'1.50'", "f04"),
        ("doc", "'{ \"a\": 1 }'", "f10"),
        ("day", "'2026-11-30T00:00:00Z'", "f08"),
    ] {
        let conn = db.connection();
        let original: rusqlite::types::Value = conn
            .query_row(
                &format!("SELECT {column} FROM kinds WHERE id = 1"),
                [],
                |r| r.get(0),
            )
            .unwrap();
        conn.execute_batch(&format!(
            "UPDATE kinds SET {column} = {damaged} WHERE id = 1"
        ))
        .unwrap();
        let err = db
            .get_row(&m, "tbl_kinds", &v(Scalar::Int64(1)))
            .unwrap_err();
        assert_eq!(err.code(), "local_integrity_failure");
        let message = err.to_string();
        assert!(
            message.contains(field_id) && message.contains("tbl_kinds"),
            "{message}"
        );
        assert!(!message.contains(damaged.trim_matches('\'')), "{message}");
        db.connection()
            .execute(
                &format!("UPDATE kinds SET {column} = ? WHERE id = 1"),
                [original],
            )
            .unwrap();
    }
    assert_eq!(
        db.get_row(&m, "tbl_kinds", &v(Scalar::Int64(1)))
            .unwrap()
            .unwrap(),
        row(1)
    );
    assert!(matches!(
        db.put_row(&m, "tbl_nope", &row(1)),
        Err(StorageError::UnknownTable(_))
    ));
}
