//! Manifest lineage: a store-agnostic history of immutable manifests addressed by exact
//! (version, hash) references and linked by parent references, never by version order.
//!
//! The history is linear: each new manifest names the current one as its parent. Appending
//! validates the child against its parent — positive never-reused version at most 2^53−1,
//! exact parent reference, the transition class [`classify`] produces from the server's
//! facts, and the compatibility floor the rules produce (the parent's floor after Class 2,
//! the child's own version after Class 3 or 4).

use std::collections::BTreeMap;

use crate::classify::{classify, ChangeClass, Classification, TransitionFacts};
use crate::error::{Error, Result};
use crate::json::Json;
use crate::manifest::{parse_hex32, Manifest, SchemaRef, TransitionClass, MAX_JSON_COUNTER};

/// An immutable manifest history.
#[derive(Debug, Clone, Default)]
pub struct Lineage {
    by_version: BTreeMap<u64, Manifest>,
}

impl Lineage {
    /// An empty history.
    pub fn new() -> Lineage {
        Lineage::default()
    }

    /// Rebuilds a history from stored manifests (any order). Structure is validated —
    /// one initial manifest, exact parent links forming one chain, versions, floors — but
    /// classes are trusted as recorded, since the facts they were derived from are not
    /// part of the manifests.
    pub fn from_history(manifests: impl IntoIterator<Item = Manifest>) -> Result<Lineage> {
        let mut sorted: Vec<Manifest> = manifests.into_iter().collect();
        sorted.sort_by_key(|m| m.schema_version);
        let mut lineage = Lineage::new();
        for m in sorted {
            lineage.check_structure(&m)?;
            lineage.by_version.insert(m.schema_version, m);
        }
        Ok(lineage)
    }

    /// Publishes `child` as the new current manifest after validating it against the
    /// current one, including that its transition_class is exactly the class of the change
    /// under `facts`. Returns that classification (`None` for the initial manifest).
    pub fn append(
        &mut self,
        child: Manifest,
        facts: &TransitionFacts,
    ) -> Result<Option<Classification>> {
        self.check_structure(&child)?;
        let classification = match self.current() {
            None => None,
            Some(parent) => {
                let c = classify(parent, &child, facts)?;
                if c.class.transition_class() != Some(child.transition_class) {
                    return Err(Error::lineage(match c.class {
                        ChangeClass::Class1 => {
                            "a Class 1 change does not publish a manifest".to_owned()
                        }
                        class => format!(
                            "the change is {}, but the manifest declares {}",
                            class.as_str(),
                            child.transition_class.as_str()
                        ),
                    }));
                }
                Some(c)
            }
        };
        self.by_version.insert(child.schema_version, child);
        Ok(classification)
    }

    fn check_structure(&self, child: &Manifest) -> Result<()> {
        if self.by_version.contains_key(&child.schema_version) {
            return Err(Error::lineage(format!(
                "schema_version {} is already used",
                child.schema_version
            )));
        }
        match (self.current(), child.parent_schema) {
            (None, None) if child.transition_class == TransitionClass::Initial => Ok(()),
            (None, _) => Err(Error::lineage("the first manifest must be the initial one")),
            (Some(_), None) => Err(Error::lineage("only the first manifest is initial")),
            (Some(current), Some(parent)) => {
                if parent != current.schema_ref() {
                    return Err(Error::lineage(format!(
                        "the parent of version {} must be the current manifest (version {})",
                        child.schema_version, current.schema_version
                    )));
                }
                // Manifest::parse already checked floor ranges against the parent version;
                // the exact floor depends on the parent's own floor.
                let want = match child.transition_class {
                    TransitionClass::Class2 => current.compatibility_floor,
                    _ => child.schema_version,
                };
                if child.compatibility_floor != want {
                    return Err(Error::lineage(format!(
                        "compatibility_floor of version {} must be {want}",
                        child.schema_version
                    )));
                }
                Ok(())
            }
        }
    }

    /// The current (newest) manifest.
    pub fn current(&self) -> Option<&Manifest> {
        self.by_version.values().next_back()
    }

    /// The manifest with exactly this reference (version and hash both match).
    pub fn get(&self, r: &SchemaRef) -> Option<&Manifest> {
        self.by_version
            .get(&r.version)
            .filter(|m| m.schema_hash() == r.hash)
    }

    /// Every manifest, oldest first.
    pub fn manifests(&self) -> impl Iterator<Item = &Manifest> {
        self.by_version.values()
    }

    /// The transitions from `from` to the current manifest, oldest first (each element is
    /// the child manifest of one transition), found by following parent references back
    /// from the current manifest. `None` when `from` is not on that chain; empty when
    /// `from` is the current manifest.
    pub fn path_from(&self, from: &SchemaRef) -> Option<Vec<&Manifest>> {
        let mut at = self.current()?;
        let mut path = Vec::new();
        loop {
            if at.schema_ref() == *from {
                path.reverse();
                return Some(path);
            }
            path.push(at);
            at = self.get(&at.parent_schema?)?;
        }
    }
}

/// A schema reference presented to connect: the fresh sentinel or an exact reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresentedSchema {
    /// `{"version":0,"hash":""}`: nothing installed.
    Fresh,
    /// An installed manifest's exact reference.
    Exact(SchemaRef),
}

impl PresentedSchema {
    /// Validates a presented `{version, hash}` object. Anything but the exact fresh sentinel
    /// or a positive version (at most 2^53−1) with 64 lowercase hex characters is malformed.
    pub fn from_json(value: &Json) -> Result<PresentedSchema> {
        let bad = |reason| Error::InvalidSchemaReference { reason };
        let Json::Object(members) = value else {
            return Err(bad("schema reference must be an object"));
        };
        if members.len() != 2 {
            return Err(bad("schema reference has exactly version and hash"));
        }
        let (Some(Json::Number(version)), Some(Json::String(hash))) =
            (value.get("version"), value.get("hash"))
        else {
            return Err(bad("version must be an integer and hash a string"));
        };
        if version == "0" {
            return if hash.is_empty() {
                Ok(PresentedSchema::Fresh)
            } else {
                Err(bad("version 0 is only valid in the fresh sentinel"))
            };
        }
        if hash.is_empty() {
            return Err(bad("an empty hash is only valid in the fresh sentinel"));
        }
        if !version.bytes().all(|b| b.is_ascii_digit())
            || version.starts_with('0')
            || version.len() > 16
        {
            return Err(bad("version must be a positive integer"));
        }
        let version: u64 = version
            .parse()
            .map_err(|_| bad("version must be a positive integer"))?;
        if version > MAX_JSON_COUNTER {
            return Err(bad("version exceeds 2^53-1"));
        }
        let hash = parse_hex32(hash)
            .map_err(|_| bad("hash must be 64 lowercase hexadecimal characters"))?;
        Ok(PresentedSchema::Exact(SchemaRef { version, hash }))
    }
}
