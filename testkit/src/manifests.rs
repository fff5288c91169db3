//! Builders for manifests in tests: a base table set and small edits of it.
#![allow(dead_code)]

use synchro_protocol::manifest::Manifest;

/// A field as JSON.
pub fn field(id: &str, name: &str, ty: &str, nullable: bool, writable: bool) -> String {
    format!(
        r#"{{"field_id":"{id}","name":"{name}","type":"{ty}","nullable":{nullable},"writable":{writable}}}"#
    )
}

/// A decimal field as JSON.
pub fn decimal(id: &str, name: &str, precision: u32, scale: u32, nullable: bool) -> String {
    format!(
        r#"{{"field_id":"{id}","name":"{name}","type":"decimal","nullable":{nullable},"writable":true,"precision":{precision},"scale":{scale}}}"#
    )
}

/// An index as JSON.
pub fn index(id: &str, name: &str, fields: &[&str], unique: bool) -> String {
    let f: Vec<String> = fields.iter().map(|f| format!("\"{f}\"")).collect();
    format!(
        r#"{{"index_id":"{id}","name":"{name}","field_ids":[{}],"unique":{unique}}}"#,
        f.join(",")
    )
}

/// A table as JSON; the primary key is the first field.
pub fn table(
    id: &str,
    name: &str,
    composition: &str,
    fields: &[String],
    indexes: &[String],
) -> String {
    let pk = fields[0].split('"').nth(3).unwrap();
    format!(
        r#"{{"table_id":"{id}","relation_id":"rel_{id}","name":"{name}","composition":"{composition}","primary_key_field_id":"{pk}","lifecycle":{{"created_at_field_id":null,"updated_at_field_id":null,"deleted_at_field_id":null}},"fields":[{}],"indexes":[{}]}}"#,
        fields.join(","),
        indexes.join(",")
    )
}

/// A manifest from its tables; `parent` and `class` place it in a lineage.
pub fn manifest(
    version: u64,
    parent: Option<&Manifest>,
    class: &str,
    floor: u64,
    tables: &[String],
) -> Manifest {
    let parent = match parent {
        None => "null".to_owned(),
        Some(p) => format!(
            r#"{{"version":{},"hash":"{}"}}"#,
            p.schema_version,
            p.schema_hash_hex()
        ),
    };
    Manifest::parse(&format!(
        r#"{{"schema_version":{version},"parent_schema":{parent},"transition_class":"{class}","compatibility_floor":{floor},"tables":[{}]}}"#,
        tables.join(",")
    ))
    .unwrap_or_else(|e| panic!("test manifest invalid: {e}"))
}

/// The fields of the base documents table; the key comes first.
pub fn doc_fields() -> Vec<String> {
    vec![
        field("fld_doc_id", "id", "string", false, false),
        field("fld_doc_title", "title", "string", true, true),
        decimal("fld_doc_amount", "amount", 10, 2, false),
        field("fld_doc_count", "count", "int", false, false),
    ]
}

/// The documents table of the base schema, with extra fields and indexes.
pub fn documents(extra_fields: &[String], indexes: &[String]) -> String {
    let mut fields = doc_fields();
    fields.extend_from_slice(extra_fields);
    table(
        "tbl_documents",
        "documents",
        "single_scope",
        &fields,
        indexes,
    )
}

/// The documents table with the field `replace` replaced by `by`.
pub fn documents_with(replace: &str, by: String) -> String {
    let mut fields = doc_fields();
    let i = fields
        .iter()
        .position(|f| f.contains(&format!("\"{replace}\"")))
        .unwrap();
    fields[i] = by;
    table("tbl_documents", "documents", "single_scope", &fields, &[])
}

/// The documents table without the field `remove`.
pub fn documents_without(remove: &str) -> String {
    let fields: Vec<String> = doc_fields()
        .into_iter()
        .filter(|f| !f.contains(&format!("\"{remove}\"")))
        .collect();
    table("tbl_documents", "documents", "single_scope", &fields, &[])
}

/// The documents table as multi_scope.
pub fn documents_multi() -> String {
    table(
        "tbl_documents",
        "documents",
        "multi_scope",
        &doc_fields(),
        &[],
    )
}

/// The base schema's second table with a given composition.
pub fn notes_as(composition: &str) -> String {
    table(
        "tbl_notes",
        "notes",
        composition,
        &[
            field("fld_note_id", "id", "int64", false, false),
            field("fld_note_body", "body", "string", true, true),
        ],
        &[],
    )
}

/// The base schema's second table.
pub fn notes() -> String {
    notes_as("multi_scope")
}

/// The second table as single_scope.
pub fn notes_single() -> String {
    notes_as("single_scope")
}

/// Version 1 of the base schema.
pub fn base() -> Manifest {
    manifest(1, None, "initial", 1, &[documents(&[], &[]), notes()])
}
