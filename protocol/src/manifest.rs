//! The schema manifest (spec 000 "Canonical Schema Model"): strict parsing and validation,
//! the canonical body, and the immutable schema hash.
//!
//! Parsing accepts exactly the members the spec defines. The canonical body is rebuilt from
//! the validated model with `tables`, `fields` and `indexes` sorted by the unsigned UTF-8
//! octets of their IDs, serialized by RFC 8785, and hashed as
//! `SHA-256("synchro:v3:schema-manifest:v1" || 0x00 || body)`.

use std::collections::HashSet;

use sha2::{Digest, Sha256};

use crate::binary::SCHEMA_MANIFEST_DOMAIN;
use crate::error::{Error, Result};
use crate::jcs::write_string;
use crate::json::Json;
use crate::types::{DecimalSpec, FieldSpec, PortableType};

/// Largest manifest version or generation exposed as a JSON integer (2^53 − 1).
pub const MAX_JSON_COUNTER: u64 = 9_007_199_254_740_991;

/// An exact schema reference: manifest version and hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SchemaRef {
    /// Manifest version.
    pub version: u64,
    /// Manifest SHA-256.
    pub hash: [u8; 32],
}

/// The transition that produced a manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransitionClass {
    /// The first manifest.
    Initial,
    /// Additive or permissive change, no rematerialization.
    Class2,
    /// Compatible change that rematerializes history.
    Class3,
    /// Breaking change.
    Class4,
}

impl TransitionClass {
    /// Wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TransitionClass::Initial => "initial",
            TransitionClass::Class2 => "class_2",
            TransitionClass::Class3 => "class_3",
            TransitionClass::Class4 => "class_4",
        }
    }

    /// Parses the exact wire spelling.
    pub fn parse(s: &str) -> Option<TransitionClass> {
        [
            TransitionClass::Initial,
            TransitionClass::Class2,
            TransitionClass::Class3,
            TransitionClass::Class4,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
}

/// How many scopes may justify one local row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Composition {
    /// At most one active scope provenance edge.
    SingleScope,
    /// Any number of scope provenance edges.
    MultiScope,
}

impl Composition {
    /// Wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Composition::SingleScope => "single_scope",
            Composition::MultiScope => "multi_scope",
        }
    }
}

/// A client-visible field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Immutable logical ID.
    pub field_id: String,
    /// Current local name.
    pub name: String,
    /// Type, nullability and decimal bounds.
    pub spec: FieldSpec,
    /// Whether clients may write it.
    pub writable: bool,
}

/// Lifecycle field references (each a datetime, non-writable field, or absent).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lifecycle {
    /// created_at_field_id
    pub created_at: Option<String>,
    /// updated_at_field_id
    pub updated_at: Option<String>,
    /// deleted_at_field_id
    pub deleted_at: Option<String>,
}

/// A client-owned index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// Immutable logical ID.
    pub index_id: String,
    /// Local name.
    pub name: String,
    /// Ordered, nonempty field IDs (order is semantic).
    pub field_ids: Vec<String>,
    /// Whether the index is unique.
    pub unique: bool,
}

/// A client-visible logical table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Immutable logical table ID.
    pub table_id: String,
    /// Immutable relation ID.
    pub relation_id: String,
    /// Current local name.
    pub name: String,
    /// Local composition.
    pub composition: Composition,
    /// The single primary-key field.
    pub primary_key_field_id: String,
    /// Lifecycle fields.
    pub lifecycle: Lifecycle,
    /// Fields sorted by field_id octets.
    pub fields: Vec<Field>,
    /// Indexes sorted by index_id octets.
    pub indexes: Vec<Index>,
}

impl Table {
    /// The field with this ID.
    pub fn field(&self, field_id: &str) -> Option<&Field> {
        self.fields
            .binary_search_by(|f| f.field_id.as_bytes().cmp(field_id.as_bytes()))
            .ok()
            .map(|i| &self.fields[i])
    }

    /// The primary-key field.
    pub fn primary_key(&self) -> &Field {
        self.field(&self.primary_key_field_id)
            .expect("validated manifest has its primary-key field")
    }
}

/// A validated, immutable schema manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Positive, never-reused version.
    pub schema_version: u64,
    /// Immediate parent, null for the initial manifest.
    pub parent_schema: Option<SchemaRef>,
    /// How this manifest was reached from its parent.
    pub transition_class: TransitionClass,
    /// Earliest version of the current contiguous Class 2 lineage.
    pub compatibility_floor: u64,
    /// Tables sorted by table_id octets.
    pub tables: Vec<Table>,
    schema_hash: [u8; 32],
}

impl Manifest {
    /// Parses and validates a manifest JSON text. A `schema_hash` member, when present, must
    /// equal the hash computed from the canonical body.
    pub fn parse(text: &str) -> Result<Manifest> {
        Manifest::from_json(&Json::parse(text)?)
    }

    /// Validates a parsed manifest; see [`Manifest::parse`].
    pub fn from_json(value: &Json) -> Result<Manifest> {
        let mut obj = Members::new(value, "manifest")?;
        let schema_version = counter(obj.req("schema_version")?, "schema_version")?;
        let declared = match obj.opt("schema_hash") {
            Some(v) => Some(hash_value(v, "schema_hash")?),
            None => None,
        };
        let parent_schema = match obj.req("parent_schema")? {
            Json::Null => None,
            v => {
                let mut p = Members::new(v, "parent_schema")?;
                let r = SchemaRef {
                    version: counter(p.req("version")?, "parent_schema.version")?,
                    hash: hash_value(p.req("hash")?, "parent_schema.hash")?,
                };
                p.finish()?;
                Some(r)
            }
        };
        let transition_class =
            TransitionClass::parse(str_of(obj.req("transition_class")?, "transition_class")?)
                .ok_or_else(|| Error::manifest("unknown transition_class"))?;
        let compatibility_floor = counter(obj.req("compatibility_floor")?, "compatibility_floor")?;
        let Json::Array(table_values) = obj.req("tables")? else {
            return Err(Error::manifest("tables must be an array"));
        };
        let mut tables = table_values
            .iter()
            .map(parse_table)
            .collect::<Result<Vec<_>>>()?;
        obj.finish()?;

        check_lineage(
            schema_version,
            parent_schema.map(|p| p.version),
            transition_class,
            compatibility_floor,
        )?;
        tables.sort_by(|a, b| a.table_id.as_bytes().cmp(b.table_id.as_bytes()));
        unique(tables.iter().map(|t| t.table_id.as_str()), "table_id")?;
        unique(tables.iter().map(|t| t.relation_id.as_str()), "relation_id")?;
        unique(tables.iter().map(|t| t.name.as_str()), "table name")?;

        let mut manifest = Manifest {
            schema_version,
            parent_schema,
            transition_class,
            compatibility_floor,
            tables,
            schema_hash: [0; 32],
        };
        manifest.schema_hash = Sha256::digest(manifest.hash_input()).into();
        if let Some(declared) = declared {
            if declared != manifest.schema_hash {
                return Err(Error::SchemaHashMismatch);
            }
        }
        Ok(manifest)
    }

    /// The immutable schema hash (computed, equal to any declared one).
    pub fn schema_hash(&self) -> [u8; 32] {
        self.schema_hash
    }

    /// The schema hash as 64 lowercase hexadecimal characters.
    pub fn schema_hash_hex(&self) -> String {
        hex::encode(self.schema_hash)
    }

    /// This manifest's exact schema reference.
    pub fn schema_ref(&self) -> SchemaRef {
        SchemaRef {
            version: self.schema_version,
            hash: self.schema_hash,
        }
    }

    /// The table with this ID.
    pub fn table(&self, table_id: &str) -> Option<&Table> {
        self.tables
            .binary_search_by(|t| t.table_id.as_bytes().cmp(table_id.as_bytes()))
            .ok()
            .map(|i| &self.tables[i])
    }

    /// The RFC 8785 canonical body (everything but schema_hash, collections sorted by ID).
    pub fn canonical_body(&self) -> String {
        let mut o = String::with_capacity(1024);
        o.push_str("{\"compatibility_floor\":");
        o.push_str(&self.compatibility_floor.to_string());
        o.push_str(",\"parent_schema\":");
        match &self.parent_schema {
            None => o.push_str("null"),
            Some(p) => {
                o.push_str("{\"hash\":\"");
                o.push_str(&hex::encode(p.hash));
                o.push_str("\",\"version\":");
                o.push_str(&p.version.to_string());
                o.push('}');
            }
        }
        o.push_str(",\"schema_version\":");
        o.push_str(&self.schema_version.to_string());
        o.push_str(",\"tables\":[");
        for (i, t) in self.tables.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            write_table(t, &mut o);
        }
        o.push_str("],\"transition_class\":\"");
        o.push_str(self.transition_class.as_str());
        o.push_str("\"}");
        o
    }

    /// The complete definition as sent in `schema_definition`: the canonical body plus
    /// `schema_hash`.
    pub fn definition_json(&self) -> Json {
        let mut v = Json::parse(&self.canonical_body()).expect("the canonical body is JSON");
        if let Json::Object(members) = &mut v {
            members.push(("schema_hash".into(), Json::String(self.schema_hash_hex())));
        }
        v
    }

    /// The exact schema-hash input: domain prefix and canonical body.
    pub fn hash_input(&self) -> Vec<u8> {
        let body = self.canonical_body();
        let mut out = Vec::with_capacity(SCHEMA_MANIFEST_DOMAIN.len() + body.len());
        out.extend_from_slice(SCHEMA_MANIFEST_DOMAIN);
        out.extend_from_slice(body.as_bytes());
        out
    }
}

/// Checks the version/parent/class/floor rules of spec 000 "Immutable Manifest Body, Hash,
/// And Lineage" (the upstream manifest-lineage vectors pin the floor cases).
pub fn check_lineage(
    version: u64,
    parent_version: Option<u64>,
    class: TransitionClass,
    floor: u64,
) -> Result<()> {
    match (class, parent_version) {
        (TransitionClass::Initial, Some(_)) => {
            Err(Error::manifest("an initial manifest has no parent"))
        }
        (TransitionClass::Initial, None) if floor != version => Err(Error::manifest(
            "an initial manifest's compatibility_floor equals its version",
        )),
        (TransitionClass::Initial, None) => Ok(()),
        (_, None) => Err(Error::manifest("a non-initial manifest names its parent")),
        (_, Some(parent)) if parent >= version => Err(Error::manifest(
            "schema_version must be greater than the parent version",
        )),
        (TransitionClass::Class2, Some(parent)) if floor == 0 || floor > parent => Err(
            Error::manifest("a class_2 compatibility_floor lies in 1..=parent version"),
        ),
        (TransitionClass::Class2, Some(_)) => Ok(()),
        (_, Some(_)) if floor != version => Err(Error::manifest(
            "a class_3 or class_4 compatibility_floor equals its version",
        )),
        (_, Some(_)) => Ok(()),
    }
}

fn write_table(t: &Table, o: &mut String) {
    o.push_str("{\"composition\":\"");
    o.push_str(t.composition.as_str());
    o.push_str("\",\"fields\":[");
    for (i, f) in t.fields.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        o.push_str("{\"field_id\":");
        write_string(&f.field_id, o);
        o.push_str(",\"name\":");
        write_string(&f.name, o);
        o.push_str(",\"nullable\":");
        o.push_str(if f.spec.nullable { "true" } else { "false" });
        if let Some(d) = f.spec.decimal {
            o.push_str(&format!(
                ",\"precision\":{},\"scale\":{}",
                d.precision, d.scale
            ));
        }
        o.push_str(",\"type\":\"");
        o.push_str(f.spec.ty.as_str());
        o.push_str("\",\"writable\":");
        o.push_str(if f.writable { "true" } else { "false" });
        o.push('}');
    }
    o.push_str("],\"indexes\":[");
    for (i, x) in t.indexes.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        o.push_str("{\"field_ids\":[");
        for (j, id) in x.field_ids.iter().enumerate() {
            if j > 0 {
                o.push(',');
            }
            write_string(id, o);
        }
        o.push_str("],\"index_id\":");
        write_string(&x.index_id, o);
        o.push_str(",\"name\":");
        write_string(&x.name, o);
        o.push_str(",\"unique\":");
        o.push_str(if x.unique { "true" } else { "false" });
        o.push('}');
    }
    o.push_str("],\"lifecycle\":{");
    for (i, (name, v)) in [
        ("created_at_field_id", &t.lifecycle.created_at),
        ("deleted_at_field_id", &t.lifecycle.deleted_at),
        ("updated_at_field_id", &t.lifecycle.updated_at),
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            o.push(',');
        }
        write_string(name, o);
        o.push(':');
        match v {
            Some(id) => write_string(id, o),
            None => o.push_str("null"),
        }
    }
    o.push_str("},\"name\":");
    write_string(&t.name, o);
    o.push_str(",\"primary_key_field_id\":");
    write_string(&t.primary_key_field_id, o);
    o.push_str(",\"relation_id\":");
    write_string(&t.relation_id, o);
    o.push_str(",\"table_id\":");
    write_string(&t.table_id, o);
    o.push('}');
}

fn parse_table(value: &Json) -> Result<Table> {
    let mut obj = Members::new(value, "table")?;
    let table_id = id_of(obj.req("table_id")?, "table_id")?;
    let relation_id = id_of(obj.req("relation_id")?, "relation_id")?;
    let name = id_of(obj.req("name")?, "table name")?;
    let composition = match str_of(obj.req("composition")?, "composition")? {
        "single_scope" => Composition::SingleScope,
        "multi_scope" => Composition::MultiScope,
        _ => {
            return Err(Error::manifest(format!(
                "table {table_id}: unknown composition"
            )))
        }
    };
    let primary_key_field_id = id_of(obj.req("primary_key_field_id")?, "primary_key_field_id")?;
    let lifecycle = parse_lifecycle(obj.req("lifecycle")?)?;
    let Json::Array(field_values) = obj.req("fields")? else {
        return Err(Error::manifest(format!(
            "table {table_id}: fields must be an array"
        )));
    };
    let mut fields = field_values
        .iter()
        .map(parse_field)
        .collect::<Result<Vec<_>>>()?;
    let Json::Array(index_values) = obj.req("indexes")? else {
        return Err(Error::manifest(format!(
            "table {table_id}: indexes must be an array"
        )));
    };
    let mut indexes = index_values
        .iter()
        .map(parse_index)
        .collect::<Result<Vec<_>>>()?;
    obj.finish()?;

    fields.sort_by(|a, b| a.field_id.as_bytes().cmp(b.field_id.as_bytes()));
    indexes.sort_by(|a, b| a.index_id.as_bytes().cmp(b.index_id.as_bytes()));
    let table = Table {
        table_id,
        relation_id,
        name,
        composition,
        primary_key_field_id,
        lifecycle,
        fields,
        indexes,
    };
    check_table(&table)?;
    Ok(table)
}

fn check_table(t: &Table) -> Result<()> {
    let tid = &t.table_id;
    let bad = |what: String| Err(Error::manifest(format!("table {tid}: {what}")));
    if t.fields.is_empty() {
        return bad("has no fields".into());
    }
    unique(t.fields.iter().map(|f| f.field_id.as_str()), "field_id")?;
    unique(t.fields.iter().map(|f| f.name.as_str()), "field name")?;
    unique(t.indexes.iter().map(|x| x.index_id.as_str()), "index_id")?;
    unique(t.indexes.iter().map(|x| x.name.as_str()), "index name")?;
    let Some(pk) = t.field(&t.primary_key_field_id) else {
        return bad("primary_key_field_id names no field".into());
    };
    if !pk.spec.ty.is_key_type() {
        return bad("primary key type must be string, int or int64".into());
    }
    if pk.spec.nullable {
        return bad("primary key must not be nullable".into());
    }
    if pk.writable {
        return bad("primary key must not be writable".into());
    }
    for id in [
        &t.lifecycle.created_at,
        &t.lifecycle.updated_at,
        &t.lifecycle.deleted_at,
    ]
    .into_iter()
    .flatten()
    {
        match t.field(id) {
            None => return bad(format!("lifecycle field {id} names no field")),
            Some(f) if f.spec.ty != PortableType::Datetime || f.writable => {
                return bad(format!(
                    "lifecycle field {id} must be a non-writable datetime"
                ))
            }
            Some(_) => {}
        }
    }
    for x in &t.indexes {
        if x.field_ids.is_empty() {
            return bad(format!("index {} has no fields", x.index_id));
        }
        for id in &x.field_ids {
            if t.field(id).is_none() {
                return bad(format!("index {} names an unknown field", x.index_id));
            }
        }
        unique(x.field_ids.iter().map(String::as_str), "index field")?;
    }
    Ok(())
}

fn parse_field(value: &Json) -> Result<Field> {
    let mut obj = Members::new(value, "field")?;
    let field_id = id_of(obj.req("field_id")?, "field_id")?;
    let name = id_of(obj.req("name")?, "field name")?;
    let ty = PortableType::parse(str_of(obj.req("type")?, "type")?)
        .ok_or_else(|| Error::manifest(format!("field {field_id}: unknown type")))?;
    let nullable = bool_of(obj.req("nullable")?, "nullable")?;
    let writable = bool_of(obj.req("writable")?, "writable")?;
    let precision = obj.opt("precision");
    let scale = obj.opt("scale");
    obj.finish()?;
    let decimal = match (ty, precision, scale) {
        (PortableType::Decimal, Some(p), Some(s)) => {
            let p = crate::types::json_u32(p);
            let s = crate::types::json_u32(s);
            match (p, s) {
                (Some(p), Some(s)) => Some(
                    DecimalSpec::new(p, s)
                        .map_err(|e| Error::manifest(format!("field {field_id}: {e}")))?,
                ),
                _ => {
                    return Err(Error::manifest(format!(
                        "field {field_id}: precision and scale must be integers"
                    )))
                }
            }
        }
        (PortableType::Decimal, _, _) => {
            return Err(Error::manifest(format!(
                "field {field_id}: a decimal field needs precision and scale"
            )))
        }
        (_, None, None) => None,
        _ => {
            return Err(Error::manifest(format!(
                "field {field_id}: only decimal fields have precision and scale"
            )))
        }
    };
    Ok(Field {
        field_id,
        name,
        spec: FieldSpec {
            ty,
            nullable,
            decimal,
        },
        writable,
    })
}

fn parse_lifecycle(value: &Json) -> Result<Lifecycle> {
    let mut obj = Members::new(value, "lifecycle")?;
    let mut slot = |name: &'static str| -> Result<Option<String>> {
        match obj.req(name)? {
            Json::Null => Ok(None),
            v => id_of(v, name).map(Some),
        }
    };
    let lifecycle = Lifecycle {
        created_at: slot("created_at_field_id")?,
        updated_at: slot("updated_at_field_id")?,
        deleted_at: slot("deleted_at_field_id")?,
    };
    obj.finish()?;
    Ok(lifecycle)
}

fn parse_index(value: &Json) -> Result<Index> {
    let mut obj = Members::new(value, "index")?;
    let index_id = id_of(obj.req("index_id")?, "index_id")?;
    let name = id_of(obj.req("name")?, "index name")?;
    let Json::Array(ids) = obj.req("field_ids")? else {
        return Err(Error::manifest(format!(
            "index {index_id}: field_ids must be an array"
        )));
    };
    let field_ids = ids
        .iter()
        .map(|v| id_of(v, "index field_id"))
        .collect::<Result<Vec<_>>>()?;
    let unique = bool_of(obj.req("unique")?, "unique")?;
    obj.finish()?;
    Ok(Index {
        index_id,
        name,
        field_ids,
        unique,
    })
}

/// Reads an object's members once each and rejects members nobody asked for.
struct Members<'a> {
    what: &'static str,
    members: &'a [(String, Json)],
    used: Vec<bool>,
}

impl<'a> Members<'a> {
    fn new(value: &'a Json, what: &'static str) -> Result<Self> {
        match value {
            Json::Object(m) => Ok(Members {
                what,
                members: m,
                used: vec![false; m.len()],
            }),
            _ => Err(Error::manifest(format!("{what} must be an object"))),
        }
    }

    fn opt(&mut self, name: &str) -> Option<&'a Json> {
        let i = self.members.iter().position(|(k, _)| k == name)?;
        self.used[i] = true;
        Some(&self.members[i].1)
    }

    fn req(&mut self, name: &'static str) -> Result<&'a Json> {
        let what = self.what;
        self.opt(name)
            .ok_or_else(|| Error::manifest(format!("{what} is missing {name}")))
    }

    fn finish(self) -> Result<()> {
        match self.used.iter().position(|u| !u) {
            Some(_) => Err(Error::manifest(format!(
                "{} has an unknown member",
                self.what
            ))),
            None => Ok(()),
        }
    }
}

fn str_of<'a>(v: &'a Json, what: &str) -> Result<&'a str> {
    v.as_str()
        .ok_or_else(|| Error::manifest(format!("{what} must be a string")))
}

fn id_of(v: &Json, what: &str) -> Result<String> {
    let s = str_of(v, what)?;
    if s.is_empty() {
        return Err(Error::manifest(format!("{what} must not be empty")));
    }
    Ok(s.to_owned())
}

fn bool_of(v: &Json, what: &str) -> Result<bool> {
    match v {
        Json::Bool(b) => Ok(*b),
        _ => Err(Error::manifest(format!("{what} must be a boolean"))),
    }
}

fn counter(v: &Json, what: &str) -> Result<u64> {
    let bad = || Error::manifest(format!("{what} must be a positive integer at most 2^53-1"));
    let Json::Number(t) = v else {
        return Err(bad());
    };
    if t.starts_with('0') || !t.bytes().all(|b| b.is_ascii_digit()) || t.len() > 16 {
        return Err(bad());
    }
    let n: u64 = t.parse().map_err(|_| bad())?;
    if n == 0 || n > MAX_JSON_COUNTER {
        return Err(bad());
    }
    Ok(n)
}

/// Parses 64 lowercase hexadecimal characters into 32 octets.
pub fn parse_hex32(s: &str) -> Result<[u8; 32]> {
    if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(Error::InvalidDigest);
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).map_err(|_| Error::InvalidDigest)?;
    Ok(out)
}

fn hash_value(v: &Json, what: &str) -> Result<[u8; 32]> {
    parse_hex32(str_of(v, what)?)
        .map_err(|_| Error::manifest(format!("{what} must be 64 lowercase hex characters")))
}

fn unique<'a>(ids: impl Iterator<Item = &'a str>, what: &str) -> Result<()> {
    let mut seen = HashSet::new();
    for id in ids {
        if !seen.insert(id) {
            return Err(Error::manifest(format!("duplicate {what} {id}")));
        }
    }
    Ok(())
}
