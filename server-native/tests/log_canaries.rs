//! The shipped binary at its most verbose (`SYNCHRO_LOG=trace`) never logs row values,
//! keys, user/client/scope IDs, tokens or secrets, nor the text of a PostgreSQL NOTICE or
//! WARNING an application trigger raises with a row value — through connect, pull, push
//! (applied and forbidden), rebuild, events, capture and refused requests.

mod common;

use std::time::Duration;

use common::{free_port, wait_ready, Env};
use serde_json::{json, Value};
use synchro_server::auth::mint;

const SECRET: &str = "canary-secret-5e5e5e5e5e5e5e5e5e";
const USER: &str = "canary-user-0b7d";
const OTHER_USER: &str = "canary-other-user-19f4";
const CLIENT: &str = "canary-client-c3a1";
const TEAM: &str = "canary-team-6d02";
const SQL_VALUE: &str = "canary-sql-value-a9e3";
const LATER_VALUE: &str = "canary-later-value-2c71";
const PUSH_VALUE: &str = "canary-push-value-44f0";
const FORBIDDEN_VALUE: &str = "canary-forbidden-value-8b15";
const CURSOR: &str = "canary-cursor-d00d";
const KEYS: [i64; 4] = [4_242_424_242, 4_343_434_343, 4_444_444_444, 4_545_454_545];

/// Long on purpose: everything that could log (each endpoint, capture, refusals) runs once
/// at trace level, then the whole log is searched for every canary.
#[tokio::test]
async fn nothing_identifying_reaches_the_log_at_trace_level() {
    let env = Env::installed().await;
    env.as_app_owner(&format!(
        "CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, team text NOT NULL, title text);
         CREATE FUNCTION app.chatty() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           RAISE NOTICE 'notice about %', NEW.title;
           RAISE WARNING 'warning about % of %', NEW.title, NEW.owner;
           RETURN NEW;
         END $$;
         CREATE TRIGGER chatty BEFORE INSERT OR UPDATE ON app.docs FOR EACH ROW EXECUTE FUNCTION app.chatty();
         INSERT INTO app.docs VALUES ({}, '{USER}', '{TEAM}', '{SQL_VALUE}')",
        KEYS[0]
    ))
    .await;
    common::register_with_rule(
        &env,
        "docs",
        &format!(
            "CREATE FUNCTION rules.doc_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
             BEGIN ATOMIC
               SELECT 'user:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id
               UNION ALL SELECT 'team:' || team FROM synchro_projection.\"app.docs\" WHERE id = p_id;
             END;
             REVOKE EXECUTE ON FUNCTION rules.doc_scopes(bigint) FROM PUBLIC;
             GRANT EXECUTE ON FUNCTION rules.doc_scopes(bigint) TO synchro_worker;
             SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)');
             SELECT synchro.synchro_grant_user_scope('{USER}', 'team:{TEAM}');"
        ),
    )
    .await;

    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log_path = std::env::temp_dir().join(format!("synchro-canary-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
        .args(common::serve_args(&env, port, SECRET))
        .env("SYNCHRO_LOG", "trace")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    wait_ready(&http, &base).await;
    let token = mint(SECRET.as_bytes(), USER, 3600);
    let post = |path: &str, body: Value| {
        http.post(format!("{base}{path}"))
            .header("authorization", format!("Bearer {token}"))
            .body(body.to_string())
            .send()
    };
    let json_of = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap())
    };

    let (st, c) = json_of(
        post(
            "/sync/connect",
            json!({"protocol_version": 3, "client_id": CLIENT, "schema": {"version": 0, "hash": ""}}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(st, 200, "{c}");
    let generation = c["client_generation"].clone();
    let schema = json!({"version": c["schema"]["version"], "hash": c["schema"]["hash"]});
    let table = &c["schema_definition"]["tables"][0];
    let field = |name: &str| common::field_id(table, name);
    let scopes = [format!("user:{USER}"), format!("team:{TEAM}")];
    let pull_all = || async {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (st, v) = json_of(
                post(
                    "/sync/pull",
                    json!({"protocol_version": 3, "client_id": CLIENT, "client_generation": generation,
                           "schema": schema, "limit": 1000,
                           "scope_cursors": {scopes[0].clone(): null, scopes[1].clone(): null}}),
                )
                .await
                .unwrap(),
            )
            .await;
            assert_eq!(st, 200, "{v}");
            if v["changes"].as_array().unwrap().len() >= 2 {
                return v;
            }
            assert!(std::time::Instant::now() < deadline, "never captured: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    pull_all().await;

    // Push: one applied, one forbidden (it would put a row into another user's scope);
    // the application trigger raises a NOTICE and a WARNING with each row's values.
    let insert = |id: &str, key: i64, owner: &str, team: &str, title: &str| {
        json!({"mutation_id": id, "table_id": table["table_id"], "pk": key.to_string(), "operation": "insert",
               "base_version": null, "client_version": 1, "local_order": 1,
               "columns": [{"field_id": field("owner"), "value": owner},
                           {"field_id": field("team"), "value": team},
                           {"field_id": field("title"), "value": title}],
               "authored_schema": schema})
    };
    let (st, v) = json_of(
        post(
            "/sync/push",
            json!({"protocol_version": 3, "client_id": CLIENT, "client_generation": generation,
                   "schema": schema, "batch_id": "canary-batch-1",
                   "mutations": [insert("canary-mutation-1", KEYS[1], USER, TEAM, PUSH_VALUE),
                                 insert("canary-mutation-2", KEYS[2], OTHER_USER, TEAM, FORBIDDEN_VALUE)]}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcomes"][0]["status"], "applied", "{v}");
    assert_eq!(v["outcomes"][1]["code"], "forbidden", "{v}");

    // Rebuild, events, a refused cursor, and a later SQL write captured and pulled.
    let (st, v) = json_of(
        post(
            "/sync/rebuild",
            json!({"protocol_version": 3, "client_id": CLIENT, "client_generation": generation,
                   "schema": schema, "scope_id": scopes[1], "limit": 1}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let mut events = post(
        "/sync/events",
        json!({"protocol_version": 3, "client_id": CLIENT, "client_generation": generation}),
    )
    .await
    .unwrap();
    assert_eq!(events.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(10), events.chunk())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_some());
    let (st, v) = json_of(
        post(
            "/sync/pull",
            json!({"protocol_version": 3, "client_id": CLIENT, "client_generation": generation,
                   "schema": schema, "limit": 10, "scope_cursors": {scopes[0].clone(): CURSOR}}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    env.admin
        .batch_execute(&format!(
            "INSERT INTO app.docs VALUES ({}, '{USER}', '{TEAM}', '{LATER_VALUE}')",
            KEYS[3]
        ))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pull_all().await["changes"].as_array().unwrap().len() < 3 {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(events);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = server.kill();
    let _ = server.wait();

    let text = std::fs::read_to_string(&log_path).unwrap();
    let _ = std::fs::remove_file(&log_path);
    // The log is on and verbose: synchro's own request lines are there.
    assert!(text.contains("serving"), "{text}");
    assert!(text.contains("push"), "{text}");
    let mut canaries = vec![
        USER.to_owned(),
        OTHER_USER.to_owned(),
        CLIENT.to_owned(),
        TEAM.to_owned(),
        SQL_VALUE.to_owned(),
        LATER_VALUE.to_owned(),
        PUSH_VALUE.to_owned(),
        FORBIDDEN_VALUE.to_owned(),
        CURSOR.to_owned(),
        SECRET.to_owned(),
        token.clone(),
        token[token.len() - 20..].to_owned(),
        "canary-batch".to_owned(),
        "canary-mutation".to_owned(),
        "notice about".to_owned(),
        "warning about".to_owned(),
    ];
    canaries.extend(KEYS.iter().map(i64::to_string));
    for canary in &canaries {
        assert!(
            !text.contains(canary.as_str()),
            "the log carries {canary}:\n{text}"
        );
    }
}
