//! Schema change classification (spec 000 "Schema Change Classes", spec 003 "Schema classes").
//!
//! [`classify`] takes a parent and a child manifest plus the server facts the class depends
//! on and applies the ordered decision of spec 000: unchanged is Class 1; any removal,
//! rename, type change, decimal narrowing, nullability tightening, writability removal or
//! key change is Class 4; a remaining change that needs historical rematerialization is
//! Class 3; a remaining additive or permissive change is Class 2; anything else is Class 4.
//!
//! Facts are fail-safe: an added field counts as having no historical values only when the
//! server recorded that (`added_fields_without_history`), and an added table counts as empty
//! only when recorded (`empty_added_tables`); missing evidence means rematerialization
//! (spec 000: "A registry generation without a recorded result ... is classified as requiring
//! historical values").

use std::collections::BTreeSet;

use crate::error::{Error, Result};
use crate::manifest::{Manifest, Table, TransitionClass};

/// The class of one schema change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChangeClass {
    /// Server-only; no new manifest.
    Class1,
    /// Compatible additive change, no rematerialization.
    Class2,
    /// Compatible change that rematerializes affected scopes.
    Class3,
    /// Incompatible structural or identity change.
    Class4,
}

impl ChangeClass {
    /// Wire spelling (`class_1` … `class_4`).
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeClass::Class1 => "class_1",
            ChangeClass::Class2 => "class_2",
            ChangeClass::Class3 => "class_3",
            ChangeClass::Class4 => "class_4",
        }
    }

    /// The manifest transition_class this class publishes; Class 1 publishes none.
    pub fn transition_class(self) -> Option<TransitionClass> {
        match self {
            ChangeClass::Class1 => None,
            ChangeClass::Class2 => Some(TransitionClass::Class2),
            ChangeClass::Class3 => Some(TransitionClass::Class3),
            ChangeClass::Class4 => Some(TransitionClass::Class4),
        }
    }
}

/// Server facts a classification depends on, recorded when the registry generation was
/// validated. Every set names logical IDs of the child manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransitionFacts {
    /// Added fields `(table_id, field_id)` whose existing source values are all SQL null
    /// and that have no populated default. Other added fields need historical values.
    pub added_fields_without_history: BTreeSet<(String, String)>,
    /// Added tables recorded as having no rows. Other added tables have rows.
    pub empty_added_tables: BTreeSet<String>,
    /// Tables whose membership materialization changes local provenance or needs a new
    /// local materialization contract.
    pub materialization_changed: BTreeSet<String>,
    /// Tables under controlled physical relation reconfiguration.
    pub reconfigured: BTreeSet<String>,
}

/// The result of [`classify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// The class of the whole change.
    pub class: ChangeClass,
    /// The tables whose changes decide that class (for Class 3: the tables to
    /// rematerialize; for Class 4: the incompatible ones; for Class 2: every changed table).
    pub affected_tables: BTreeSet<String>,
}

/// Per-class table sets collected while comparing.
#[derive(Default)]
struct Findings {
    class2: BTreeSet<String>,
    class3: BTreeSet<String>,
    class4: BTreeSet<String>,
}

impl Findings {
    fn mark(&mut self, class: ChangeClass, table_id: &str) {
        let set = match class {
            ChangeClass::Class1 => return,
            ChangeClass::Class2 => &mut self.class2,
            ChangeClass::Class3 => &mut self.class3,
            ChangeClass::Class4 => &mut self.class4,
        };
        set.insert(table_id.to_owned());
    }
}

/// Classifies the change from `parent` to `child` under `facts`.
pub fn classify(
    parent: &Manifest,
    child: &Manifest,
    facts: &TransitionFacts,
) -> Result<Classification> {
    check_facts(child, facts)?;
    let mut f = Findings::default();
    for p in &parent.tables {
        match child.table(&p.table_id) {
            None => f.mark(ChangeClass::Class4, &p.table_id),
            Some(c) => compare_table(p, c, facts, &mut f),
        }
    }
    for c in &child.tables {
        if parent.table(&c.table_id).is_none() {
            let class = if facts.empty_added_tables.contains(&c.table_id) {
                ChangeClass::Class2
            } else {
                ChangeClass::Class3
            };
            f.mark(class, &c.table_id);
        }
    }
    for t in facts
        .materialization_changed
        .iter()
        .chain(&facts.reconfigured)
    {
        if parent.table(t).is_some() {
            f.mark(ChangeClass::Class3, t);
        }
    }
    let (class, affected_tables) = if !f.class4.is_empty() {
        (ChangeClass::Class4, f.class4)
    } else if !f.class3.is_empty() {
        (ChangeClass::Class3, f.class3)
    } else if !f.class2.is_empty() {
        (ChangeClass::Class2, f.class2)
    } else {
        (ChangeClass::Class1, BTreeSet::new())
    };
    Ok(Classification {
        class,
        affected_tables,
    })
}

fn check_facts(child: &Manifest, facts: &TransitionFacts) -> Result<()> {
    let unknown_table = |t: &String| child.table(t).is_none();
    if facts
        .empty_added_tables
        .iter()
        .chain(&facts.materialization_changed)
        .chain(&facts.reconfigured)
        .any(unknown_table)
    {
        return Err(Error::request(
            "transition facts name a table the child manifest lacks",
        ));
    }
    for (t, fld) in &facts.added_fields_without_history {
        if child.table(t).and_then(|t| t.field(fld)).is_none() {
            return Err(Error::request(
                "transition facts name a field the child manifest lacks",
            ));
        }
    }
    Ok(())
}

fn compare_table(p: &Table, c: &Table, facts: &TransitionFacts, f: &mut Findings) {
    let id = &p.table_id;
    // Identity, name and key changes; lifecycle declarations are part of the contract and
    // no rule lists a compatible change of them.
    if c.name != p.name
        || c.relation_id != p.relation_id
        || c.primary_key_field_id != p.primary_key_field_id
        || c.lifecycle != p.lifecycle
    {
        f.mark(ChangeClass::Class4, id);
    }
    if c.composition != p.composition {
        f.mark(ChangeClass::Class3, id);
    }
    for pf in &p.fields {
        let Some(cf) = c.field(&pf.field_id) else {
            f.mark(ChangeClass::Class4, id);
            continue;
        };
        if cf.name != pf.name || cf.spec.ty != pf.spec.ty {
            f.mark(ChangeClass::Class4, id);
            continue;
        }
        if let (Some(pd), Some(cd)) = (pf.spec.decimal, cf.spec.decimal) {
            let (p_int, c_int) = (pd.precision - pd.scale, cd.precision - cd.scale);
            if cd.scale < pd.scale || c_int < p_int {
                f.mark(ChangeClass::Class4, id);
            } else if cd != pd {
                f.mark(ChangeClass::Class2, id);
            }
        }
        match (pf.spec.nullable, cf.spec.nullable) {
            (true, false) => f.mark(ChangeClass::Class4, id),
            (false, true) => f.mark(ChangeClass::Class2, id),
            _ => {}
        }
        match (pf.writable, cf.writable) {
            (true, false) => f.mark(ChangeClass::Class4, id),
            (false, true) => f.mark(ChangeClass::Class2, id),
            _ => {}
        }
    }
    for cf in &c.fields {
        if p.field(&cf.field_id).is_none() {
            let recorded_null = facts
                .added_fields_without_history
                .contains(&(id.clone(), cf.field_id.clone()));
            // A required field needs a value in every existing row: rematerialize.
            let class = if cf.spec.nullable && recorded_null {
                ChangeClass::Class2
            } else {
                ChangeClass::Class3
            };
            f.mark(class, id);
        }
    }
    for pi in &p.indexes {
        match c.indexes.iter().find(|ci| ci.index_id == pi.index_id) {
            // Only adding an index is listed as compatible. Removing or changing one is
            // "anything else" (a dropped unique index would also let the server send rows an
            // older client's unique index rejects).
            Some(ci) if ci == pi => {}
            _ => f.mark(ChangeClass::Class4, id),
        }
    }
    if c.indexes
        .iter()
        .any(|ci| !p.indexes.iter().any(|pi| pi.index_id == ci.index_id))
    {
        f.mark(ChangeClass::Class2, id);
    }
}
