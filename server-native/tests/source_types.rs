//! The column types application schemas use (what Prisma and Drizzle emit by default, and
//! hand-written PostgreSQL): `vectors/source-types-v1.json` through the real stack. Each
//! column registers with the vector's portable type; a row written before registration
//! (bootstrap) and one written after (capture) hold the vector's canonical wire value, whose
//! row digest is the vector's; a push of those wire values stores exactly what SQL stored; a
//! pushed value the column's type or domain refuses is a terminal outcome. Registration
//! refuses what it cannot sync (an unconstrained numeric, an array of elements without a
//! portable type, a partitioned table) with the column, its type, why, and the way out.

mod common;

use common::{
    free_port, owner_rule, register_request_with_rule, register_with_rule, source_type_vectors,
    source_types_fixture, source_types_row, source_types_same, start_server, wait_ready, Env,
};
use serde_json::{json, Value};
use synchro_protocol::digest::row_digest_of_values;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Composition, Field, Lifecycle, Manifest, Table};
use synchro_protocol::types::{FieldSpec, PortableType};
use synchro_protocol::value::TypedValue;
use synchro_server::auth::mint;
use synchro_server::publish::load_lineage;

const SECRET: &str = "source-types-secret-0123456789abcd";
/// The spec of a case's value field.
fn spec(case: &Value) -> FieldSpec {
    let ty = PortableType::parse(case["type"].as_str().unwrap()).unwrap();
    match ty {
        PortableType::Decimal => FieldSpec::decimal(
            true,
            case["precision"].as_u64().unwrap() as u32,
            case["scale"].as_u64().unwrap() as u32,
        )
        .unwrap(),
        _ => FieldSpec::new(ty, true).unwrap(),
    }
}

/// The row digest of `{key: 1, value: wire}` in the vectors' table, computed by the protocol
/// library from a wire value.
fn digest_of(v: &Value, case: &Value, wire: &Json) -> String {
    let key_spec = FieldSpec::new(PortableType::Int, false).unwrap();
    let value_spec = spec(case);
    let table = Table {
        table_id: v["table_id"].as_str().unwrap().into(),
        relation_id: "rel_source_types".into(),
        name: "source_types".into(),
        composition: Composition::SingleScope,
        primary_key_field_id: v["key_field_id"].as_str().unwrap().into(),
        lifecycle: Lifecycle::default(),
        fields: vec![
            Field {
                field_id: v["key_field_id"].as_str().unwrap().into(),
                name: "id".into(),
                spec: key_spec,
                writable: false,
            },
            Field {
                field_id: v["value_field_id"].as_str().unwrap().into(),
                name: "value".into(),
                spec: value_spec,
                writable: true,
            },
        ],
        indexes: Vec::new(),
    };
    let hash: [u8; 32] = hex::decode(v["schema_hash"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let values = [
        TypedValue::from_wire(&key_spec, &Json::Number("1".into())).unwrap(),
        TypedValue::from_wire(&value_spec, wire).unwrap(),
    ];
    hex::encode(
        row_digest_of_values(
            &hash,
            &table,
            &values,
            v["server_version"].as_str().unwrap(),
        )
        .unwrap()
        .digest,
    )
}

async fn projection_row(env: &Env, pk: &str) -> Json {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(r) = env
            .admin
            .query_opt(
                "SELECT row_json FROM synchro.projection_rows WHERE pk = $1",
                &[&pk],
            )
            .await
            .unwrap()
        {
            return Json::parse(r.get::<_, &str>(0)).unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "row {pk} never captured"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// One user's HTTP session with the real server: connected once, pushing to the manifest's
/// first table.
struct Session {
    http: reqwest::Client,
    base: String,
    token: String,
    client_id: String,
    generation: Value,
    schema: Value,
    table_id: String,
}

impl Session {
    async fn connect(base: &str, user: &str, manifest: &Manifest) -> Session {
        let mut s = Session {
            http: reqwest::Client::new(),
            base: base.to_owned(),
            token: mint(SECRET.as_bytes(), user, 3600),
            client_id: format!("cli_{user}"),
            generation: Value::Null,
            schema: json!({"version": manifest.schema_version, "hash": manifest.schema_hash_hex()}),
            table_id: manifest.tables[0].table_id.clone(),
        };
        let connected = s
            .post(
                "/sync/connect",
                json!({"protocol_version": 3, "client_id": s.client_id,
                       "schema": {"version": 0, "hash": ""}}),
            )
            .await;
        s.generation = connected["client_generation"].clone();
        s
    }

    /// POSTs `body`; the response body of a 200.
    async fn post(&self, path: &str, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.token))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert_eq!(status, 200, "{path}: {v}");
        v
    }

    fn mutation(
        &self,
        id: &str,
        op: &str,
        pk: Value,
        base: Option<&str>,
        columns: Vec<Value>,
    ) -> Value {
        json!({
            "mutation_id": id, "table_id": self.table_id, "pk": pk, "operation": op,
            "base_version": base, "client_version": 1, "local_order": 1, "columns": columns,
            "authored_schema": self.schema,
        })
    }

    async fn push(&self, batch: &str, mutations: Vec<Value>) -> Value {
        self.post(
            "/sync/push",
            json!({"protocol_version": 3, "client_id": self.client_id,
                   "client_generation": self.generation, "schema": self.schema,
                   "batch_id": batch, "mutations": mutations}),
        )
        .await
    }
}

#[tokio::test]
async fn application_column_types_register_capture_and_push_exactly() {
    let v = source_type_vectors();
    let env = Env::installed().await;
    let cases = source_types_fixture(&env).await;

    // Each column's portable type (and declared precision and scale) is the vector's.
    let manifest = load_lineage(&env.login("synchro_dev_adapter").await)
        .await
        .unwrap()
        .current()
        .unwrap()
        .clone();
    let table = &manifest.tables[0];
    let field_of = |i: usize| {
        table
            .fields
            .iter()
            .find(|f| f.name == format!("c{i}"))
            .unwrap_or_else(|| panic!("no field c{i}"))
    };
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(field_of(i).spec, spec(c), "{}", c["name"]);
    }

    let port = free_port();
    let _server = start_server(&env, port, SECRET);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&reqwest::Client::new(), &base).await;
    env.as_app_owner(&format!(
        "INSERT INTO app.source_types VALUES {}",
        source_types_row(&cases, 2, "alice")
    ))
    .await;

    // Bootstrap (row 1) and capture (row 2) give the vector's wire value and digest.
    for pk in ["1", "2"] {
        let row = projection_row(&env, pk).await;
        for (i, c) in cases.iter().enumerate() {
            let expected = Json::parse(&c["wire"].to_string()).unwrap();
            let got = row.get(&field_of(i).field_id).cloned().unwrap();
            assert_eq!(got, expected, "row {pk}, {}", c["name"]);
            assert_eq!(
                digest_of(&v, c, &got),
                c["row_digest"].as_str().unwrap(),
                "{}",
                c["name"]
            );
        }
    }

    // A push of the wire values stores what SQL stored.
    let alice = Session::connect(&base, "alice", &manifest).await;
    let field = |name: &str| {
        table
            .fields
            .iter()
            .find(|f| f.name == name)
            .unwrap()
            .field_id
            .clone()
    };
    let mut push_columns = vec![json!({"field_id": field("owner"), "value": "alice"})];
    for (i, c) in cases.iter().enumerate() {
        push_columns.push(json!({"field_id": field_of(i).field_id, "value": c["wire"]}));
    }
    let pushed = alice
        .push(
            "b1",
            vec![alice.mutation("m1", "insert", json!(3), None, push_columns)],
        )
        .await;
    let outcome = &pushed["outcomes"][0];
    assert_eq!(outcome["status"], "applied", "{pushed}");
    let same = source_types_same(&env, cases.len(), 3, 1).await;
    for (i, c) in cases.iter().enumerate() {
        assert!(same[i], "pushed {} differs from what SQL stored", c["name"]);
    }
    // The outcome's row holds the same wire values.
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(
            outcome["row"][field_of(i).field_id.as_str()],
            c["wire"],
            "{}",
            c["name"]
        );
    }

    // A value outside the enum, or one the domain's constraint refuses: a terminal outcome,
    // nothing written.
    let version = outcome["server_version"].as_str().unwrap().to_owned();
    let column = |name: &str| {
        let i = cases.iter().position(|c| c["name"] == name).unwrap();
        field_of(i).field_id.clone()
    };
    // Likewise an array field's value that is no array of its elements' wire values: not an
    // array, an element of another JSON type, ragged dimensions, or one the element type
    // refuses.
    for (n, (case, value)) in [
        ("enum", "angry"),
        ("domain over text", "no-at-sign"),
        ("text[]", "\"not-an-array\""),
        ("text[]", "[\"a\",7]"),
        ("integer[][]", "[[1,2],[3]]"),
        ("integer[][]", "[1.5]"),
        ("integer[][]", "[[[[[[[1]]]]]]]"),
        ("text[]", "[{\"a\":1}]"),
        ("text[]", "{\"a\":[\"b\"]}"),
        ("enum[]", "[\"furious\"]"),
        ("bytea[]", "[\"!!\"]"),
    ]
    .into_iter()
    .enumerate()
    {
        let refused = alice
            .push(
                &format!("bad{n}"),
                vec![alice.mutation(
                    &format!("bad{n}"),
                    "update",
                    json!(3),
                    Some(&version),
                    vec![json!({"field_id": column(case), "value": value})],
                )],
            )
            .await;
        let o = &refused["outcomes"][0];
        assert_eq!(
            (&o["status"], &o["code"]),
            (&json!("rejected_terminal"), &json!("invalid_value")),
            "{case}: {refused}"
        );
        // It names the field (by the manifest's name).
        let i = cases.iter().position(|c| c["name"] == case).unwrap();
        let message = o["message"].as_str().unwrap();
        assert!(
            message.ends_with(&format!("value of c{i} (outside its type, enum or domain)")),
            "{case}: {message}"
        );
        assert!(
            !refused.to_string().contains(value),
            "the value is not echoed: {refused}"
        );
    }
    let unchanged: bool = env
        .admin
        .query_one(
            "SELECT a.c5::text = 'happy' AND a.c7::text = 'a@example.com' FROM app.source_types a WHERE a.id = 3",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(unchanged);
    let version_now: String = env
        .admin
        .query_one(
            "SELECT version::text FROM synchro.source_versions WHERE pk = '3'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version_now, version, "no refused write took a version");
}

/// An array json cannot carry (a lower bound other than 1), or with an element its element
/// type's portable type cannot hold (NaN, infinity), is refused where it is written, like
/// any scalar: never left to block capture.
#[tokio::test]
async fn arrays_json_cannot_carry_are_refused_where_written() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.series (id integer PRIMARY KEY, xs integer[], fs float8[], ds date[], js json[]);
         INSERT INTO app.series VALUES (1, '{1,2}', '{0.5}', '{2024-01-01}', '{\"[1]\"}')",
    )
    .await;
    let (code, body, _) = register_cli(&env, "series", &[]);
    assert_eq!(code, 0, "{body}");
    for (n, (column, value)) in [
        ("xs", "'[0:1]={1,2}'"),
        ("xs", "'[1:1][0:1]={{1,2}}'"),
        ("fs", "'{1,NaN}'"),
        ("fs", "'{{1},{Infinity}}'"),
        ("ds", "'{infinity}'"),
        ("js", "ARRAY['{\"a\":1,\"a\":2}'::json]"),
    ]
    .into_iter()
    .enumerate()
    {
        let id = 10 + n as i32;
        assert_eq!(
            common::sqlstate(
                &env.admin,
                &format!("INSERT INTO app.series (id, {column}) VALUES ({id}, {value})")
            )
            .await,
            "22SY1",
            "{column} = {value}"
        );
        assert_eq!(
            common::sqlstate(
                &env.admin,
                &format!("UPDATE app.series SET {column} = {value} WHERE id = 1")
            )
            .await,
            "22SY1",
            "{column} = {value}"
        );
    }
    // A lower bound of 1, empty arrays and NULL elements are fine.
    assert_eq!(
        common::sqlstate(
            &env.admin,
            "INSERT INTO app.series VALUES (2, '{}', '{NULL,1e300}', '{NULL}', '{}')"
        )
        .await,
        "ok"
    );
    // A relation already holding one is refused at registration, naming the column.
    env.as_app_owner(
        "CREATE TABLE app.offset_arrays (id integer PRIMARY KEY, xs integer[]);
         INSERT INTO app.offset_arrays VALUES (1, '[5:6]={1,2}')",
    )
    .await;
    let (code, body, _) = register_cli(&env, "offset_arrays", &[]);
    assert_eq!(code, 1);
    assert_eq!(
        (&body["error"]["reason"], &body["error"]["column"]),
        (&json!("unrepresentable_value"), &json!("xs")),
        "{body}"
    );
}

/// `synchro-server registry register --schema app <args>` as the operator: (exit code, stdout
/// JSON or null, stderr).
fn registry_register(env: &Env, args: &[&str]) -> (i32, Value, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
        .args(["registry", "register", "--schema", "app"])
        .args(args)
        .env(
            "DATABASE_URL",
            env.cluster.url("synchro_dev_operator", "app"),
        )
        .env_remove("SYNCHRO_LOG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`registry_register`] of `--relation <relation>` and `extra`.
fn register_cli(env: &Env, relation: &str, extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["--relation", relation];
    args.extend_from_slice(extra);
    registry_register(env, &args)
}

/// `column:type` of each field of each relation a several-relation registration printed.
fn registered_types(registered: &Value) -> Vec<Vec<String>> {
    registered["registered"]
        .as_array()
        .unwrap_or_else(|| panic!("{registered}"))
        .iter()
        .map(|t| {
            t["fields"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    format!(
                        "{}:{}",
                        f["column"].as_str().unwrap(),
                        f["type"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .collect()
}

/// What registration cannot sync is refused with the spec's error body, and the CLI says which
/// column, its type, why, and the way out; the way out it names works.
#[tokio::test]
async fn refusals_name_the_column_its_type_why_and_the_way_out() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.prices (id uuid PRIMARY KEY, amount numeric, label text);
         CREATE TABLE app.posts (id text PRIMARY KEY, tags text[], spots point[]);
         CREATE TABLE app.events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at timestamp);
         CREATE TABLE app.post_tags (post_id text, tag_id text, PRIMARY KEY (post_id, tag_id));
         CREATE TABLE app.measurements (id bigint PRIMARY KEY, region text) PARTITION BY RANGE (id);
         CREATE TABLE app.measurements_eu PARTITION OF app.measurements FOR VALUES FROM (0) TO (1000);
         CREATE TABLE app.measurements_us PARTITION OF app.measurements FOR VALUES FROM (1000) TO (2000);",
    )
    .await;
    let (code, body, hint) = register_cli(&env, "prices", &[]);
    assert_eq!(code, 1);
    assert_eq!(
        body,
        json!({"error": {"code": "invalid_column", "reason": "unsupported_column_type",
                         "column": "amount", "type": "numeric"}})
    );
    for words in [
        "column amount is of type numeric",
        "precision and scale",
        "TYPE numeric(",
        "--server-only amount",
    ] {
        assert!(hint.contains(words), "{words:?} in {hint}");
    }
    let (code, body, hint) = register_cli(&env, "posts", &[]);
    assert_eq!(code, 1);
    assert_eq!(body["error"]["type"], "point[]", "{body}");
    assert!(
        hint.contains("elements (point)") && hint.contains("--server-only spots"),
        "{hint}"
    );
    let (code, body, hint) = register_cli(&env, "events", &[]);
    assert_eq!(code, 1);
    assert_eq!(
        body["error"]["reason"], "unsupported_primary_key_type",
        "{body}"
    );
    assert!(
        hint.contains("--no-push") && hint.contains("offline"),
        "{hint}"
    );
    let (code, body, hint) = register_cli(&env, "post_tags", &[]);
    assert_eq!(code, 1);
    assert_eq!(body["error"]["reason"], "composite_primary_key", "{body}");
    assert!(hint.contains("ADD UNIQUE"), "{hint}");
    let (code, body, hint) = register_cli(&env, "measurements", &[]);
    assert_eq!(code, 1);
    assert_eq!(
        body["error"]["reason"], "ambiguous_physical_relation",
        "{body}"
    );
    assert!(
        hint.contains("partitioned table") && hint.contains("2 partitions"),
        "{hint}"
    );
    // Nothing was recorded by any refusal.
    let recorded: i64 = env
        .admin
        .query_one("SELECT count(*) FROM synchro.relations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, 0);

    // A dry run reports every column of each relation at once, with the type it would get
    // or why not, and records nothing.
    let (code, body, _) = register_cli(
        &env,
        "prices",
        &["--relation", "posts", "--relation", "events", "--check"],
    );
    assert_eq!(code, 1, "{body}");
    assert_eq!(body["ok"], false, "{body}");
    let reports = body["relations"].as_array().unwrap();
    assert_eq!(
        reports.iter().map(|r| &r["relation"]).collect::<Vec<_>>(),
        ["app.prices", "app.posts", "app.events"]
    );
    let prices = &reports[0]["columns"];
    assert_eq!(
        (&prices[0]["column"], &prices[0]["type"]),
        (&json!("id"), &json!("string"))
    );
    assert_eq!(prices[1]["type"], Value::Null, "{body}");
    assert!(prices[1]["hint"].as_str().unwrap().contains("numeric("));
    assert_eq!(prices[2]["type"], "string");
    assert_eq!(reports[0]["error"]["reason"], "unsupported_column_type");
    assert_eq!(
        reports[2]["error"]["reason"], "unsupported_primary_key_type",
        "{body}"
    );
    assert_eq!(reports[2]["columns"][1]["type"], "datetime", "{body}");
    // Several relations in one command are registered together or not at all.
    let (code, body, stderr) = register_cli(
        &env,
        "prices",
        &["--relation", "posts", "--server-only", "prices.amount"],
    );
    assert_eq!(code, 1, "{body}");
    assert_eq!(body["error"]["column"], "spots", "{body}");
    assert!(stderr.contains("app.posts was refused"), "{stderr}");
    assert_eq!(
        env.admin
            .query_one("SELECT count(*) FROM synchro.relations", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        0,
        "prices was not registered alone"
    );
    let (code, _, stderr) = register_cli(
        &env,
        "prices",
        &["--relation", "posts", "--server-only", "amount"],
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("RELATION.COLUMN"), "ambiguous: {stderr}");

    // The ways out: the column kept on the server, no push for a database-generated key, a
    // partition registered on its own.
    let (code, body, _) = register_cli(
        &env,
        "prices",
        &[
            "--relation",
            "posts",
            "--server-only",
            "prices.amount",
            "--server-only",
            "posts.spots",
        ],
    );
    assert_eq!(code, 0, "{body}");
    assert_eq!(body["registered"].as_array().unwrap().len(), 2, "{body}");
    let (code, body, _) = register_cli(&env, "events", &["--no-push"]);
    assert_eq!(code, 0, "{body}");
    assert_eq!(body["fields"][1]["type"], "datetime", "{body}");
    let (code, body, _) = register_cli(&env, "measurements_eu", &[]);
    assert_eq!(code, 0, "{body}");
}

/// `registry register --all`: every table of a schema not registered yet, in one command (an
/// ORM-style schema: uuid and serial keys, an enum, a domain, naive timestamps, a wide
/// decimal), after a dry run that finds nothing to refuse.
#[tokio::test]
async fn a_whole_schema_registers_in_one_command() {
    let env = Env::installed().await;
    env.admin
        .batch_execute(
            "CREATE TYPE role AS ENUM ('USER', 'ADMIN');
             CREATE DOMAIN email AS text CHECK (VALUE LIKE '%@%');",
        )
        .await
        .unwrap();
    env.as_app_owner(
        "CREATE TABLE app.\"User\" (id text PRIMARY KEY, email email NOT NULL, role role NOT NULL DEFAULT 'USER',
             \"createdAt\" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP, \"updatedAt\" timestamp(3) NOT NULL);
         CREATE TABLE app.\"Invoice\" (id serial PRIMARY KEY, \"userId\" text NOT NULL REFERENCES app.\"User\",
             total decimal(65, 30) NOT NULL, \"paidAt\" timestamp(3));
         CREATE TABLE app.\"Tag\" (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), name varchar(40) NOT NULL UNIQUE)",
    )
    .await;
    let (code, checked, _) = registry_register(&env, &["--all", "--check"]);
    assert_eq!((code, &checked["ok"]), (0, &json!(true)), "{checked}");
    assert_eq!(checked["relations"].as_array().unwrap().len(), 3);
    let (code, body, _) = register_cli(&env, "x", &[]);
    assert_eq!(code, 1, "no such table: {body}");
    let (code, registered, _) = registry_register(&env, &["--all"]);
    assert_eq!(code, 0, "{registered}");
    let types = registered_types(&registered);
    assert_eq!(
        types,
        [
            vec![
                "id:int",
                "userId:string",
                "total:decimal",
                "paidAt:datetime"
            ],
            vec!["id:string", "name:string"],
            vec![
                "id:string",
                "email:string",
                "role:string",
                "createdAt:datetime",
                "updatedAt:datetime"
            ],
        ]
    );
    // Nothing is left to register.
    let (_, again, _) = registry_register(&env, &["--all"]);
    assert_eq!(again, json!({"registered": []}));
}

/// The documented pattern for a join table whose natural key is composite: a one-column key
/// clients make, the natural key kept unique. A client links and unlinks; a second link of
/// the same pair is a terminal outcome.
#[tokio::test]
async fn a_join_table_syncs_through_a_one_column_key() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.post_tags (post_id text NOT NULL, tag_id text NOT NULL, owner text NOT NULL,
             PRIMARY KEY (post_id, tag_id))",
    )
    .await;
    let (code, body, _) = register_cli(&env, "post_tags", &[]);
    assert_eq!(
        (code, &body["error"]["reason"]),
        (1, &json!("composite_primary_key"))
    );
    // docs/operator.md "Column types", as written there.
    env.as_app_owner(
        "ALTER TABLE app.post_tags ADD COLUMN id uuid NOT NULL DEFAULT gen_random_uuid(),
             DROP CONSTRAINT post_tags_pkey, ADD PRIMARY KEY (id), ADD UNIQUE (post_id, tag_id)",
    )
    .await;
    register_with_rule(&env, "post_tags", &owner_rule("post_tags", "uuid")).await;
    let manifest = load_lineage(&env.login("synchro_dev_adapter").await)
        .await
        .unwrap()
        .current()
        .unwrap()
        .clone();
    let field = |name: &str| {
        manifest.tables[0]
            .fields
            .iter()
            .find(|f| f.name == name)
            .unwrap()
            .field_id
            .clone()
    };
    let port = free_port();
    let _server = start_server(&env, port, SECRET);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&reqwest::Client::new(), &base).await;
    let alice = Session::connect(&base, "alice", &manifest).await;
    let link = |id: &str, mutation: &str| {
        alice.mutation(
            mutation,
            "insert",
            json!(id),
            None,
            vec![
                json!({"field_id": field("post_id"), "value": "post-1"}),
                json!({"field_id": field("tag_id"), "value": "tag-1"}),
                json!({"field_id": field("owner"), "value": "alice"}),
            ],
        )
    };
    let first = "0b6f5e3c-7d1a-4c55-9a57-3f0f2a9e8a01";
    let linked = alice.push("b1", vec![link(first, "m1")]).await;
    assert_eq!(linked["outcomes"][0]["status"], "applied", "{linked}");
    let again = alice
        .push(
            "b2",
            vec![link("5d8e0f4a-2b3c-4d5e-8f60-718293a4b5c6", "m2")],
        )
        .await;
    assert_eq!(
        (
            &again["outcomes"][0]["status"],
            &again["outcomes"][0]["code"]
        ),
        (&json!("rejected_terminal"), &json!("constraint_violation")),
        "{again}"
    );
    let version = linked["outcomes"][0]["server_version"].as_str().unwrap();
    let unlinked = alice
        .push(
            "b3",
            vec![alice.mutation("m3", "delete", json!(first), Some(version), vec![])],
        )
        .await;
    assert_eq!(unlinked["outcomes"][0]["status"], "applied", "{unlinked}");
    let left: i64 = env
        .admin
        .query_one("SELECT count(*) FROM app.post_tags", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

/// The README's "Your own schema" example, run as written: the check finds nothing to refuse
/// and `--all` registers both tables with the types the README names.
#[tokio::test]
async fn the_readme_schema_registers_as_the_readme_says() {
    let readme = include_str!("../../README.md");
    let section = &readme[readme.find("## Your own schema").unwrap()..];
    let sql = &section[section.find("```sql\n").unwrap() + 7..];
    let sql = &sql[..sql.find("```").unwrap()];
    let env = Env::installed().await;
    env.as_app_owner(sql).await;
    let (_, checked, _) = registry_register(&env, &["--all", "--check"]);
    assert_eq!(checked["ok"], true, "{checked}");
    let (_, registered, _) = registry_register(&env, &["--all"]);
    assert_eq!(
        registered_types(&registered),
        [
            vec![
                "id:string",
                "userId:string",
                "total:decimal",
                "paidAt:datetime"
            ],
            vec![
                "id:string",
                "email:string",
                "role:string",
                "tags:json",
                "createdAt:datetime",
                "updatedAt:datetime"
            ],
        ]
    );
}

/// `timestamp` (without time zone) columns read in a time zone, or as text: the UTC instant
/// of the local time (the earlier of a repeated one), a skipped local time refused where it
/// is written, a push stored as the local time of its instant; text kept as PostgreSQL
/// writes it; and declarations PostgreSQL cannot read refused.
#[tokio::test]
async fn timestamps_are_read_in_their_declared_zone_or_as_text() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.meetings (id integer PRIMARY KEY, owner text NOT NULL, local_at timestamp,
             paris_at timestamp, raw_at timestamp(3), utc_at timestamp);
         INSERT INTO app.meetings VALUES (1, 'alice', '2024-07-04 12:00', '2024-10-27 02:30',
             '2024-02-29 23:59:59.999', '2024-01-01 00:00')",
    )
    .await;
    // Declarations PostgreSQL cannot read, or that name no timestamp column, are refused.
    for bad in ["Mars/Olympus", "owner=UTC", "nope=text"] {
        let (code, _, stderr) = register_cli(&env, "meetings", &["--timestamp-zone", bad]);
        assert_eq!(code, 1, "{bad}");
        assert!(
            stderr.contains("timestamp zone") || stderr.contains("--timestamp-zone"),
            "{bad}: {stderr}"
        );
    }
    // The SQL entry point checks the same (without the CLI's own check of the zone).
    let op = env.login("synchro_dev_operator").await;
    for zones in [
        r#"{"*": "Mars/Olympus"}"#,
        r#"{"owner": "UTC"}"#,
        r#"{"*": 3}"#,
        "[]",
    ] {
        assert_eq!(
            common::sqlstate(
                &op,
                &format!(
                    "SELECT synchro.synchro_register_relation('app', 'meetings', 10, 10,
                         p_timestamp_zones => '{zones}')"
                )
            )
            .await,
            "22023",
            "{zones}"
        );
    }
    let zones = [
        ("*", "America/New_York"),
        ("paris_at", "Europe/Paris"),
        ("raw_at", "text"),
        ("utc_at", "UTC"),
    ];
    let request = synchro_server::registry::RegisterRequest {
        timestamp_zones: zones
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..synchro_server::registry::RegisterRequest::synced("app", "meetings", "multi_scope")
    };
    register_request_with_rule(&env, &request, &owner_rule("meetings", "integer")).await;
    let manifest = load_lineage(&env.login("synchro_dev_adapter").await)
        .await
        .unwrap()
        .current()
        .unwrap()
        .clone();
    let table = &manifest.tables[0];
    let field = |name: &str| {
        table
            .fields
            .iter()
            .find(|f| f.name == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        ["local_at", "paris_at", "raw_at", "utc_at"].map(|c| field(c).spec.ty.as_str()),
        ["datetime", "datetime", "string", "datetime"]
    );
    // A local time Paris skips, an infinite one: refused where written; as text, anything.
    for (column, value) in [("paris_at", "2024-03-31 02:30"), ("local_at", "infinity")] {
        assert_eq!(
            common::sqlstate(
                &env.admin,
                &format!("UPDATE app.meetings SET {column} = '{value}' WHERE id = 1")
            )
            .await,
            "22SY1",
            "{column} = {value}"
        );
    }
    assert_eq!(
        common::sqlstate(
            &env.admin,
            "INSERT INTO app.meetings (id, owner, raw_at) VALUES (9, 'bob', 'infinity')"
        )
        .await,
        "ok"
    );

    let port = free_port();
    let _server = start_server(&env, port, SECRET);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&reqwest::Client::new(), &base).await;
    let expected = [
        ("local_at", json!("2024-07-04T16:00:00.000000Z")),
        // The repeated hour: the earlier instant (summer time).
        ("paris_at", json!("2024-10-27T00:30:00.000000Z")),
        ("raw_at", json!("2024-02-29 23:59:59.999")),
        ("utc_at", json!("2024-01-01T00:00:00.000000Z")),
    ];
    let row = projection_row(&env, "1").await;
    for (column, wire) in &expected {
        assert_eq!(
            row.get(&field(column).field_id).cloned().unwrap(),
            Json::parse(&wire.to_string()).unwrap(),
            "{column}"
        );
    }
    // A push of those instants stores the same local times.
    let alice = Session::connect(&base, "alice", &manifest).await;
    let mut columns = vec![json!({"field_id": field("owner").field_id, "value": "alice"})];
    for (column, wire) in &expected {
        columns.push(json!({"field_id": field(column).field_id, "value": wire}));
    }
    let pushed = alice
        .push(
            "z1",
            vec![alice.mutation("z1", "insert", json!(2), None, columns)],
        )
        .await;
    assert_eq!(pushed["outcomes"][0]["status"], "applied", "{pushed}");
    let same: bool = env
        .admin
        .query_one(
            "SELECT a.local_at = b.local_at AND a.paris_at = b.paris_at AND a.raw_at = b.raw_at
                    AND a.utc_at = b.utc_at
               FROM app.meetings a JOIN app.meetings b ON b.id = 1 WHERE a.id = 2",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(same, "{pushed}");
    // The later instant of the repeated hour is the same local time: stored as 02:30, and
    // read back as the earlier instant.
    let version = pushed["outcomes"][0]["server_version"].as_str().unwrap();
    let later = alice
        .push(
            "z2",
            vec![alice.mutation(
                "z2",
                "update",
                json!(2),
                Some(version),
                vec![json!({"field_id": field("paris_at").field_id, "value": "2024-10-27T01:30:00.000000Z"})],
            )],
        )
        .await;
    let o = &later["outcomes"][0];
    assert_eq!(o["status"], "applied", "{later}");
    assert_eq!(
        o["row"][field("paris_at").field_id.as_str()],
        "2024-10-27T00:30:00.000000Z"
    );
    let local: String = env
        .admin
        .query_one("SELECT paris_at::text FROM app.meetings WHERE id = 2", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(local, "2024-10-27 02:30:00");
}
