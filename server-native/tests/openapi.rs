//! docs/openapi.json against the real server (issue 33.8): `synchro-server serve` on a real
//! PostgreSQL answers each endpoint, successes and errors, and every exchange is checked
//! against the document: the request body against the operation's request schema, the
//! status is one the operation documents, the content type is the documented one, and a
//! JSON body validates against its schema (JSON Schema 2020-12, with the document's
//! components). Every operation of the document is exercised at least once.

mod common;

use std::collections::BTreeSet;

use common::{free_port, Env};
use serde_json::{json, Value};
use synchro_server::auth::mint;

const SECRET: &str = "openapi-secret-0123456789abcdefgh";

struct Spec {
    doc: Value,
    seen: BTreeSet<(String, String)>,
    base: String,
    http: reqwest::Client,
}

impl Spec {
    /// A validator for `schema` resolved against the document's components.
    fn validator(&self, schema: &Value) -> jsonschema::Validator {
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": self.doc["components"],
            "allOf": [schema],
        });
        jsonschema::validator_for(&root).expect("the document's schemas compile")
    }

    fn check(&self, what: &str, schema: &Value, value: &Value) {
        let v = self.validator(schema);
        let errors: Vec<String> = v
            .iter_errors(value)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{what}: {errors:#?}\n{value}");
    }

    /// Sends `body` (JSON) with `token` and checks the exchange; returns the status and the
    /// JSON body (Null for another content type) or the text.
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        template: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value, String) {
        let operation = self.doc["paths"][template][method].clone();
        assert!(
            operation.is_object(),
            "{method} {template} is not documented"
        );
        if let Some(b) = body {
            let schema = &operation["requestBody"]["content"]["application/json"]["schema"];
            // (A request meant to be refused need not validate; one meant to succeed must.)
            if !b.get("__invalid").is_some_and(|v| v == true) {
                self.check(&format!("{method} {path} request"), schema, b);
            }
        }
        let url = format!("{}{path}", self.base);
        let mut request = match method {
            "get" => self.http.get(&url),
            _ => self.http.post(&url),
        };
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        if let Some(b) = body {
            let mut b = b.clone();
            if let Some(o) = b.as_object_mut() {
                o.remove("__invalid");
            }
            request = request
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let documented = &operation["responses"][status.to_string()];
        assert!(
            documented.is_object(),
            "{method} {path} answered {status}, which the document does not list"
        );
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = if template == "/sync/events" && status == 200 {
            // A stream: read until its first event, then drop it.
            let mut response = response;
            let mut text = String::new();
            while !text.contains("\n\n") {
                let chunk = response.chunk().await.unwrap().expect("an event");
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            text
        } else {
            response.text().await.unwrap()
        };
        let mut json_body = Value::Null;
        if let Some(content) = documented.get("content").and_then(Value::as_object) {
            let content_type = content_type.expect("a content type");
            let media = content_type.split(';').next().unwrap().trim();
            let entry = content.get(media).unwrap_or_else(|| {
                panic!("{method} {path} {status}: content type {content_type} not documented")
            });
            if media == "application/json" {
                json_body = serde_json::from_str(&text).unwrap();
                self.check(
                    &format!("{method} {path} {status}"),
                    &entry["schema"],
                    &json_body,
                );
            }
        }
        self.seen.insert((method.to_owned(), template.to_owned()));
        (status, json_body, text)
    }
}

#[tokio::test]
async fn the_openapi_document_describes_the_real_servers_answers() {
    let env = Env::installed().await;
    common::docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs VALUES (1, 'alice', 'red', 'one'), (2, 'bob', 'red', 'two')",
    )
    .await;
    let port = free_port();
    let _server =
        common::start_server_binary(env!("CARGO_BIN_EXE_synchro-server"), &env, port, SECRET);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    common::wait_ready(&http, &base).await;
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut spec = Spec {
        doc,
        seen: BTreeSet::new(),
        base,
        http,
    };
    let alice = mint(SECRET.as_bytes(), "alice", 3600);

    let (status, ready, _) = spec.call("get", "/ready", "/ready", None, None).await;
    assert_eq!((status, &ready["status"]), (200, &json!("ready")));

    // connect: fresh, then again, then refused ways.
    let fresh =
        json!({"protocol_version": 3, "client_id": "c1", "schema": {"version": 0, "hash": ""}});
    let (status, connected, _) = spec
        .call(
            "post",
            "/sync/connect",
            "/sync/connect",
            Some(&alice),
            Some(&fresh),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(connected["schema"]["action"], "replace");
    let generation = connected["client_generation"].clone();
    let schema =
        json!({"version": connected["schema"]["version"], "hash": connected["schema"]["hash"]});
    let again = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation, "schema": schema});
    let (status, _, _) = spec
        .call(
            "post",
            "/sync/connect",
            "/sync/connect",
            Some(&alice),
            Some(&again),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _, _) = spec
        .call("post", "/sync/connect", "/sync/connect", None, Some(&fresh))
        .await;
    assert_eq!(status, 401);
    let (status, _, _) = spec
        .call(
            "post",
            "/sync/connect",
            "/sync/connect",
            Some(&alice),
            Some(&json!({"__invalid": true, "protocol_version": 3})),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _, _) = spec
        .call(
            "post",
            "/sync/connect",
            "/sync/connect",
            Some(&alice),
            Some(
                &json!({"__invalid": true, "protocol_version": 2, "client_id": "c9",
                         "schema": {"version": 0, "hash": ""}}),
            ),
        )
        .await;
    assert!(status == 426 || status == 400, "{status}");

    // pull: every assigned scope from the start, then an expired generation.
    let scopes: Vec<String> = connected["scope_updates"]["added"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    let cursors: serde_json::Map<String, Value> =
        scopes.iter().map(|s| (s.clone(), Value::Null)).collect();
    let pull = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                      "schema": schema, "scope_cursors": cursors, "limit": 1000});
    let (status, page, _) = spec
        .call(
            "post",
            "/sync/pull",
            "/sync/pull",
            Some(&alice),
            Some(&pull),
        )
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(!page["changes"].as_array().unwrap().is_empty(), "{page}");
    let mut stale = pull.clone();
    stale["client_generation"] = json!(999);
    let (status, _, _) = spec
        .call(
            "post",
            "/sync/pull",
            "/sync/pull",
            Some(&alice),
            Some(&stale),
        )
        .await;
    assert_eq!(status, 409);

    // rebuild: a whole scope in one page.
    let rebuild = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                         "schema": schema, "scope_id": "team:red", "limit": 1000});
    let (status, rebuilt, _) = spec
        .call(
            "post",
            "/sync/rebuild",
            "/sync/rebuild",
            Some(&alice),
            Some(&rebuild),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(rebuilt["has_more"], false);

    // push: applied, refused for a value, and a wrong generation.
    let table = connected["schema_definition"]["tables"][0].clone();
    let field = |name: &str| common::field_id(&table, name);
    let mutation = |id: &str, pk: &str, title: Value| {
        json!({"mutation_id": id, "table_id": table["table_id"], "pk": pk, "operation": "insert",
               "base_version": null, "client_version": 1, "local_order": 1, "authored_schema": schema,
               "columns": [{"field_id": field("owner"), "value": "alice"},
                           {"field_id": field("team"), "value": "red"},
                           {"field_id": field("title"), "value": title}]})
    };
    let push = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                      "schema": schema, "batch_id": "b1",
                      "mutations": [mutation("m1", "10", json!("new")), mutation("m2", "11", json!(42))]});
    let (status, pushed, _) = spec
        .call(
            "post",
            "/sync/push",
            "/sync/push",
            Some(&alice),
            Some(&push),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(pushed["outcomes"][0]["status"], "applied", "{pushed}");
    assert_eq!(
        pushed["outcomes"][1]["status"], "rejected_terminal",
        "{pushed}"
    );
    let mut expired = push.clone();
    expired["client_generation"] = json!(999);
    expired["batch_id"] = json!("b2");
    let (status, _, _) = spec
        .call(
            "post",
            "/sync/push",
            "/sync/push",
            Some(&alice),
            Some(&expired),
        )
        .await;
    assert_eq!(status, 409);

    // events: the stream opens with `ready`.
    let events = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation});
    let (status, _, text) = spec
        .call(
            "post",
            "/sync/events",
            "/sync/events",
            Some(&alice),
            Some(&events),
        )
        .await;
    assert_eq!(status, 200);
    assert!(text.contains("event: ready"), "{text}");

    // seeds (no --seed-dir here) and metrics.
    let (status, _, _) = spec
        .call(
            "get",
            "/seeds/board.seed.sqlite",
            "/seeds/{name}",
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(status, 404);
    let (status, _, metrics) = spec.call("get", "/metrics", "/metrics", None, None).await;
    assert_eq!(status, 200);
    assert!(!metrics.is_empty());

    // Every documented operation was exercised.
    let documented: BTreeSet<(String, String)> = spec.doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), p.clone()))
        })
        .collect();
    assert_eq!(spec.seen, documented);
}
