//! Change classification, lineage validation and connect dispatch, table-driven from the
//! examples and the dispatch table of spec 000 / spec 003.
#![cfg(not(target_arch = "wasm32"))]
// The case tables read better with explicit clones of shared fixtures.
#![allow(clippy::cloned_ref_to_slice_refs)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use synchro_protocol::classify::{classify, ChangeClass, TransitionFacts};
use synchro_protocol::dispatch::{
    dispatch, ConnectOutcome, ConnectRequest, CursorUpdate, SchemaAction, ServerView,
    UnsupportedReason,
};
use synchro_protocol::json::Json;
use synchro_protocol::lineage::Lineage;
use synchro_protocol::manifest::{Manifest, SchemaRef};

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn child(tables: &[String]) -> Manifest {
    manifest(2, Some(&base()), "class_4", 2, tables)
}

fn with_null_history(fields: &[(&str, &str)]) -> TransitionFacts {
    TransitionFacts {
        added_fields_without_history: fields
            .iter()
            .map(|(t, f)| (t.to_string(), f.to_string()))
            .collect(),
        ..Default::default()
    }
}

/// Long on purpose: one short case per example of spec 000's change classes, so a failure
/// names its example.
#[test]
fn classification_covers_every_listed_example() {
    let none = TransitionFacts::default();
    let extra = field("fld_doc_extra", "extra", "string", true, true);
    let new_table = table(
        "tbl_new",
        "new",
        "single_scope",
        &[field("fld_new_id", "id", "int", false, false)],
        &[],
    );
    let idx = index("idx_doc_title", "idx_doc_title", &["fld_doc_title"], false);
    let docs = |tid: &str| TransitionFacts {
        materialization_changed: set(&[tid]),
        ..Default::default()
    };

    use ChangeClass::*;
    type ClassCase<'a> = (
        &'a str,
        Vec<String>,
        TransitionFacts,
        ChangeClass,
        &'a [&'a str],
    );
    let cases: Vec<ClassCase> = vec![
        (
            "unchanged",
            vec![documents(&[], &[]), notes()],
            none.clone(),
            Class1,
            &[],
        ),
        (
            "add nullable field, history recorded all null",
            vec![documents(&[extra.clone()], &[]), notes()],
            with_null_history(&[("tbl_documents", "fld_doc_extra")]),
            Class2,
            &["tbl_documents"],
        ),
        (
            "add nullable field, no recorded history",
            vec![documents(&[extra.clone()], &[]), notes()],
            none.clone(),
            Class3,
            &["tbl_documents"],
        ),
        (
            "add required field",
            vec![
                documents(&[field("fld_doc_req", "req", "int", false, true)], &[]),
                notes(),
            ],
            with_null_history(&[("tbl_documents", "fld_doc_req")]),
            Class3,
            &["tbl_documents"],
        ),
        (
            "add empty table",
            vec![documents(&[], &[]), notes(), new_table.clone()],
            TransitionFacts {
                empty_added_tables: set(&["tbl_new"]),
                ..Default::default()
            },
            Class2,
            &["tbl_new"],
        ),
        (
            "add table with rows",
            vec![documents(&[], &[]), notes(), new_table.clone()],
            none.clone(),
            Class3,
            &["tbl_new"],
        ),
        (
            "add local index",
            vec![documents(&[], &[idx.clone()]), notes()],
            none.clone(),
            Class2,
            &["tbl_documents"],
        ),
        (
            "nullable false -> true",
            vec![
                documents_with(
                    "fld_doc_amount",
                    decimal("fld_doc_amount", "amount", 10, 2, true),
                ),
                notes(),
            ],
            none.clone(),
            Class2,
            &["tbl_documents"],
        ),
        (
            "writable false -> true",
            vec![
                documents_with(
                    "fld_doc_count",
                    field("fld_doc_count", "count", "int", false, true),
                ),
                notes(),
            ],
            none.clone(),
            Class2,
            &["tbl_documents"],
        ),
        (
            "widen decimal precision",
            vec![
                documents_with(
                    "fld_doc_amount",
                    decimal("fld_doc_amount", "amount", 12, 2, false),
                ),
                notes(),
            ],
            none.clone(),
            Class2,
            &["tbl_documents"],
        ),
        (
            "widen decimal scale and precision",
            vec![
                documents_with(
                    "fld_doc_amount",
                    decimal("fld_doc_amount", "amount", 11, 3, false),
                ),
                notes(),
            ],
            none.clone(),
            Class2,
            &["tbl_documents"],
        ),
        (
            "composition single -> multi",
            vec![documents_multi(), notes()],
            none.clone(),
            Class3,
            &["tbl_documents"],
        ),
        (
            "composition multi -> single",
            vec![documents(&[], &[]), notes_single()],
            none.clone(),
            Class3,
            &["tbl_notes"],
        ),
        (
            "membership materialization change",
            vec![documents(&[], &[]), notes()],
            docs("tbl_notes"),
            Class3,
            &["tbl_notes"],
        ),
        (
            "controlled reconfiguration",
            vec![documents(&[], &[]), notes()],
            TransitionFacts {
                reconfigured: set(&["tbl_documents"]),
                ..Default::default()
            },
            Class3,
            &["tbl_documents"],
        ),
        (
            "remove field",
            vec![documents_without("fld_doc_count"), notes()],
            none.clone(),
            Class4,
            &["tbl_documents"],
        ),
        (
            "rename field",
            vec![
                documents_with(
                    "fld_doc_count",
                    field("fld_doc_count", "n", "int", false, false),
                ),
                notes(),
            ],
            none.clone(),
            Class4,
            &["tbl_documents"],
        ),
        (
            "rename as remove plus add",
            vec![
                table(
                    "tbl_documents",
                    "documents",
                    "single_scope",
                    &[
                        field("fld_doc_id", "id", "string", false, false),
                        field("fld_doc_title", "title", "string", true, true),
                        decimal("fld_doc_amount", "amount", 10, 2, false),
                        field("fld_doc_count2", "count", "int", true, false),
                    ],
                    &[],
                ),
                notes(),
            ],
            with_null_history(&[("tbl_documents", "fld_doc_count2")]),
            Class4,
            &["tbl_documents"],
        ),
        (
            "change field type",
            vec![
                documents_with(
                    "fld_doc_count",
                    field("fld_doc_count", "count", "int64", false, false),
                ),
                notes(),
            ],
            none.clone(),
            Class4,
            &["tbl_documents"],
        ),
        (
            "narrow decimal precision",
            vec![
                documents_with(
                    "fld_doc_amount",
                    decimal("fld_doc_amount", "amount", 9, 2, false),
                ),
                notes(),
            ],
            none.clone(),
            Class4,
            &["tbl_documents"],
        ),
        (
            "narrow decimal scale",
            vec![
                documents_with(
                    "fld_doc_amount",
                    decimal("fld_doc_amount", "amount", 10, 1, false),
                ),
                notes(),
            ],
            none.clone(),
            Class4,
            &["tbl_documents"],
        ),
        (
            "scale up, integer digits down",
            vec![
                documents_with(
                    "fld_doc_amount",
                    decimal("fld_doc_amount", "amount", 10, 3, false),
                ),
                notes(),
            ],
            none.clone(),
            Class4,
            &["tbl_documents"],
        ),
        (
            "tighten nullable",
            vec![
                documents_with(
                    "fld_doc_title",
                    field("fld_doc_title", "title", "string", false, true),
                ),
                notes(),
            ],
            none.clone(),
            Class4,
            &["tbl_documents"],
        ),
        (
            "remove writability",
            vec![
                documents_with(
                    "fld_doc_title",
                    field("fld_doc_title", "title", "string", true, false),
                ),
                notes(),
            ],
            none.clone(),
            Class4,
            &["tbl_documents"],
        ),
        (
            "remove table",
            vec![documents(&[], &[])],
            none.clone(),
            Class4,
            &["tbl_notes"],
        ),
        (
            "rename table",
            vec![
                documents(&[], &[]),
                table(
                    "tbl_notes",
                    "memos",
                    "multi_scope",
                    &[
                        field("fld_note_id", "id", "int64", false, false),
                        field("fld_note_body", "body", "string", true, true),
                    ],
                    &[],
                ),
            ],
            none.clone(),
            Class4,
            &["tbl_notes"],
        ),
        (
            "change primary-key type",
            vec![
                documents(&[], &[]),
                table(
                    "tbl_notes",
                    "notes",
                    "multi_scope",
                    &[
                        field("fld_note_id", "id", "string", false, false),
                        field("fld_note_body", "body", "string", true, true),
                    ],
                    &[],
                ),
            ],
            none.clone(),
            Class4,
            &["tbl_notes"],
        ),
        (
            "change primary-key field",
            vec![
                documents(&[], &[]),
                table(
                    "tbl_notes",
                    "notes",
                    "multi_scope",
                    &[
                        field("fld_note_key", "key", "int64", false, false),
                        field("fld_note_id", "id", "int64", false, false),
                        field("fld_note_body", "body", "string", true, true),
                    ],
                    &[],
                ),
            ],
            with_null_history(&[("tbl_notes", "fld_note_key")]),
            Class4,
            &["tbl_notes"],
        ),
        (
            "Class 3 dominates Class 2",
            vec![documents(&[extra.clone()], &[idx.clone()]), notes_single()],
            none.clone(),
            Class3,
            &["tbl_documents", "tbl_notes"],
        ),
    ];
    for (name, tables, facts, class, affected) in cases {
        let got =
            classify(&base(), &child(&tables), &facts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.class, class, "{name}");
        assert_eq!(got.affected_tables, set(affected), "{name}");
    }
}

#[test]
fn index_only_changes() {
    let with = |idx: &[String]| base_with_docs_indexes(idx);
    let a = index("idx_a", "idx_a", &["fld_doc_title", "fld_doc_count"], false);
    let parent = with(&[a.clone()]);
    let cases = [
        ("unchanged", vec![a.clone()], ChangeClass::Class1),
        (
            "added",
            vec![a.clone(), index("idx_b", "idx_b", &["fld_doc_count"], true)],
            ChangeClass::Class2,
        ),
        ("removed", vec![], ChangeClass::Class4),
        (
            "renamed",
            vec![index(
                "idx_a",
                "idx_renamed",
                &["fld_doc_title", "fld_doc_count"],
                false,
            )],
            ChangeClass::Class4,
        ),
        (
            "made unique",
            vec![index(
                "idx_a",
                "idx_a",
                &["fld_doc_title", "fld_doc_count"],
                true,
            )],
            ChangeClass::Class4,
        ),
        (
            "field order changed",
            vec![index(
                "idx_a",
                "idx_a",
                &["fld_doc_count", "fld_doc_title"],
                false,
            )],
            ChangeClass::Class4,
        ),
    ];
    for (name, idx, class) in cases {
        let c = manifest(
            2,
            Some(&parent),
            "class_4",
            2,
            &[documents(&[], &idx), notes()],
        );
        assert_eq!(
            classify(&parent, &c, &TransitionFacts::default())
                .unwrap()
                .class,
            class,
            "{name}"
        );
    }
}

fn base_with_docs_indexes(idx: &[String]) -> Manifest {
    manifest(1, None, "initial", 1, &[documents(&[], idx), notes()])
}

#[test]
fn mixed_class4_reports_only_incompatible_tables() {
    let c = child(&[documents(
        &[field("fld_doc_extra", "extra", "string", true, true)],
        &[],
    )]);
    let got = classify(&base(), &c, &TransitionFacts::default()).unwrap();
    assert_eq!(got.class, ChangeClass::Class4);
    assert_eq!(got.affected_tables, set(&["tbl_notes"]));
}

#[test]
fn facts_must_name_child_tables_and_fields() {
    let c = child(&[documents(&[], &[]), notes()]);
    for facts in [
        TransitionFacts {
            empty_added_tables: set(&["tbl_nope"]),
            ..Default::default()
        },
        TransitionFacts {
            materialization_changed: set(&["tbl_nope"]),
            ..Default::default()
        },
        with_null_history(&[("tbl_documents", "fld_nope")]),
    ] {
        assert_eq!(
            classify(&base(), &c, &facts).unwrap_err().code(),
            "invalid_request"
        );
    }
}

/// v1 initial → v2 class_2 (index) → v3 class_3 (notes single_scope) → v4 class_2 (field).
fn lineage() -> (Lineage, Vec<Manifest>) {
    let v1 = base();
    let idx = index("idx_doc_title", "idx_doc_title", &["fld_doc_title"], false);
    let v2 = manifest(
        2,
        Some(&v1),
        "class_2",
        1,
        &[documents(&[], &[idx.clone()]), notes()],
    );
    let single = notes_single();
    let v3 = manifest(
        3,
        Some(&v2),
        "class_3",
        3,
        &[documents(&[], &[idx.clone()]), single.clone()],
    );
    let extra = field("fld_doc_extra", "extra", "string", true, true);
    let v4 = manifest(
        4,
        Some(&v3),
        "class_2",
        3,
        &[documents(&[extra], &[idx]), single],
    );
    let mut l = Lineage::new();
    assert_eq!(
        l.append(v1.clone(), &TransitionFacts::default()).unwrap(),
        None
    );
    for (m, facts) in [
        (v2.clone(), TransitionFacts::default()),
        (v3.clone(), TransitionFacts::default()),
        (
            v4.clone(),
            with_null_history(&[("tbl_documents", "fld_doc_extra")]),
        ),
    ] {
        l.append(m, &facts).unwrap();
    }
    (l, vec![v1, v2, v3, v4])
}

#[test]
fn lineage_validates_children_against_their_parent() {
    let (mut l, ms) = lineage();
    let v4 = &ms[3];
    assert_eq!(l.current().unwrap(), v4);
    // Paths follow parent links.
    assert_eq!(l.path_from(&ms[0].schema_ref()).unwrap().len(), 3);
    assert!(l.path_from(&v4.schema_ref()).unwrap().is_empty());
    assert!(l
        .path_from(&SchemaRef {
            version: 2,
            hash: [0; 32]
        })
        .is_none());
    // A rebuilt history gives the same chain.
    let again = Lineage::from_history(ms.iter().rev().cloned()).unwrap();
    assert_eq!(again.current(), l.current());

    let tables = [
        documents(
            &[
                field("fld_doc_extra", "extra", "string", true, true),
                field("fld_doc_more", "more", "string", true, true),
            ],
            &[index(
                "idx_doc_title",
                "idx_doc_title",
                &["fld_doc_title"],
                false,
            )],
        ),
        notes_single(),
    ];
    let facts = with_null_history(&[("tbl_documents", "fld_doc_more")]);
    let bad = [
        (
            "wrong floor",
            manifest(5, Some(v4), "class_2", 4, &tables),
            "invalid_lineage",
        ),
        (
            "declared class differs from the change",
            manifest(5, Some(v4), "class_3", 5, &tables),
            "invalid_lineage",
        ),
        (
            "wrong parent",
            manifest(5, Some(&ms[2]), "class_2", 3, &tables),
            "invalid_lineage",
        ),
        (
            "reused version",
            manifest(4, Some(&ms[2]), "class_2", 3, &tables),
            "invalid_lineage",
        ),
        (
            "second initial",
            manifest(5, None, "initial", 5, &tables),
            "invalid_lineage",
        ),
    ];
    for (name, m, code) in bad {
        assert_eq!(l.append(m, &facts).unwrap_err().code(), code, "{name}");
    }
    // An unchanged manifest is Class 1: it is not published.
    let same: Vec<String> = vec![
        documents(
            &[field("fld_doc_extra", "extra", "string", true, true)],
            &[index(
                "idx_doc_title",
                "idx_doc_title",
                &["fld_doc_title"],
                false,
            )],
        ),
        notes_single(),
    ];
    let err = l
        .append(
            manifest(5, Some(v4), "class_2", 3, &same),
            &TransitionFacts::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("Class 1"), "{err}");
    // Nothing above changed the lineage; the right manifest still appends.
    assert_eq!(l.current().unwrap(), v4);
    let ok = l
        .append(manifest(5, Some(v4), "class_2", 3, &tables), &facts)
        .unwrap()
        .unwrap();
    assert_eq!(ok.class, ChangeClass::Class2);
    assert_eq!(l.current().unwrap().compatibility_floor, 3);
    // The first manifest of a history must be initial.
    assert!(Lineage::new()
        .append(ms[1].clone(), &TransitionFacts::default())
        .is_err());
}

struct Setup {
    lineage: Lineage,
    ms: Vec<Manifest>,
    transition_scopes: BTreeMap<SchemaRef, BTreeSet<String>>,
}

fn setup() -> Setup {
    let (lineage, ms) = lineage();
    let transition_scopes = [(ms[2].schema_ref(), set(&["s:z", "s:b"]))]
        .into_iter()
        .collect();
    Setup {
        lineage,
        ms,
        transition_scopes,
    }
}

fn reference(m: &Manifest) -> Json {
    Json::parse(&format!(
        r#"{{"version":{},"hash":"{}"}}"#,
        m.schema_version,
        m.schema_hash_hex()
    ))
    .unwrap()
}

struct Case<'a> {
    name: &'a str,
    protocol: Option<u64>,
    schema: Json,
    generation: Option<u64>,
    reset: bool,
    known: bool,
    runtime_ok: bool,
    assigned: &'a [&'a str],
    presented: &'a [&'a str],
    stale: &'a [&'a str],
}

impl<'a> Case<'a> {
    fn new(name: &'a str, schema: Json) -> Self {
        Case {
            name,
            protocol: Some(3),
            schema,
            generation: Some(7),
            reset: false,
            known: true,
            runtime_ok: true,
            assigned: &[],
            presented: &[],
            stale: &[],
        }
    }
}

fn run<'s>(s: &'s Setup, c: &Case, scopes: &'s mut [BTreeSet<String>; 3]) -> ConnectOutcome<'s> {
    scopes[0] = set(c.assigned);
    scopes[1] = set(c.presented);
    scopes[2] = set(c.stale);
    let [assigned, presented, stale] = scopes;
    let view = ServerView {
        identity_known: c.known,
        client_runtime_supported: c.runtime_ok,
        lineage: &s.lineage,
        transition_scopes: &s.transition_scopes,
        assigned_scopes: assigned,
        presented_cursor_scopes: presented,
        stale_cursor_scopes: stale,
    };
    let req = ConnectRequest {
        protocol_version: c.protocol,
        schema: c.schema.clone(),
        client_generation: c.generation,
        schema_reset: c.reset,
    };
    dispatch(&req, &view).unwrap_or_else(|e| panic!("{}: {e}", c.name))
}

/// A compact description of an outcome: status, action, scopes, cursor updates.
fn describe(o: &ConnectOutcome) -> String {
    match o {
        ConnectOutcome::UpgradeRequired { client_runtime, .. } => {
            format!("426 upgrade_required runtime={client_runtime}")
        }
        ConnectOutcome::InvalidSchemaReference { .. } => "400 invalid_schema_reference".into(),
        ConnectOutcome::Schema {
            action,
            cursor_updates,
        } => {
            let detail = match action {
                SchemaAction::None { current } => format!("v{}", current.version),
                SchemaAction::Replace { manifest } => format!("v{}", manifest.schema_version),
                SchemaAction::RebuildLocal {
                    manifest,
                    affected_scopes,
                } => format!(
                    "v{} {:?}",
                    manifest.schema_version,
                    affected_scopes.as_slice()
                ),
                SchemaAction::Unsupported { reason, .. } => reason.as_str().into(),
            };
            let cursors: Vec<String> = cursor_updates
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{k}={}",
                        if *v == CursorUpdate::Reissue {
                            "reissue"
                        } else {
                            "null"
                        }
                    )
                })
                .collect();
            format!("200 {} {detail} [{}]", action.name(), cursors.join(" "))
        }
    }
}

/// Long on purpose: one short case per row of spec 003's dispatch table, so a failure names
/// its row.
#[test]
fn every_dispatch_row() {
    let s = setup();
    let [v1, v2, v3, v4] = [&s.ms[0], &s.ms[1], &s.ms[2], &s.ms[3]];
    let fresh = Json::parse(r#"{"version":0,"hash":""}"#).unwrap();
    let unknown = Json::parse(&format!(r#"{{"version":9,"hash":"{}"}}"#, "ab".repeat(32))).unwrap();
    let wrong_hash =
        Json::parse(&format!(r#"{{"version":2,"hash":"{}"}}"#, "ab".repeat(32))).unwrap();
    let cases: Vec<(Case, &str)> = vec![
        (
            Case {
                protocol: Some(2),
                ..Case::new("protocol 2", reference(v4))
            },
            "426 upgrade_required runtime=false",
        ),
        (
            Case {
                protocol: None,
                ..Case::new("protocol absent", reference(v4))
            },
            "426 upgrade_required runtime=false",
        ),
        (
            Case {
                runtime_ok: false,
                ..Case::new("runtime below minimum", reference(v4))
            },
            "426 upgrade_required runtime=true",
        ),
        (
            Case {
                known: false,
                ..Case::new("fresh sentinel with generation", fresh.clone())
            },
            "400 invalid_schema_reference",
        ),
        (
            Case {
                generation: None,
                known: false,
                reset: true,
                ..Case::new("fresh sentinel with reset", fresh.clone())
            },
            "400 invalid_schema_reference",
        ),
        (
            Case {
                generation: None,
                ..Case::new("fresh sentinel, known identity", fresh.clone())
            },
            "400 invalid_schema_reference",
        ),
        (
            Case {
                generation: None,
                known: false,
                assigned: &["s:a"],
                ..Case::new("fresh identity and sentinel", fresh.clone())
            },
            "200 replace v4 []",
        ),
        (
            Case {
                generation: None,
                ..Case::new("known identity without generation", reference(v2))
            },
            "400 invalid_schema_reference",
        ),
        (
            Case {
                assigned: &["s:a"],
                presented: &["s:a"],
                ..Case::new("exact current", reference(v4))
            },
            "200 none v4 []",
        ),
        (
            Case {
                assigned: &["s:a", "s:b"],
                presented: &["s:a", "s:b"],
                ..Case::new("Class 2 only", reference(v3))
            },
            "200 replace v4 [s:a=reissue s:b=reissue]",
        ),
        (
            Case {
                assigned: &["s:a", "s:b"],
                presented: &["s:a", "s:b"],
                ..Case::new("Class 3, affected assigned", reference(v2))
            },
            "200 rebuild_local v4 [\"s:b\"] [s:a=reissue s:b=null]",
        ),
        (
            Case {
                assigned: &["s:a", "s:b", "s:z"],
                presented: &["s:a"],
                stale: &["s:a"],
                ..Case::new("Class 3 from v1, stale binding", reference(v1))
            },
            "200 rebuild_local v4 [\"s:b\", \"s:z\"] [s:a=null]",
        ),
        (
            Case {
                assigned: &["s:a"],
                presented: &["s:a", "s:gone"],
                ..Case::new("Class 3, no affected assigned", reference(v2))
            },
            "200 replace v4 [s:a=reissue]",
        ),
        (
            Case {
                assigned: &["s:a"],
                ..Case::new("unknown lineage", unknown.clone())
            },
            "200 unsupported unknown_schema_lineage []",
        ),
        (
            Case {
                assigned: &["s:a"],
                ..Case::new("known version, other hash", wrong_hash)
            },
            "200 unsupported unknown_schema_lineage []",
        ),
        (
            Case {
                reset: true,
                assigned: &["s:z", "s:a"],
                presented: &["s:a"],
                ..Case::new("reset with assigned scopes", unknown.clone())
            },
            "200 rebuild_local v4 [\"s:a\", \"s:z\"] [s:a=null]",
        ),
        (
            Case {
                reset: true,
                ..Case::new("reset with no assigned scope", reference(v1))
            },
            "200 replace v4 []",
        ),
        (
            Case {
                reset: true,
                assigned: &["s:a"],
                ..Case::new("reset while current", reference(v4))
            },
            "200 rebuild_local v4 [\"s:a\"] []",
        ),
        (
            Case {
                reset: true,
                generation: None,
                known: false,
                ..Case::new("reset without generation", reference(v1))
            },
            "400 invalid_schema_reference",
        ),
        (
            Case {
                generation: None,
                known: false,
                assigned: &["s:b"],
                ..Case::new("unknown identity, seeded schema", reference(v2))
            },
            "200 rebuild_local v4 [\"s:b\"] []",
        ),
    ];
    for (case, want) in cases {
        let mut scopes = Default::default();
        assert_eq!(
            describe(&run(&s, &case, &mut scopes)),
            want,
            "{}",
            case.name
        );
    }
}

#[test]
fn class4_history_is_unsupported_and_reset_recovers() {
    let mut s = setup();
    let v4 = s.ms[3].clone();
    let v5 = manifest(5, Some(&v4), "class_4", 5, &[documents(&[], &[])]);
    s.lineage.append(v5, &TransitionFacts::default()).unwrap();
    let mut scopes = Default::default();
    let o = run(
        &s,
        &Case {
            assigned: &["s:a"],
            ..Case::new("class 4", reference(&v4))
        },
        &mut scopes,
    );
    assert_eq!(
        describe(&o),
        "200 unsupported incompatible_schema_transition []"
    );
    let mut scopes = Default::default();
    let o = run(
        &s,
        &Case {
            reset: true,
            assigned: &["s:a"],
            ..Case::new("reset", reference(&v4))
        },
        &mut scopes,
    );
    assert_eq!(describe(&o), "200 rebuild_local v5 [\"s:a\"] []");
}

#[test]
fn class3_without_recorded_scopes_affects_every_assigned_scope() {
    let mut s = setup();
    s.transition_scopes.clear();
    let v2 = s.ms[1].clone();
    let mut scopes = Default::default();
    let o = run(
        &s,
        &Case {
            assigned: &["b", "B", "a"],
            presented: &["a"],
            ..Case::new("no record", reference(&v2))
        },
        &mut scopes,
    );
    // Scope lists are in unsigned byte order: uppercase before lowercase.
    assert_eq!(
        describe(&o),
        "200 rebuild_local v4 [\"B\", \"a\", \"b\"] [a=null]"
    );
}

#[test]
fn every_malformed_reference_form() {
    let s = setup();
    let h = "ab".repeat(32);
    for (name, text) in [
        (
            "zero version with a hash",
            format!(r#"{{"version":0,"hash":"{h}"}}"#),
        ),
        (
            "empty hash with a version",
            r#"{"version":3,"hash":""}"#.to_owned(),
        ),
        (
            "uppercase hex",
            format!(r#"{{"version":3,"hash":"{}"}}"#, h.to_uppercase()),
        ),
        (
            "63 characters",
            format!(r#"{{"version":3,"hash":"{}"}}"#, &h[..63]),
        ),
        ("65 characters", format!(r#"{{"version":3,"hash":"{h}a"}}"#)),
        (
            "version above 2^53-1",
            format!(r#"{{"version":9007199254740992,"hash":"{h}"}}"#),
        ),
        (
            "version as a string",
            format!(r#"{{"version":"3","hash":"{h}"}}"#),
        ),
        (
            "fractional version",
            format!(r#"{{"version":3.0,"hash":"{h}"}}"#),
        ),
        (
            "negative version",
            format!(r#"{{"version":-3,"hash":"{h}"}}"#),
        ),
        (
            "exponent version",
            format!(r#"{{"version":3e0,"hash":"{h}"}}"#),
        ),
        (
            "extra member",
            format!(r#"{{"version":3,"hash":"{h}","x":1}}"#),
        ),
        ("missing hash", r#"{"version":3}"#.to_owned()),
        ("null", "null".to_owned()),
        (
            "non-hex",
            format!(r#"{{"version":3,"hash":"{}"}}"#, "zz".repeat(32)),
        ),
    ] {
        let schema = Json::parse(&text).unwrap();
        for known in [true, false] {
            let mut scopes = Default::default();
            let o = run(
                &s,
                &Case {
                    known,
                    ..Case::new(name, schema.clone())
                },
                &mut scopes,
            );
            assert_eq!(describe(&o), "400 invalid_schema_reference", "{name}");
            let body = o.to_json(&schema);
            assert_eq!(
                body.get("error").unwrap().get("received_schema"),
                Some(&schema)
            );
        }
    }
    // The largest allowed version is accepted as a reference (and is simply unknown here).
    let max = Json::parse(&format!(r#"{{"version":9007199254740991,"hash":"{h}"}}"#)).unwrap();
    let mut scopes = Default::default();
    assert_eq!(
        describe(&run(&s, &Case::new("max", max), &mut scopes)),
        "200 unsupported unknown_schema_lineage []"
    );
}

#[test]
fn response_members_are_exact_for_each_action() {
    let s = setup();
    let keys = |j: &Json| -> Vec<String> {
        match j {
            Json::Object(m) => m.iter().map(|(k, _)| k.clone()).collect(),
            _ => panic!(),
        }
    };
    let cases: Vec<(Case, &[&str], &[&str])> = vec![
        (
            Case::new("none", reference(&s.ms[3])),
            &["schema", "scope_cursor_updates"],
            &["version", "hash", "action"],
        ),
        (
            Case::new("replace", reference(&s.ms[2])),
            &["schema", "schema_definition", "scope_cursor_updates"],
            &["version", "hash", "action"],
        ),
        (
            Case {
                assigned: &["s:b"],
                ..Case::new("rebuild", reference(&s.ms[1]))
            },
            &[
                "schema",
                "schema_definition",
                "affected_scopes",
                "scope_cursor_updates",
            ],
            &["version", "hash", "action"],
        ),
        (
            Case::new(
                "unsupported",
                Json::parse(&format!(r#"{{"version":9,"hash":"{}"}}"#, "ab".repeat(32))).unwrap(),
            ),
            &["schema", "scope_cursor_updates"],
            &["version", "hash", "action", "reason"],
        ),
    ];
    for (case, top, schema) in cases {
        let mut scopes = Default::default();
        let o = run(&s, &case, &mut scopes);
        let body = o.to_json(&case.schema);
        assert_eq!(
            keys(&body),
            top.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "{}",
            case.name
        );
        assert_eq!(
            keys(body.get("schema").unwrap()),
            schema.iter().map(|s| s.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(
            body.get("schema")
                .unwrap()
                .get("hash")
                .and_then(Json::as_str),
            Some(s.ms[3].schema_hash_hex().as_str())
        );
        if let Some(def) = body.get("schema_definition") {
            // The inline definition is the complete current manifest and re-validates.
            let text = synchro_protocol::jcs::to_canonical_string(def).unwrap();
            assert_eq!(Manifest::parse(&text).unwrap(), s.ms[3]);
        }
    }
    let o = ConnectOutcome::UpgradeRequired {
        received_protocol_version: Some(2),
        client_runtime: false,
    };
    let body = o.to_json(&Json::Null);
    assert_eq!(o.status(), 426);
    let e = body.get("error").unwrap();
    assert_eq!(
        e.get("code").and_then(Json::as_str),
        Some("upgrade_required")
    );
    assert_eq!(
        e.get("required_protocol_version"),
        Some(&Json::Number("3".into()))
    );
    assert_eq!(
        e.get("received_protocol_version"),
        Some(&Json::Number("2".into()))
    );
    let _ = UnsupportedReason::IncompatibleSchemaTransition;
}
