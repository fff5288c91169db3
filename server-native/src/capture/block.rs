//! Why capture stops: the bounded reason codes `synchro.capture_state.blocked_reason` holds,
//! and the error that carries one from wherever a condition is detected up to the step that
//! records it (nothing is applied or acknowledged once it is raised).
//!
//! The set of variants is exactly the set the column's CHECK constraint allows;
//! `tests/capture.rs::block_reasons_are_exactly_what_the_check_constraint_allows` compares
//! them with the constraint of an installed database.

/// Declares [`BlockReason`] with its codes, and [`BlockReason::ALL`] from the same list, so
/// that no variant can be missing from it.
macro_rules! block_reasons {
    ($($(#[doc = $doc:literal])* $variant:ident => $code:literal,)*) => {
        /// A bounded reason code for blocked capture (never row data).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum BlockReason {
            $($(#[doc = $doc])* $variant,)*
        }

        impl BlockReason {
            /// Every reason, in the CHECK constraint's order.
            pub const ALL: &'static [BlockReason] = &[$(BlockReason::$variant,)*];

            /// The code stored in `blocked_reason`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(BlockReason::$variant => $code,)*
                }
            }
        }
    };
}

block_reasons! {
    /// A registered relation no longer matches its registration (renamed, moved, recreated,
    /// another replica identity, a column missing), or its bootstrap lock found it changed.
    RegisteredRelationDrift => "registered_relation_drift",
    /// A source value (or a key) that its portable type cannot hold.
    UnrepresentableValue => "unrepresentable_value",
    /// A logical-slot message (or a fence message) that cannot be decoded.
    DecodeError => "decode_error",
    /// A TRUNCATE of a registered relation.
    TruncateUnsupported => "truncate_unsupported",
    /// A membership or impact function failed, named something it may not, or exceeded a
    /// bound (spec 003's reason).
    ScopeEvaluationFailed => "scope_evaluation_failed",
    /// Older reason for a failed membership evaluation; no longer written (replaced by
    /// `ScopeEvaluationFailed`) but still allowed by the CHECK constraint.
    MembershipEvaluationFailed => "membership_evaluation_failed",
    /// Older reason for an exceeded fanout bound; no longer written (replaced by
    /// `ScopeEvaluationFailed`) but still allowed by the CHECK constraint.
    MembershipBoundExceeded => "membership_bound_exceeded",
    /// A change of an active relation without the fence its source trigger emits first.
    MissingFence => "missing_fence",
}

impl std::fmt::Display for BlockReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What drifted, for `registered_relation_drift` (`capture_state.blocked_detail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriftDetail {
    /// A column that is neither a field nor declared server-only (nor declared by a
    /// reconfiguration in flight).
    ColumnAdded,
    /// A registered field's column is not in the change.
    ColumnMissing,
    /// A registered field's column has another SQL type or modifier.
    ColumnTypeChanged,
    /// The relation has another qualified name.
    RelationRenamed,
    /// The registered relation OID is gone (dropped, or dropped and recreated).
    RelationDropped,
    /// Another replica identity.
    ReplicaIdentityChanged,
    /// Another primary key.
    PrimaryKeyChanged,
}

impl DriftDetail {
    /// Every detail, in the CHECK constraint's order.
    pub const ALL: &'static [DriftDetail] = &[
        DriftDetail::ColumnAdded,
        DriftDetail::ColumnMissing,
        DriftDetail::ColumnTypeChanged,
        DriftDetail::RelationRenamed,
        DriftDetail::RelationDropped,
        DriftDetail::ReplicaIdentityChanged,
        DriftDetail::PrimaryKeyChanged,
    ];

    /// The code stored in `blocked_detail`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DriftDetail::ColumnAdded => "column_added",
            DriftDetail::ColumnMissing => "column_missing",
            DriftDetail::ColumnTypeChanged => "column_type_changed",
            DriftDetail::RelationRenamed => "relation_renamed",
            DriftDetail::RelationDropped => "relation_dropped",
            DriftDetail::ReplicaIdentityChanged => "replica_identity_changed",
            DriftDetail::PrimaryKeyChanged => "primary_key_changed",
        }
    }

    /// The detail a code names.
    pub fn parse(code: &str) -> Option<DriftDetail> {
        DriftDetail::ALL
            .iter()
            .copied()
            .find(|d| d.as_str() == code)
    }
}

/// A blocking condition, raised as an error so that `?` carries it to the step.
#[derive(Debug, thiserror::Error)]
#[error("capture blocked: {0}")]
pub(crate) struct Blocked(pub(crate) BlockReason);

/// Drift of one registered relation, found at a change (its ordinal among the source
/// transaction's changes of registered relations) or in the catalog (no ordinal).
#[derive(Debug, thiserror::Error)]
#[error("capture blocked: registered_relation_drift ({})", .detail.as_str())]
pub(crate) struct Drifted {
    pub(crate) relation_id: String,
    pub(crate) detail: DriftDetail,
    pub(crate) ordinal: Option<i32>,
}

/// The source transaction (commit LSN) an error was raised in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InTransaction(pub(crate) u64);

impl std::fmt::Display for InTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "in the source transaction committed at {:X}/{:X}",
            self.0 >> 32,
            self.0 as u32
        )
    }
}

/// The registered relation (relation ID) a change being decoded belongs to.
#[derive(Debug, Clone)]
pub(crate) struct InRelation(pub(crate) String);

impl std::fmt::Display for InRelation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "in a change of relation {}", self.0)
    }
}

/// Raised while decoding a source transaction (not while applying it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decoding;

impl std::fmt::Display for Decoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("decoding a source transaction")
    }
}

/// Where and why capture blocks, as `capture_state` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockSite {
    pub(crate) reason: BlockReason,
    pub(crate) relation_id: Option<String>,
    pub(crate) detail: Option<DriftDetail>,
    pub(crate) lsn: Option<u64>,
    pub(crate) ordinal: Option<i32>,
    /// Found while decoding a source transaction's changes.
    pub(crate) decoding: bool,
}

/// The first blocking condition in an error's chain, with where it was found.
pub(crate) fn block_site(e: &anyhow::Error) -> Option<BlockSite> {
    let lsn = e.downcast_ref::<InTransaction>().map(|t| t.0);
    let relation = e.downcast_ref::<InRelation>().map(|r| r.0.clone());
    let decoding = e.downcast_ref::<Decoding>().is_some();
    e.chain().find_map(|c| {
        if let Some(b) = c.downcast_ref::<Blocked>() {
            Some(BlockSite {
                reason: b.0,
                relation_id: relation.clone(),
                detail: None,
                lsn,
                ordinal: None,
                decoding,
            })
        } else {
            c.downcast_ref::<Drifted>().map(|d| BlockSite {
                reason: BlockReason::RegisteredRelationDrift,
                relation_id: Some(d.relation_id.clone()),
                detail: Some(d.detail),
                lsn,
                ordinal: d.ordinal,
                decoding,
            })
        }
    })
}

/// The reason of the first blocking condition in an error's chain.
#[cfg(test)]
pub(crate) fn block_reason(e: &anyhow::Error) -> Option<BlockReason> {
    block_site(e).map(|s| s.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_bounded() {
        let codes: std::collections::BTreeSet<&str> =
            BlockReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(codes.len(), BlockReason::ALL.len());
        for code in codes {
            assert!(code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
        }
    }

    #[test]
    fn a_blocked_error_is_found_through_context() {
        let e = anyhow::Error::from(Blocked(BlockReason::MissingFence)).context("applying");
        assert_eq!(block_reason(&e), Some(BlockReason::MissingFence));
        assert_eq!(
            anyhow::Error::from(Blocked(BlockReason::MissingFence)).to_string(),
            "capture blocked: missing_fence"
        );
        assert_eq!(block_reason(&anyhow::anyhow!("other")), None);
    }

    #[test]
    fn a_drift_carries_its_relation_detail_and_transaction() {
        let e = anyhow::Error::from(Drifted {
            relation_id: "rel_1".into(),
            detail: DriftDetail::ColumnAdded,
            ordinal: Some(3),
        })
        .context("decoding")
        .context(InTransaction(0x1_0000_0010));
        let blocked = anyhow::Error::from(Blocked(BlockReason::TruncateUnsupported))
            .context(InRelation("rel_2".into()))
            .context("applying")
            .context(InTransaction(7));
        let site = block_site(&blocked).expect("a block");
        assert_eq!(
            (site.reason, site.relation_id.as_deref(), site.lsn),
            (BlockReason::TruncateUnsupported, Some("rel_2"), Some(7))
        );
        let site = block_site(&e).expect("a block");
        assert_eq!(site.reason, BlockReason::RegisteredRelationDrift);
        assert_eq!(site.relation_id.as_deref(), Some("rel_1"));
        assert_eq!(site.detail, Some(DriftDetail::ColumnAdded));
        assert_eq!(site.lsn, Some(0x1_0000_0010));
        assert_eq!(site.ordinal, Some(3));
        assert!(InTransaction(0x1_0000_0010).to_string().ends_with("1/10"));
    }

    #[test]
    fn drift_details_parse_back() {
        for d in DriftDetail::ALL {
            assert_eq!(DriftDetail::parse(d.as_str()), Some(*d));
        }
        assert_eq!(DriftDetail::parse("other"), None);
    }
}
