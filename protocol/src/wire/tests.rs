//! Every message round-trips through its canonical text; strict parsing refuses unknown
//! members, wrong types and out-of-range integers.

use proptest::prelude::*;

use super::*;
use crate::checksum::Checksum;
use crate::json::Json;

fn ident() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9:_-]{0,20}"
}

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,12}"
}

fn counter() -> impl Strategy<Value = u64> {
    1..=crate::manifest::MAX_JSON_COUNTER
}

fn digest() -> impl Strategy<Value = Checksum> {
    proptest::array::uniform32(any::<u8>()).prop_map(Checksum)
}

fn hash() -> impl Strategy<Value = String> {
    proptest::array::uniform32(any::<u8>()).prop_map(hex::encode)
}

fn value() -> impl Strategy<Value = Json> {
    prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        text().prop_map(Json::String),
        (-1000i64..1000).prop_map(|n| Json::Number(n.to_string())),
    ]
}

fn row() -> impl Strategy<Value = Json> {
    proptest::collection::btree_map(ident(), value(), 0..4)
        .prop_map(|m| Json::Object(m.into_iter().collect()))
}

fn schema() -> impl Strategy<Value = Json> {
    (counter(), hash()).prop_map(|(v, h)| {
        Json::Object(vec![
            ("hash".into(), Json::String(h)),
            ("version".into(), Json::Number(v.to_string())),
        ])
    })
}

fn cursors() -> impl Strategy<Value = std::collections::BTreeMap<String, Option<String>>> {
    proptest::collection::btree_map(ident(), proptest::option::of(ident()), 0..4)
}

fn authored() -> impl Strategy<Value = AuthoredSchema> {
    (counter(), hash()).prop_map(|(version, hash)| AuthoredSchema { version, hash })
}

fn mutation() -> impl Strategy<Value = Mutation> {
    (
        ident(),
        ident(),
        text(),
        prop_oneof![
            Just(Operation::Insert),
            Just(Operation::Update),
            Just(Operation::Delete)
        ],
        proptest::option::of(ident()),
        counter(),
        counter(),
        proptest::collection::btree_map(ident(), value(), 0..4),
        authored(),
    )
        .prop_map(
            |(
                mutation_id,
                table_id,
                pk,
                operation,
                base_version,
                cv,
                lo,
                cols,
                authored_schema,
            )| {
                Mutation {
                    mutation_id,
                    table_id,
                    pk: Json::String(pk),
                    operation,
                    base_version,
                    client_version: cv,
                    local_order: lo,
                    columns: if operation == Operation::Delete {
                        Vec::new()
                    } else {
                        cols.into_iter()
                            .map(|(field_id, value)| Column { field_id, value })
                            .collect()
                    },
                    authored_schema,
                }
            },
        )
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        (ident(), ident(), proptest::option::of((row(), digest()))).prop_map(
            |(mutation_id, server_version, row)| Outcome::Applied {
                mutation_id,
                server_version,
                row
            }
        ),
        (
            ident(),
            text(),
            proptest::option::of((ident(), row(), digest()))
        )
            .prop_map(|(mutation_id, message, current)| Outcome::Conflict {
                mutation_id,
                message,
                current: current.map(|(server_version, row, row_checksum)| OutcomeRow {
                    server_version,
                    row,
                    row_checksum
                }),
            }),
        (ident(), 1usize..6, text()).prop_map(|(mutation_id, code, message)| {
            Outcome::Rejected {
                mutation_id,
                code: REJECTION_CODES[code].to_owned(),
                message,
                incompatible: None,
            }
        }),
        (
            ident(),
            authored(),
            authored(),
            proptest::collection::vec(ident(), 0..3)
        )
            .prop_map(|(mutation_id, a, c, ids)| Outcome::Rejected {
                mutation_id,
                code: "schema_incompatible".into(),
                message: "authored mutation cannot be represented by the current schema".into(),
                incompatible: Some(Incompatible {
                    outcome_schema: c.clone(),
                    authored_schema: a,
                    current_schema: c,
                    incompatible_field_ids: ids,
                }),
            }),
    ]
}

fn change() -> impl Strategy<Value = Change> {
    (
        ident(),
        ident(),
        text(),
        ident(),
        proptest::option::of((row(), digest())),
    )
        .prop_map(|(scope_id, table_id, pk, server_version, upsert)| Change {
            scope_id,
            table_id,
            pk: Json::String(pk),
            server_version,
            op: match upsert {
                Some((row, row_checksum)) => ChangeOp::Upsert { row, row_checksum },
                None => ChangeOp::Delete,
            },
        })
}

fn updates() -> impl Strategy<Value = ScopeUpdates> {
    (
        proptest::collection::vec(ident(), 0..3),
        proptest::collection::vec(ident(), 0..3),
    )
        .prop_map(|(added, removed)| ScopeUpdates { added, removed })
}

fn round_trip<M: Message + PartialEq + std::fmt::Debug>(m: &M) {
    let text = m.to_json_string();
    let back = M::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(&back, m, "{text}");
    assert_eq!(back.to_json_string(), text, "canonical output is stable");
}

proptest! {
    #[test]
    fn requests_round_trip(
        client_id in ident(), generation in counter(), schema in schema(), cursors in cursors(),
        limit in 1u64..=MAX_PAGE, scope in ident(), continuation in proptest::option::of(ident()),
        batch in ident(), mutations in proptest::collection::vec(mutation(), 1..4),
        reset in any::<bool>(), version in proptest::option::of("[0-9]\\.[0-9]\\.[0-9]"),
        maybe_generation in proptest::option::of(counter()),
    ) {
        round_trip(&ConnectRequest {
            client_id: client_id.clone(), client_generation: maybe_generation, schema: schema.clone(),
            schema_reset: reset, client_version: version, scope_cursors: cursors.clone(),
            seed_receipts: cursors.keys().map(|s| (format!("SEED.{s}"), format!("sc1.{s}"))).collect(),
        });
        round_trip(&PullRequest {
            client_id: client_id.clone(), client_generation: generation, schema: schema.clone(),
            scope_cursors: cursors, limit,
        });
        round_trip(&RebuildRequest {
            client_id: client_id.clone(), client_generation: generation, schema: schema.clone(),
            scope_id: scope, limit, continuation,
        });
        let mut mutations = mutations;
        for (i, m) in mutations.iter_mut().enumerate() {
            m.mutation_id = format!("{}-{i}", m.mutation_id);
        }
        round_trip(&PushRequest {
            client_id: client_id.clone(), client_generation: generation, schema, batch_id: batch,
            mutations,
        });
        round_trip(&EventsRequest { client_id, client_generation: generation });
    }

    #[test]
    fn responses_round_trip(
        version in counter(), updates in updates(), changes in proptest::collection::vec(change(), 0..4),
        cursors in proptest::collection::btree_map(ident(), ident(), 0..3),
        rebuild in proptest::collection::vec(ident(), 0..3),
        sums in proptest::option::of(proptest::collection::btree_map(ident(), digest(), 0..3)),
        outcomes in proptest::collection::vec(outcome(), 0..4), batch in ident(),
        records in proptest::collection::vec((ident(), text(), row(), ident(), digest()), 0..3),
        end in prop_oneof![ident().prop_map(|continuation| RebuildEnd::More { continuation }),
                           (ident(), digest()).prop_map(|(final_scope_cursor, checksum)| RebuildEnd::Final { final_scope_cursor, checksum })],
        scope in ident(), hash in hash(), definition in row(), affected in proptest::collection::vec(ident(), 1..3),
        connect_cursors in cursors(), action in 0usize..4,
    ) {
        let pull = PullResponse {
            scope_set_version: version, scope_updates: updates.clone(), changes,
            has_more: sums.is_none(), scope_cursor_updates: cursors, rebuild_scopes: rebuild,
            checksums: sums,
        };
        round_trip(&pull);
        prop_assert_eq!(&PullResponse::from_json_owned(pull.to_json()).unwrap(), &pull);
        round_trip(&PushResponse { batch_id: batch, outcomes });
        let page = RebuildResponse {
            scope_id: scope,
            records: records.into_iter().map(|(table_id, pk, row, server_version, row_checksum)| RebuildRecord {
                table_id, pk: Json::String(pk), row, server_version, row_checksum,
            }).collect(),
            end,
        };
        round_trip(&page);
        // The same page from records serialized one by one, ahead of time.
        let texts: Vec<String> = page.records.iter().map(RebuildRecord::to_output_string).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let rendered = RenderedRebuildPage { scope_id: &page.scope_id, records: &texts, end: &page.end };
        prop_assert_eq!(rendered.to_output_string(), page.to_json_string());
        let (name, definition, affected, reason) = match action {
            0 => (SchemaActionKind::None, None, None, None),
            1 => (SchemaActionKind::Replace, Some(definition), None, None),
            2 => (SchemaActionKind::RebuildLocal, Some(definition), Some(affected), None),
            _ => (SchemaActionKind::Unsupported, None, None, Some("unknown_lineage".to_owned())),
        };
        round_trip(&ConnectResponse {
            client_generation: version, scope_set_version: version, scope_updates: updates,
            schema: SchemaOutcome { action: name, version, hash, reason },
            schema_definition: definition, affected_scopes: affected,
            scope_cursor_updates: connect_cursors,
        });
    }

    #[test]
    fn error_bodies_round_trip(code in 0usize..9, message in text(), scope in ident()) {
        let code = ErrorCode::ALL[code];
        let mut body = ErrorBody::new(code, message);
        if code == ErrorCode::RebuildRestartRequired {
            body = body.with("scope_id", Json::String(scope));
        }
        round_trip(&body);
    }
}

#[test]
fn codes_have_the_spec_statuses() {
    let table: Vec<(&str, u16, bool)> = ErrorCode::ALL
        .iter()
        .map(|c| (c.as_str(), c.status(), c.retryable()))
        .collect();
    assert_eq!(
        table,
        [
            ("invalid_request", 400, false),
            ("invalid_schema_reference", 400, false),
            ("unauthorized", 401, false),
            ("client_generation_expired", 409, false),
            ("rebuild_restart_required", 409, false),
            ("schema_mismatch", 422, false),
            ("upgrade_required", 426, false),
            ("sync_integrity_failure", 500, false),
            ("temporary_unavailable", 503, true),
        ]
    );
}

fn refused<M: Message + std::fmt::Debug>(text: &str) {
    assert!(M::parse(text).is_err(), "accepted: {text}");
}

#[test]
fn strict_parsing_refuses_what_the_spec_does_not_define() {
    let pull =
        r#"{"protocol_version":3,"client_id":"c","client_generation":1,"schema":null,"limit":10}"#;
    PullRequest::parse(pull).unwrap();
    // Seed receipts: strings, and never for a scope that also has a cursor.
    let connect =
        |extra: &str| format!(r#"{{"protocol_version":3,"client_id":"c","schema":null{extra}}}"#);
    let parsed = ConnectRequest::parse(&connect(
        r#","seed_receipts":{"board:a":"sc1.x.y"},"scope_cursors":{"board:a":null,"b":"c1.x"}"#,
    ))
    .unwrap();
    assert_eq!(
        parsed.seed_receipts.get("board:a").map(String::as_str),
        Some("sc1.x.y")
    );
    for bad in [
        r#","seed_receipts":{"board:a":null}"#,
        r#","seed_receipts":{"board:a":1}"#,
        r#","seed_receipts":["sc1.x.y"]"#,
        r#","seed_receipts":{"board:a":"sc1.x.y"},"scope_cursors":{"board:a":"c1.x"}"#,
    ] {
        refused::<ConnectRequest>(&connect(bad));
    }
    for bad in [
        r#"{"protocol_version":3,"client_id":"c","client_generation":1,"limit":10,"extra":1}"#,
        r#"{"protocol_version":3,"client_id":"","client_generation":1,"limit":10}"#,
        r#"{"protocol_version":3,"client_id":"c","client_generation":0,"limit":10}"#,
        r#"{"protocol_version":3,"client_id":"c","client_generation":9007199254740992,"limit":10}"#,
        r#"{"protocol_version":3,"client_id":"c","client_generation":"1","limit":10}"#,
        r#"{"protocol_version":3,"client_id":"c","client_generation":1,"limit":1001}"#,
        r#"{"protocol_version":3,"client_id":"c","client_generation":1,"limit":1.0}"#,
        r#"{"protocol_version":3,"client_id":"c","client_generation":1}"#,
        r#"{"protocol_version":2,"client_id":"c","client_generation":1,"limit":10}"#,
        r#"{"client_id":"c","client_generation":1,"limit":10}"#,
        r#"[]"#,
    ] {
        refused::<PullRequest>(bad);
    }
    let d = "ab".repeat(32);
    let sum = format!(r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{d}"}}"#);
    let page = |has_more: &str, extra: &str| {
        format!(
            r#"{{"protocol_version":3,"scope_set_version":1,"scope_updates":{{"added":[],"removed":[]}},"changes":[],"has_more":{has_more},"scope_cursor_updates":{{}},"rebuild_scopes":[]{extra}}}"#
        )
    };
    PullResponse::parse(&page("true", "")).unwrap();
    PullResponse::parse(&page("false", &format!(r#","checksums":{{"s":{sum}}}"#))).unwrap();
    refused::<PullResponse>(&page("false", ""));
    refused::<PullResponse>(&page("true", r#","checksums":{}"#));
    refused::<PullResponse>(&page(
        "false",
        r#","checksums":{"s":{"algorithm":"sha256","digest":"00"}}"#,
    ));
    refused::<PullResponse>(&page("\"false\"", ""));
    refused::<PullResponse>(&page("true", r#","more":1"#));
    // An error body's retryable follows its code; members are the code's own.
    ErrorBody::parse(r#"{"error":{"code":"temporary_unavailable","message":"m","retryable":true,"reason":"capture_blocked"}}"#).unwrap();
    refused::<ErrorBody>(
        r#"{"error":{"code":"temporary_unavailable","message":"m","retryable":false}}"#,
    );
    refused::<ErrorBody>(
        r#"{"error":{"code":"invalid_request","message":"m","retryable":false,"scope_id":"s"}}"#,
    );
    refused::<ErrorBody>(r#"{"error":{"code":"not_a_code","message":"m","retryable":false}}"#);
    // A connect response's members follow its action.
    let connect = |schema: &str, extra: &str| {
        format!(
            r#"{{"protocol_version":3,"client_generation":1,"scope_set_version":1,"scope_updates":{{"added":[],"removed":[]}},"schema":{schema},"scope_cursor_updates":{{}}{extra}}}"#
        )
    };
    let none = format!(r#"{{"action":"none","version":1,"hash":"{d}"}}"#);
    let replace = format!(r#"{{"action":"replace","version":1,"hash":"{d}"}}"#);
    ConnectResponse::parse(&connect(&none, "")).unwrap();
    ConnectResponse::parse(&connect(&replace, r#","schema_definition":{}"#)).unwrap();
    refused::<ConnectResponse>(&connect(&replace, ""));
    refused::<ConnectResponse>(&connect(&none, r#","schema_definition":{}"#));
    refused::<ConnectResponse>(&connect(
        &replace,
        r#","schema_definition":{},"affected_scopes":[]"#,
    ));
}

#[test]
fn the_owned_pull_parser_reads_exactly_what_the_borrowed_one_does() {
    let d = "ab".repeat(32);
    let sum = format!(r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{d}"}}"#);
    let page = |changes: &str, has_more: &str, extra: &str| {
        format!(
            r#"{{"protocol_version":3,"scope_set_version":1,"scope_updates":{{"added":[],"removed":[]}},"changes":{changes},"has_more":{has_more},"scope_cursor_updates":{{}},"rebuild_scopes":[]{extra}}}"#
        )
    };
    let upsert = |row: &str, extra: &str| {
        format!(
            r#"{{"scope_id":"s","table_id":"t","pk":1,"op":"upsert","row":{row},"server_version":"v","row_checksum":{sum}{extra}}}"#
        )
    };
    let delete = |extra: &str| {
        format!(
            r#"{{"scope_id":"s","table_id":"t","pk":1,"op":"delete","server_version":"v"{extra}}}"#
        )
    };
    let terminal = format!(r#","checksums":{{"s":{sum}}}"#);
    let cases = [
        page("[]", "true", ""),
        page(
            &format!("[{}]", upsert(r#"{"f1":1,"f2":"x"}"#, "")),
            "true",
            "",
        ),
        page(
            &format!("[{},{}]", upsert(r#"{"f1":1}"#, ""), delete("")),
            "false",
            &terminal,
        ),
        page(&format!("[{}]", upsert("[]", "")), "true", ""),
        page(&format!("[{}]", upsert("null", "")), "true", ""),
        page(
            &format!("[{}]", upsert(r#"{"f1":1}"#, r#","more":1"#)),
            "true",
            "",
        ),
        page(&format!("[{}]", delete(r#","row":{"f1":1}"#)), "true", ""),
        page(&format!("[{}]", delete(r#","row":[]"#)), "true", ""),
        page(r#"{"a":1}"#, "true", ""),
        page("[1]", "true", ""),
        page("[]", "false", ""),
        page(
            &format!("[{}]", upsert(r#"{"f1":1}"#, "")),
            "true",
            &terminal,
        ),
    ];
    for text in cases {
        let body = Json::parse(&text).unwrap();
        assert_eq!(
            PullResponse::from_json_owned(body.clone()),
            PullResponse::from_json(&body),
            "{text}"
        );
    }
}

#[test]
fn a_checksum_object_is_its_canonical_text() {
    for bytes in [[0u8; 32], [0xab; 32], std::array::from_fn(|i| i as u8)] {
        let c = Checksum(bytes);
        assert_eq!(
            crate::jcs::to_output_string(&checksum_json(&c)),
            c.to_json_string()
        );
        assert_eq!(checksum_json(&c), Json::parse(&c.to_json_string()).unwrap());
    }
}
