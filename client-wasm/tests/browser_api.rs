//! The JavaScript API in headless Chromium (dedicated worker, OPFS): open by name with a
//! local ladder and an optional `clientVersion`, read-only queries with typed results, and
//! failures thrown as `Error` objects carrying a stable `code` and `retryable`.
#![cfg(target_arch = "wasm32")]

use js_sys::{Array, Function, Object, Reflect};
use synchro_client::wasm::SynchroClient;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_test::wasm_bindgen_test;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

fn member(v: &JsValue, name: &str) -> JsValue {
    Reflect::get(v, &name.into()).unwrap()
}

async fn open(name: &str, ladder: &[&str]) -> Result<SynchroClient, JsValue> {
    open_with(name, ladder, None).await
}

async fn open_with(
    name: &str,
    ladder: &[&str],
    options: Option<Object>,
) -> Result<SynchroClient, JsValue> {
    // Nothing listens on port 9: every request fails at the network.
    let token = Function::new_no_args("return Promise.resolve('token')");
    SynchroClient::open(
        name.into(),
        "http://127.0.0.1:9".into(),
        token,
        Some(ladder.iter().map(|s| s.to_string()).collect()),
        options,
    )
    .await
}

fn version_option(v: JsValue) -> Option<Object> {
    let o = Object::new();
    Reflect::set(&o, &"clientVersion".into(), &v).unwrap();
    Some(o)
}

#[wasm_bindgen_test]
async fn open_query_and_typed_errors() {
    let name = format!("/api-{}.db", js_sys::Date::now() as u64);
    let ladder = ["CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT, big INTEGER, raw BLOB)"];
    let mut db = open(&name, &ladder).await.unwrap();
    assert_eq!(db.state(), "fresh");
    assert_eq!(db.client_version(), env!("CARGO_PKG_VERSION"));

    // A sync against an unreachable server rejects with a typed, retryable Error.
    let e = db.sync().await.unwrap_err();
    assert!(e.is_instance_of::<js_sys::Error>());
    assert_eq!(member(&e, "code"), "network_error");
    assert_eq!(member(&e, "retryable"), true);
    assert_eq!(db.state(), "fresh", "nothing changed");
    // Its message keeps why (a bounded reason), never the URL.
    let message = member(&e, "message").as_string().unwrap();
    assert!(
        message.contains("network error or CORS refusal"),
        "{message}"
    );
    assert!(!message.contains("127.0.0.1"), "{message}");

    // Writes need an installed schema; the queue is empty and inspectable.
    let e = db
        .write(
            "docs".into(),
            "insert".into(),
            JsValue::from_str("1"),
            JsValue::NULL,
            None,
        )
        .unwrap_err();
    assert_eq!(member(&e, "code"), "local_schema_error");
    assert_eq!(db.mutations().unwrap().length(), 0);

    // Queries are read-only; values come back typed.
    let e = db
        .query("INSERT INTO notes VALUES (1, 'x', 0, NULL)".into(), None)
        .unwrap_err();
    assert_eq!(member(&e, "code"), "invalid_request");
    let rows = db
        .query(
            "SELECT 1 AS one, 'two' AS two, 9007199254740993 AS big, x'00ff' AS raw, NULL AS empty, ? AS p".into(),
            Some(Array::of1(&JsValue::from_str("param"))),
        )
        .unwrap();
    assert_eq!(rows.length(), 1);
    let row = rows.get(0);
    assert_eq!(member(&row, "one"), 1.0);
    assert_eq!(member(&row, "two"), "two");
    assert!(member(&row, "big").is_bigint(), "beyond 2^53 stays exact");
    assert_eq!(
        member(&row, "raw")
            .unchecked_into::<js_sys::Uint8Array>()
            .to_vec(),
        [0, 255]
    );
    assert!(member(&row, "empty").is_null());
    assert_eq!(member(&row, "p"), "param");
    drop(db);

    // Reopened from OPFS: the same database (the ladder already applied); an older
    // application with a shorter ladder is refused with a typed error.
    let db = open(&name, &ladder).await.unwrap();
    let tables = db
        .query(
            "SELECT count(*) AS n FROM sqlite_schema WHERE name = 'notes'".into(),
            None,
        )
        .unwrap();
    assert_eq!(member(&tables.get(0), "n"), 1.0);
    drop(db);
    let e = open(&name, &[]).await.err().expect("refused");
    assert_eq!(member(&e, "code"), "local_schema_error");
    assert_eq!(member(&e, "retryable"), false);

    // The application's own runtime version; one that is not SemVer 2.0.0 (or not a
    // string) is refused before the database is opened.
    let db = open_with(&name, &ladder, version_option("2.4.0-beta.1".into()))
        .await
        .unwrap();
    assert_eq!(db.client_version(), "2.4.0-beta.1");
    drop(db);
    for bad in [JsValue::from_str("v2.4.0"), JsValue::from_f64(2.0)] {
        let e = open_with("/never-created.db", &ladder, version_option(bad))
            .await
            .err()
            .expect("refused");
        assert!(e.is_instance_of::<js_sys::Error>());
        assert_eq!(member(&e, "code"), "invalid_client_version");
        assert_eq!(member(&e, "retryable"), false);
    }
}

#[wasm_bindgen_test]
async fn a_request_without_a_response_says_why_and_nothing_more() {
    // (why the request failed, the message that must say it, what it must not say)
    let cases = [
        (
            "http://127.0.0.1:9",
            "throw new Error('token-secret-1')",
            "the token provider failed",
            "token-secret-1",
        ),
        (
            "http://127.0.0.1:9",
            "return 42",
            "the token provider failed",
            "42",
        ),
        (
            "http://[not a host",
            "return 'token-secret-2'",
            "the request could not be built",
            "not a host",
        ),
        (
            "http://127.0.0.1:9",
            "return 'token-secret-3'",
            "fetch failed (network error or CORS refusal)",
            "token-secret-3",
        ),
    ];
    for (i, (url, provider, says, never)) in cases.into_iter().enumerate() {
        let name = format!("/reason-{i}-{}.db", js_sys::Date::now() as u64);
        let mut db = SynchroClient::open(
            name,
            url.into(),
            Function::new_no_args(provider),
            None,
            None,
        )
        .await
        .unwrap();
        let e = db.sync().await.unwrap_err();
        assert_eq!(member(&e, "code"), "network_error", "{says}");
        let message = member(&e, "message").as_string().unwrap();
        assert!(message.contains(says), "{message}");
        assert!(!message.contains(never), "{message}");
    }
}
