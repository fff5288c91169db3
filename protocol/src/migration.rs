//! Local SQLite migration plans (spec 000 "Client Migration Rules", "Portable To SQLite
//! Mapping"; spec 003 "Crash-safe local schema application").
//!
//! [`MigrationPlan::derive`] turns a source manifest (or none, for a first install) and a
//! target manifest into a deterministic, typed list of [`Op`]s. The plan names both schema
//! references and is hashed ([`MigrationPlan::plan_hash`]) so a journal can prove it still
//! belongs to the manifests it persisted ([`MigrationPlan::verify`]). [`MigrationPlan::render`]
//! turns it into SQLite statements; there is no other way to get SQL out of a plan, and every
//! identifier is quoted.
//!
//! Physical rules (docs/protocol-decisions.md, "Local SQLite schema"):
//! - Tables are `STRICT`; types follow the portable mapping (int64 INTEGER, decimal TEXT,
//!   float REAL, boolean INTEGER with a 0/1 check, int INTEGER with an int32 range check,
//!   bytes BLOB, the rest TEXT).
//! - Only the primary key is physically NOT NULL. Logical nullability is checked on every
//!   write by the client, so loosening it never needs DDL, and a logically nullable field is
//!   never physically NOT NULL.
//! - Provenance lives in one `_synchro_provenance:<table_id>` table per synced table, keyed
//!   by primary key (single_scope) or by primary key and scope (multi_scope).
//! - `migrate` mode accepts only compatible (Class 2/3) differences; `reset` mode rebuilds by
//!   copy any table SQLite cannot ALTER, keeping only columns whose contract did not narrow.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::jcs::write_string;
use crate::json::Json;
use crate::manifest::{Composition, Field, Index, Manifest, SchemaRef, Table};
use crate::types::PortableType;

/// Version of the plan format and derivation rules.
pub const MIGRATION_PLAN_VERSION: u64 = 1;

/// `ASCII("synchro:v3:migration-plan:v1") || 0x00`
pub const MIGRATION_PLAN_DOMAIN: &[u8] = b"synchro:v3:migration-plan:v1\0";

/// The local table holding the active schema reference and body.
pub const SCHEMA_TABLE: &str = "_synchro_schema";

/// Prefix of every protocol-owned local object.
pub const RESERVED_PREFIX: &str = "_synchro_";

/// How a plan relates its source and target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanMode {
    /// No synced schema installed yet.
    Install,
    /// A compatible (Class 2/3) lineage: additive DDL and metadata only.
    Migrate,
    /// An explicit incompatible-schema reset: tables SQLite cannot ALTER are rebuilt.
    Reset,
}

impl PlanMode {
    /// Wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanMode::Install => "install",
            PlanMode::Migrate => "migrate",
            PlanMode::Reset => "reset",
        }
    }
}

/// SQLite storage class of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqliteType {
    /// TEXT
    Text,
    /// INTEGER
    Integer,
    /// REAL
    Real,
    /// BLOB
    Blob,
}

impl SqliteType {
    /// The portable-to-SQLite mapping of spec 000.
    pub fn of(ty: PortableType) -> SqliteType {
        match ty {
            PortableType::Int | PortableType::Int64 | PortableType::Boolean => SqliteType::Integer,
            PortableType::Float => SqliteType::Real,
            PortableType::Bytes => SqliteType::Blob,
            PortableType::String
            | PortableType::Decimal
            | PortableType::Datetime
            | PortableType::Date
            | PortableType::Time
            | PortableType::Json => SqliteType::Text,
        }
    }

    /// SQL spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SqliteType::Text => "TEXT",
            SqliteType::Integer => "INTEGER",
            SqliteType::Real => "REAL",
            SqliteType::Blob => "BLOB",
        }
    }
}

/// One column of a synced table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Logical field ID.
    pub field_id: String,
    /// Column name (the field's local name).
    pub name: String,
    /// Portable type (decides storage class and checks).
    pub ty: PortableType,
    /// Whether this is the primary key (the only physically NOT NULL column).
    pub primary_key: bool,
}

impl Column {
    fn of(table: &Table, f: &Field) -> Column {
        Column {
            field_id: f.field_id.clone(),
            name: f.name.clone(),
            ty: f.spec.ty,
            primary_key: f.field_id == table.primary_key_field_id,
        }
    }
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create the protocol's schema metadata table (first install only).
    CreateMetadata,
    /// Create a synced table.
    CreateTable {
        /// Logical table ID.
        table_id: String,
        /// Table name.
        name: String,
        /// Columns in field-ID order.
        columns: Vec<Column>,
    },
    /// Add a (physically nullable) column.
    AddColumn {
        /// Logical table ID.
        table_id: String,
        /// Table name.
        table: String,
        /// The new column.
        column: Column,
    },
    /// Recreate a table under its target shape and copy the listed columns.
    RebuildTable {
        /// Logical table ID.
        table_id: String,
        /// Current table name.
        from: String,
        /// Target table name.
        name: String,
        /// Target columns in field-ID order.
        columns: Vec<Column>,
        /// `(source column, target column)` pairs copied; empty copies no rows.
        copy: Vec<(String, String)>,
    },
    /// Drop a synced table that the target no longer has (reset only).
    DropTable {
        /// Logical table ID.
        table_id: String,
        /// Table name.
        name: String,
    },
    /// Create an index.
    CreateIndex {
        /// Table name.
        table: String,
        /// Index name.
        name: String,
        /// Column names in index order.
        columns: Vec<String>,
        /// UNIQUE or not.
        unique: bool,
    },
    /// Drop an index.
    DropIndex {
        /// Index name.
        name: String,
    },
    /// Create the provenance table of a synced table.
    CreateProvenance {
        /// Logical table ID.
        table_id: String,
        /// Composition (decides the key).
        composition: Composition,
        /// Primary-key portable type.
        key_type: PortableType,
    },
    /// Drop the provenance table of a synced table.
    DropProvenance {
        /// Logical table ID.
        table_id: String,
    },
    /// Record the target schema reference and canonical body as active.
    SetSchema {
        /// Target reference.
        target: SchemaRef,
        /// Target canonical manifest body.
        body: String,
    },
}

/// A deterministic, hash-bound migration plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationPlan {
    /// How the plan relates its manifests.
    pub mode: PlanMode,
    /// The schema active before the plan (none for an install).
    pub source: Option<SchemaRef>,
    /// The schema active after the plan.
    pub target: SchemaRef,
    /// The operations, in execution order.
    pub ops: Vec<Op>,
}

fn plan_err(reason: impl Into<String>) -> Error {
    Error::InvalidMigrationPlan {
        reason: reason.into(),
    }
}

impl MigrationPlan {
    /// Derives the plan from `source` (none for a first install) to `target`. `reset`
    /// selects reset mode; otherwise every difference must be compatible.
    pub fn derive(
        source: Option<&Manifest>,
        target: &Manifest,
        reset: bool,
    ) -> Result<MigrationPlan> {
        check_local_names(target)?;
        let mode = match (source, reset) {
            (None, _) => PlanMode::Install,
            (Some(_), false) => PlanMode::Migrate,
            (Some(_), true) => PlanMode::Reset,
        };
        let mut ops = Vec::new();
        match source {
            None => {
                ops.push(Op::CreateMetadata);
                for t in &target.tables {
                    create_table(t, &mut ops);
                }
            }
            Some(src) => {
                for s in &src.tables {
                    if target.table(&s.table_id).is_none() {
                        if mode == PlanMode::Migrate {
                            return Err(plan_err(format!(
                                "table {} is removed: a reset is required",
                                s.table_id
                            )));
                        }
                        ops.push(Op::DropProvenance {
                            table_id: s.table_id.clone(),
                        });
                        ops.push(Op::DropTable {
                            table_id: s.table_id.clone(),
                            name: s.name.clone(),
                        });
                    }
                }
                for t in &target.tables {
                    match src.table(&t.table_id) {
                        None => create_table(t, &mut ops),
                        Some(s) => change_table(s, t, mode, &mut ops)?,
                    }
                }
            }
        }
        ops.push(Op::SetSchema {
            target: target.schema_ref(),
            body: target.canonical_body(),
        });
        Ok(MigrationPlan {
            mode,
            source: source.map(Manifest::schema_ref),
            target: target.schema_ref(),
            ops,
        })
    }

    /// Re-derives the plan from the persisted manifests and checks it is this plan (same
    /// references, same operations): a journal replays a plan only through this check.
    pub fn verify(&self, source: Option<&Manifest>, target: &Manifest) -> Result<()> {
        let again = MigrationPlan::derive(source, target, self.mode == PlanMode::Reset)?;
        if again != *self {
            return Err(plan_err(
                "the plan does not match its source and target manifests",
            ));
        }
        Ok(())
    }

    /// The plan as canonical JSON text (the plan-hash input after the domain prefix).
    pub fn to_json_string(&self) -> String {
        let r = |r: &SchemaRef| {
            format!(
                "{{\"hash\":\"{}\",\"version\":{}}}",
                hex::encode(r.hash),
                r.version
            )
        };
        let mut o = String::from("{\"mode\":");
        write_string(self.mode.as_str(), &mut o);
        o.push_str(",\"ops\":[");
        for (i, op) in self.ops.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            write_op(op, &mut o);
        }
        o.push_str("],\"plan_version\":");
        o.push_str(&MIGRATION_PLAN_VERSION.to_string());
        o.push_str(",\"source\":");
        o.push_str(&self.source.as_ref().map_or("null".to_owned(), r));
        o.push_str(",\"target\":");
        o.push_str(&r(&self.target));
        o.push('}');
        o
    }

    /// The plan as a JSON value.
    pub fn to_json(&self) -> Json {
        Json::parse(&self.to_json_string()).expect("a plan serializes to JSON")
    }

    /// `SHA-256(MIGRATION_PLAN_DOMAIN || canonical plan JSON)`.
    pub fn plan_hash(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(MIGRATION_PLAN_DOMAIN);
        h.update(self.to_json_string().as_bytes());
        h.finalize().into()
    }

    /// The SQLite statements, in order, to run in one transaction.
    pub fn render(&self) -> Vec<String> {
        let mut out = Vec::new();
        for op in &self.ops {
            render_op(op, &mut out);
        }
        out
    }
}

fn create_table(t: &Table, ops: &mut Vec<Op>) {
    ops.push(Op::CreateTable {
        table_id: t.table_id.clone(),
        name: t.name.clone(),
        columns: t.fields.iter().map(|f| Column::of(t, f)).collect(),
    });
    ops.push(Op::CreateProvenance {
        table_id: t.table_id.clone(),
        composition: t.composition,
        key_type: t.primary_key().spec.ty,
    });
    for x in &t.indexes {
        ops.push(create_index(t, x));
    }
}

fn create_index(t: &Table, x: &Index) -> Op {
    Op::CreateIndex {
        table: t.name.clone(),
        name: x.name.clone(),
        columns: x
            .field_ids
            .iter()
            .map(|id| t.field(id).expect("validated index field").name.clone())
            .collect(),
        unique: x.unique,
    }
}

/// Whether the source column's values all fit the target field's contract unchanged.
fn keeps_values(s: &Field, t: &Field) -> bool {
    if s.spec.ty != t.spec.ty {
        return false;
    }
    match (s.spec.decimal, t.spec.decimal) {
        (Some(a), Some(b)) => b.scale >= a.scale && b.precision - b.scale >= a.precision - a.scale,
        _ => true,
    }
}

fn change_table(s: &Table, t: &Table, mode: PlanMode, ops: &mut Vec<Op>) -> Result<()> {
    let tid = &t.table_id;
    let removed: Vec<&Field> = s
        .fields
        .iter()
        .filter(|f| t.field(&f.field_id).is_none())
        .collect();
    let changed: Vec<&Field> = s
        .fields
        .iter()
        .filter(|f| {
            t.field(&f.field_id)
                .is_some_and(|tf| tf.name != f.name || !keeps_values(f, tf))
        })
        .collect();
    let needs_rebuild = t.name != s.name
        || t.primary_key_field_id != s.primary_key_field_id
        || !removed.is_empty()
        || !changed.is_empty();
    let index_changed = |x: &Index| t.indexes.iter().find(|y| y.index_id == x.index_id) != Some(x);
    if mode == PlanMode::Migrate && (needs_rebuild || s.indexes.iter().any(index_changed)) {
        return Err(plan_err(format!(
            "table {tid} changes incompatibly (removed, renamed, retyped or narrowed field, key or index): a reset is required"
        )));
    }
    if needs_rebuild {
        // Dropping the old table drops its indexes; the target's are created below.
        let key_kept = t.primary_key_field_id == s.primary_key_field_id
            && keeps_values(s.primary_key(), t.primary_key());
        let copy = if key_kept {
            t.fields
                .iter()
                .filter_map(|tf| {
                    let sf = s.field(&tf.field_id)?;
                    keeps_values(sf, tf).then(|| (sf.name.clone(), tf.name.clone()))
                })
                .collect()
        } else {
            // Rows keyed by another key cannot be carried over; the reset rebuild refills.
            Vec::new()
        };
        ops.push(Op::RebuildTable {
            table_id: tid.clone(),
            from: s.name.clone(),
            name: t.name.clone(),
            columns: t.fields.iter().map(|f| Column::of(t, f)).collect(),
            copy,
        });
    } else {
        for x in s.indexes.iter().filter(|x| index_changed(x)) {
            ops.push(Op::DropIndex {
                name: x.name.clone(),
            });
        }
        for f in t.fields.iter().filter(|f| s.field(&f.field_id).is_none()) {
            ops.push(Op::AddColumn {
                table_id: tid.clone(),
                table: t.name.clone(),
                column: Column::of(t, f),
            });
        }
    }
    let key_type_changed = t.primary_key().spec.ty != s.primary_key().spec.ty;
    if t.composition != s.composition || key_type_changed {
        ops.push(Op::DropProvenance {
            table_id: tid.clone(),
        });
        ops.push(Op::CreateProvenance {
            table_id: tid.clone(),
            composition: t.composition,
            key_type: t.primary_key().spec.ty,
        });
    }
    for x in &t.indexes {
        let existed = s.indexes.iter().any(|y| y == x);
        if needs_rebuild || !existed {
            ops.push(create_index(t, x));
        }
    }
    Ok(())
}

/// SQLite compares identifiers case-insensitively (ASCII) and reserves `sqlite_`; names
/// must also stay clear of the protocol's `_synchro_` objects and contain no NUL.
fn check_local_names(target: &Manifest) -> Result<()> {
    let mut global: BTreeSet<String> = BTreeSet::new();
    let claim = |set: &mut BTreeSet<String>, name: &str, what: &str| -> Result<()> {
        let folded = name.to_ascii_lowercase();
        if name.contains('\0') {
            return Err(plan_err(format!("{what} name contains NUL")));
        }
        if folded.starts_with("sqlite_") || folded.starts_with(RESERVED_PREFIX) {
            return Err(plan_err(format!("{what} name {name} is reserved")));
        }
        if !set.insert(folded) {
            return Err(plan_err(format!(
                "{what} name {name} collides (SQLite ignores ASCII case)"
            )));
        }
        Ok(())
    };
    for t in &target.tables {
        claim(&mut global, &t.name, "table")?;
        for x in &t.indexes {
            claim(&mut global, &x.name, "index")?;
        }
        let mut columns = BTreeSet::new();
        for f in &t.fields {
            claim(&mut columns, &f.name, "column")?;
        }
    }
    let provenance: BTreeSet<String> = target
        .tables
        .iter()
        .map(|t| t.table_id.to_ascii_lowercase())
        .collect();
    if provenance.len() != target.tables.len()
        || target.tables.iter().any(|t| t.table_id.contains('\0'))
    {
        return Err(plan_err("table IDs collide when ASCII case is ignored"));
    }
    Ok(())
}

/// `"name"` with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_text(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn provenance_table(table_id: &str) -> String {
    format!("{RESERVED_PREFIX}provenance:{table_id}")
}

fn column_sql(c: &Column) -> String {
    let q = quote_ident(&c.name);
    let mut s = format!("{q} {}", SqliteType::of(c.ty).as_str());
    if c.primary_key {
        s.push_str(" NOT NULL PRIMARY KEY");
    }
    match c.ty {
        PortableType::Boolean => s.push_str(&format!(" CHECK ({q} IN (0, 1))")),
        PortableType::Int => {
            s.push_str(&format!(" CHECK ({q} BETWEEN -2147483648 AND 2147483647)"))
        }
        _ => {}
    }
    s
}

fn create_table_sql(name: &str, columns: &[Column]) -> String {
    let cols: Vec<String> = columns.iter().map(column_sql).collect();
    format!(
        "CREATE TABLE {} ({}) STRICT",
        quote_ident(name),
        cols.join(", ")
    )
}

fn render_op(op: &Op, out: &mut Vec<String>) {
    match op {
        Op::CreateMetadata => out.push(format!(
            "CREATE TABLE {} (\"id\" INTEGER NOT NULL PRIMARY KEY CHECK (\"id\" = 1), \"version\" INTEGER NOT NULL, \"hash\" TEXT NOT NULL, \"body\" TEXT NOT NULL) STRICT",
            quote_ident(SCHEMA_TABLE)
        )),
        Op::CreateTable { name, columns, .. } => out.push(create_table_sql(name, columns)),
        Op::AddColumn { table, column, .. } => out.push(format!(
            "ALTER TABLE {} ADD COLUMN {}",
            quote_ident(table),
            column_sql(column)
        )),
        Op::RebuildTable {
            from,
            name,
            columns,
            copy,
            ..
        } => {
            let scratch = format!("{RESERVED_PREFIX}rebuild:{name}");
            out.push(create_table_sql(&scratch, columns));
            if !copy.is_empty() {
                let to: Vec<String> = copy.iter().map(|(_, t)| quote_ident(t)).collect();
                let from_cols: Vec<String> = copy.iter().map(|(f, _)| quote_ident(f)).collect();
                out.push(format!(
                    "INSERT INTO {} ({}) SELECT {} FROM {}",
                    quote_ident(&scratch),
                    to.join(", "),
                    from_cols.join(", "),
                    quote_ident(from)
                ));
            }
            out.push(format!("DROP TABLE {}", quote_ident(from)));
            out.push(format!(
                "ALTER TABLE {} RENAME TO {}",
                quote_ident(&scratch),
                quote_ident(name)
            ));
        }
        Op::DropTable { name, .. } => out.push(format!("DROP TABLE {}", quote_ident(name))),
        Op::CreateIndex {
            table,
            name,
            columns,
            unique,
        } => {
            let cols: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
            out.push(format!(
                "CREATE {}INDEX {} ON {} ({})",
                if *unique { "UNIQUE " } else { "" },
                quote_ident(name),
                quote_ident(table),
                cols.join(", ")
            ));
        }
        Op::DropIndex { name } => out.push(format!("DROP INDEX {}", quote_ident(name))),
        Op::CreateProvenance {
            table_id,
            composition,
            key_type,
        } => {
            let p = provenance_table(table_id);
            let key = SqliteType::of(*key_type).as_str();
            out.push(match composition {
                Composition::SingleScope => format!(
                    "CREATE TABLE {} (\"pk\" {key} NOT NULL PRIMARY KEY, \"scope_id\" TEXT NOT NULL) STRICT, WITHOUT ROWID",
                    quote_ident(&p)
                ),
                Composition::MultiScope => format!(
                    "CREATE TABLE {} (\"pk\" {key} NOT NULL, \"scope_id\" TEXT NOT NULL, PRIMARY KEY (\"pk\", \"scope_id\")) STRICT, WITHOUT ROWID",
                    quote_ident(&p)
                ),
            });
            out.push(format!(
                "CREATE INDEX {} ON {} (\"scope_id\")",
                quote_ident(&format!("{p}:scope")),
                quote_ident(&p)
            ));
        }
        Op::DropProvenance { table_id } => out.push(format!(
            "DROP TABLE {}",
            quote_ident(&provenance_table(table_id))
        )),
        Op::SetSchema { target, body } => out.push(format!(
            "INSERT OR REPLACE INTO {} (\"id\", \"version\", \"hash\", \"body\") VALUES (1, {}, {}, {})",
            quote_ident(SCHEMA_TABLE),
            target.version,
            quote_text(&hex::encode(target.hash)),
            quote_text(body)
        )),
    }
}

fn write_column(c: &Column, o: &mut String) {
    o.push_str("{\"field_id\":");
    write_string(&c.field_id, o);
    o.push_str(",\"name\":");
    write_string(&c.name, o);
    o.push_str(",\"primary_key\":");
    o.push_str(if c.primary_key { "true" } else { "false" });
    o.push_str(",\"sqlite_type\":\"");
    o.push_str(SqliteType::of(c.ty).as_str());
    o.push_str("\",\"type\":\"");
    o.push_str(c.ty.as_str());
    o.push_str("\"}");
}

fn write_list<T>(items: &[T], o: &mut String, mut each: impl FnMut(&T, &mut String)) {
    o.push('[');
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        each(x, o);
    }
    o.push(']');
}

/// Writes one op as canonical JSON (members in RFC 8785 order).
fn write_op(op: &Op, o: &mut String) {
    let s = |o: &mut String, k: &str, v: &str| {
        o.push(',');
        write_string(k, o);
        o.push(':');
        write_string(v, o);
    };
    match op {
        Op::CreateMetadata => o.push_str("{\"op\":\"create_metadata\"}"),
        Op::CreateTable {
            table_id,
            name,
            columns,
        } => {
            o.push_str("{\"columns\":");
            write_list(columns, o, write_column);
            s(o, "name", name);
            s(o, "op", "create_table");
            s(o, "table_id", table_id);
            o.push('}');
        }
        Op::AddColumn {
            table_id,
            table,
            column,
        } => {
            o.push_str("{\"column\":");
            write_column(column, o);
            s(o, "op", "add_column");
            s(o, "table", table);
            s(o, "table_id", table_id);
            o.push('}');
        }
        Op::RebuildTable {
            table_id,
            from,
            name,
            columns,
            copy,
        } => {
            o.push_str("{\"columns\":");
            write_list(columns, o, write_column);
            o.push_str(",\"copy\":");
            write_list(copy, o, |(f, t), o| {
                o.push('[');
                write_string(f, o);
                o.push(',');
                write_string(t, o);
                o.push(']');
            });
            s(o, "from", from);
            s(o, "name", name);
            s(o, "op", "rebuild_table");
            s(o, "table_id", table_id);
            o.push('}');
        }
        Op::DropTable { table_id, name } => {
            o.push_str("{\"name\":");
            write_string(name, o);
            s(o, "op", "drop_table");
            s(o, "table_id", table_id);
            o.push('}');
        }
        Op::CreateIndex {
            table,
            name,
            columns,
            unique,
        } => {
            o.push_str("{\"columns\":");
            write_list(columns, o, |c, o| write_string(c, o));
            s(o, "name", name);
            s(o, "op", "create_index");
            s(o, "table", table);
            o.push_str(",\"unique\":");
            o.push_str(if *unique { "true" } else { "false" });
            o.push('}');
        }
        Op::DropIndex { name } => {
            o.push_str("{\"name\":");
            write_string(name, o);
            s(o, "op", "drop_index");
            o.push('}');
        }
        Op::CreateProvenance {
            table_id,
            composition,
            key_type,
        } => {
            o.push_str("{\"composition\":");
            write_string(composition.as_str(), o);
            s(o, "key_type", key_type.as_str());
            s(o, "op", "create_provenance");
            s(o, "table_id", table_id);
            o.push('}');
        }
        Op::DropProvenance { table_id } => {
            o.push_str("{\"op\":\"drop_provenance\"");
            s(o, "table_id", table_id);
            o.push('}');
        }
        Op::SetSchema { target, body } => {
            o.push_str("{\"body\":");
            write_string(body, o);
            s(o, "hash", &hex::encode(target.hash));
            s(o, "op", "set_schema");
            o.push_str(&format!(",\"version\":{}}}", target.version));
        }
    }
}
