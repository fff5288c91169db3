//! The client's tests run against a fake server (synchro-testkit's `fake_server`); this test
//! holds the fake to the real one. The same kinds of requests go to the real server binary
//! on real PostgreSQL and to the fake, and every response of both must pass the same strict
//! `synchro_protocol::wire` parser and carry the same members (the fake may not omit or add
//! a member the real server sends).

use std::collections::BTreeSet;

use synchro_client::engine::Transport;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::wire::{
    ConnectRequest, ConnectResponse, ErrorBody, Message, PullRequest, PullResponse, PushRequest,
    PushResponse, RebuildRequest, RebuildResponse,
};
use synchro_server::auth::mint;
use synchro_testkit::fake_server::{Fake, Row};

const SECRET: &str = "fake-parity-secret-0123456789abcdef";

/// The member names of a JSON object (and, one level down, of its arrays' objects), for
/// comparing shapes.
fn shape(v: &Json) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Json::Object(members) = v {
        for (k, v) in members {
            out.insert(k.clone());
            if let Json::Array(items) = v {
                for item in items {
                    if let Json::Object(inner) = item {
                        out.extend(inner.iter().map(|(ik, _)| format!("{k}[].{ik}")));
                    }
                }
            }
        }
    }
    out
}

/// Both answers to the same kind of request: each must parse as `M`; returns their shapes.
fn both<M: Message>(what: &str, real: &Json, fake: &Json) -> (BTreeSet<String>, BTreeSet<String>) {
    M::from_json(real).unwrap_or_else(|e| panic!("the real {what} does not parse: {e}: {real:?}"));
    M::from_json(fake).unwrap_or_else(|e| panic!("the fake {what} does not parse: {e}: {fake:?}"));
    (shape(real), shape(fake))
}

/// Long on purpose: the same requests go to the fake and the real server one after another,
/// each answer compared.
#[tokio::test]
async fn the_fake_server_answers_what_the_real_server_answers() {
    let d = synchro_testkit::pg::DocsServer::start(
        env!("CARGO_BIN_EXE_synchro-server-under-test"),
        "INSERT INTO app.docs VALUES (1, 'alice', 'red', 'one'), (2, 'alice', 'blue', 'two'), (3, 'alice', 'red', 'three')",
        SECRET,
    )
    .await;
    let (http, base) = (d.http.clone(), d.base.clone());
    let token = mint(SECRET.as_bytes(), "alice", 3600);
    let real = |path: &'static str, body: String| {
        let http = http.clone();
        let url = format!("{base}{path}");
        let token = token.clone();
        async move {
            let r = http
                .post(url)
                .header("authorization", format!("Bearer {token}"))
                .body(body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, Json::parse(&r.text().await.unwrap()).unwrap())
        }
    };

    // Connect (fresh): the real server's manifest and scopes seed the fake.
    let connect = ConnectRequest {
        client_id: "c1".into(),
        client_generation: None,
        schema: Json::parse(r#"{"version":0,"hash":""}"#).unwrap(),
        schema_reset: false,
        client_version: None,
        scope_cursors: Default::default(),
        seed_receipts: Default::default(),
    };
    let (st, real_connect) = real("/sync/connect", connect.to_json_string()).await;
    assert_eq!(st, 200, "{real_connect:?}");
    let parsed = ConnectResponse::from_json(&real_connect).unwrap();
    let manifest = Manifest::from_json(parsed.schema_definition.as_ref().unwrap()).unwrap();
    let schema = Json::parse(&format!(
        r#"{{"version":{},"hash":"{}"}}"#,
        manifest.schema_version,
        manifest.schema_hash_hex()
    ))
    .unwrap();
    let fake = Fake::default();
    {
        let mut st = fake.0.borrow_mut();
        st.lineage = vec![manifest.clone()];
        st.scopes = parsed.scope_updates.added.iter().cloned().collect();
        let table = &manifest.tables[0];
        let field = |name: &str| {
            table
                .fields
                .iter()
                .find(|f| f.name == name)
                .unwrap()
                .field_id
                .clone()
        };
        st.rows = (1..=3)
            .map(|id| Row {
                scope: "user:alice".into(),
                table_id: table.table_id.clone(),
                pk: id.to_string(),
                row: format!(
                    r#"{{"{}":"{id}","{}":"alice","{}":"red","{}":"t{id}"}}"#,
                    field("id"),
                    field("owner"),
                    field("team"),
                    field("title")
                ),
                version: format!("v{id}"),
            })
            .collect();
    }
    let fake_post = |path: &'static str, body: String| {
        let fake = fake.clone();
        async move {
            let r = fake.post(path, body).await.unwrap();
            (r.status, r.body)
        }
    };
    let (_, fake_connect) = fake_post("/sync/connect", connect.to_json_string()).await;
    let (r, f) = both::<ConnectResponse>("connect", &real_connect, &fake_connect);
    assert_eq!(r, f, "connect members");
    let generation = parsed.client_generation;

    // Pull to the terminal page.
    let pull = PullRequest {
        client_id: "c1".into(),
        client_generation: generation,
        schema: schema.clone(),
        scope_cursors: parsed
            .scope_updates
            .added
            .iter()
            .map(|s| (s.clone(), None))
            .collect(),
        limit: 1000,
    };
    let (st, real_pull) = real("/sync/pull", pull.to_json_string()).await;
    assert_eq!(st, 200, "{real_pull:?}");
    let (_, fake_pull) = fake_post("/sync/pull", pull.to_json_string()).await;
    let (r, f) = both::<PullResponse>("pull", &real_pull, &fake_pull);
    assert_eq!(r, f, "pull members");
    assert!(
        PullResponse::from_json(&real_pull)
            .unwrap()
            .checksums
            .is_some(),
        "a terminal page"
    );

    // A rebuild of one scope, two records a page: a first page and the last.
    let mut rebuild = RebuildRequest {
        client_id: "c1".into(),
        client_generation: generation,
        schema: schema.clone(),
        scope_id: "user:alice".into(),
        limit: 2,
        continuation: None,
    };
    let (st, real_first) = real("/sync/rebuild", rebuild.to_json_string()).await;
    assert_eq!(st, 200, "{real_first:?}");
    let (_, fake_first) = fake_post("/sync/rebuild", rebuild.to_json_string()).await;
    let (r, f) = both::<RebuildResponse>("rebuild page", &real_first, &fake_first);
    assert_eq!(r, f, "rebuild page members");
    let next = |page: &Json| {
        page.get("continuation")
            .and_then(Json::as_str)
            .map(str::to_owned)
    };
    rebuild.continuation = next(&real_first);
    let (_, real_last) = real("/sync/rebuild", rebuild.to_json_string()).await;
    rebuild.continuation = next(&fake_first);
    let (_, fake_last) = fake_post("/sync/rebuild", rebuild.to_json_string()).await;
    let (r, f) = both::<RebuildResponse>("last rebuild page", &real_last, &fake_last);
    assert_eq!(r, f, "last rebuild page members");

    // A push the real server applies without a row (a delete), as the fake answers.
    let version = PullResponse::from_json(&real_pull)
        .unwrap()
        .changes
        .iter()
        .find(|c| c.pk == Json::String("1".into()))
        .unwrap()
        .server_version
        .clone();
    let push = PushRequest::from_json(
        &Json::parse(&format!(
            r#"{{"protocol_version":3,"client_id":"c1","client_generation":{generation},"schema":{schema},
                "batch_id":"b1","mutations":[{{"mutation_id":"m1","table_id":"{}","pk":"1","operation":"delete",
                "base_version":"{version}","client_version":1,"local_order":1,"columns":[],"authored_schema":{schema}}}]}}"#,
            manifest.tables[0].table_id,
            schema = synchro_protocol::jcs::to_output_string(&schema),
        ))
        .unwrap(),
    )
    .unwrap();
    let (st, real_push) = real("/sync/push", push.to_json_string()).await;
    assert_eq!(st, 200, "{real_push:?}");
    let (_, fake_push) = fake_post("/sync/push", push.to_json_string()).await;
    let (r, f) = both::<PushResponse>("push", &real_push, &fake_push);
    assert_eq!(r, f, "push members");

    // An error: a pull under a schema that is not current.
    let mut stale = pull.clone();
    stale.schema =
        Json::parse(&format!(r#"{{"version":1,"hash":"{}"}}"#, "ab".repeat(32))).unwrap();
    let (st, real_error) = real("/sync/pull", stale.to_json_string()).await;
    let (fake_st, fake_error) = fake_post("/sync/pull", stale.to_json_string()).await;
    assert_eq!((st, fake_st), (422, 422));
    let (r, f) = both::<ErrorBody>("schema_mismatch", &real_error, &fake_error);
    assert_eq!(r, f, "error members");
}
