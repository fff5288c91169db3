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
    /// The capture slot does not exist (dropped, or not on a promoted standby): changes
    /// written since may not be in any stream (issue 38).
    SlotMissing => "slot_missing",
    /// The capture slot's WAL is lost (`max_slot_wal_keep_size`).
    SlotInvalidated => "slot_invalidated",
    /// The slot is not the one whose stream was materialized: another database system, or a
    /// slot made anew that begins after what was materialized.
    LineageChanged => "lineage_changed",
}

impl std::fmt::Display for BlockReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Declares [`BlockDetail`] with its codes and [`BlockDetail::ALL`] from one list.
macro_rules! block_details {
    ($($(#[doc = $doc:literal])* $variant:ident => $code:literal,)*) => {
        /// What exactly blocked (`capture_state.blocked_detail`, and a stopped staging's
        /// `membership_functions.staging_failed_detail`): what drifted for
        /// `registered_relation_drift`, what failed for `scope_evaluation_failed`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum BlockDetail {
            $($(#[doc = $doc])* $variant,)*
        }

        impl BlockDetail {
            /// Every detail, in the CHECK constraint's order.
            pub const ALL: &'static [BlockDetail] = &[$(BlockDetail::$variant,)*];

            /// The code stored in `blocked_detail`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(BlockDetail::$variant => $code,)*
                }
            }
        }
    };
}

block_details! {
    /// A column that is neither a field nor declared server-only (nor declared by a
    /// reconfiguration in flight).
    ColumnAdded => "column_added",
    /// A registered field's column is not in the change.
    ColumnMissing => "column_missing",
    /// A registered field's column has another SQL type or modifier.
    ColumnTypeChanged => "column_type_changed",
    /// The relation has another qualified name.
    RelationRenamed => "relation_renamed",
    /// The registered relation OID is gone (dropped, or dropped and recreated).
    RelationDropped => "relation_dropped",
    /// Another replica identity.
    ReplicaIdentityChanged => "replica_identity_changed",
    /// Another primary key.
    PrimaryKeyChanged => "primary_key_changed",
    /// A membership or impact function raised an error (its SQLSTATE is recorded).
    FunctionError => "function_error",
    /// A membership or impact function (or its owner) lacks a privilege it needs: USAGE on
    /// a schema, SELECT on a projection view, EXECUTE (SQLSTATE 42501).
    InsufficientPrivilege => "insufficient_privilege",
    /// A registered function cannot be called: dropped, or its owner unknown.
    FunctionUnavailable => "function_unavailable",
    /// A membership function returned a null or blank scope, or a row it was not asked for.
    InvalidScope => "invalid_scope",
    /// A row is in more scopes than the relation's fanout bound.
    FanoutExceeded => "fanout_exceeded",
    /// An impact function named a row of another table or key type.
    ImpactInvalidRow => "impact_invalid_row",
    /// An impact function named more rows for one event than its bound.
    ImpactBoundExceeded => "impact_bound_exceeded",
    /// A registered membership or impact function's definition is no longer the one
    /// registered (`CREATE OR REPLACE` in place): it is not evaluated until re-registered.
    DefinitionChanged => "definition_changed",
}

impl BlockDetail {
    /// The detail a code names.
    pub fn parse(code: &str) -> Option<BlockDetail> {
        BlockDetail::ALL
            .iter()
            .copied()
            .find(|d| d.as_str() == code)
    }
}

/// A failed membership or impact evaluation: what failed and the SQLSTATE behind it. It
/// blocks capture with `scope_evaluation_failed` when the rule is live; a staged rule's
/// evaluation stops only its staging.
#[derive(Debug, thiserror::Error)]
#[error("capture blocked: scope_evaluation_failed ({})", .detail.as_str())]
pub(crate) struct EvaluationFailed {
    pub(crate) detail: BlockDetail,
    pub(crate) sqlstate: Option<String>,
}

impl EvaluationFailed {
    /// A failure without a database error behind it.
    pub(crate) fn new(detail: BlockDetail) -> EvaluationFailed {
        EvaluationFailed {
            detail,
            sqlstate: None,
        }
    }

    /// A database error of an evaluation: a transient one (a cancelled statement, a
    /// deadlock or serialization failure, a lost connection, a shutdown, exhausted
    /// resources) is returned as it is, so the step fails and is tried again; anything else
    /// is an evaluation failure with its SQLSTATE.
    pub(crate) fn from_db(e: tokio_postgres::Error, detail: BlockDetail) -> anyhow::Error {
        let Some(code) = e.code().map(|c| c.code().to_owned()) else {
            return e.into(); // the connection, not the function
        };
        if is_transient(&code) {
            return anyhow::Error::from(e).context(TransientEvaluation);
        }
        let detail = if code == "42501" {
            BlockDetail::InsufficientPrivilege
        } else if code == "42883" || code == "42P01" {
            BlockDetail::FunctionUnavailable
        } else {
            detail
        };
        EvaluationFailed {
            detail,
            sqlstate: Some(code),
        }
        .into()
    }
}

/// The failed evaluation in an error's chain, if any: its detail and SQLSTATE.
pub(crate) fn evaluation_failure(e: &anyhow::Error) -> Option<(BlockDetail, Option<String>)> {
    e.chain().find_map(|c| {
        c.downcast_ref::<EvaluationFailed>()
            .map(|f| (f.detail, f.sqlstate.clone()))
    })
}

/// An evaluation failed for a reason that passes (it is retried, never recorded).
#[derive(Debug, thiserror::Error)]
#[error("a membership or impact evaluation was interrupted; retrying")]
pub(crate) struct TransientEvaluation;

/// Whether a SQLSTATE names a condition that passes: class 08 (connection), 40
/// (serialization failure, deadlock), 53 (insufficient resources), 57 (cancelled,
/// shutdown), 58 (system error), and 55P03 (lock not available).
pub(crate) fn is_transient(code: &str) -> bool {
    matches!(&code[..2.min(code.len())], "08" | "40" | "53" | "57" | "58") || code == "55P03"
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
    pub(crate) detail: BlockDetail,
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
    pub(crate) detail: Option<BlockDetail>,
    /// The SQLSTATE of a database error behind the block.
    pub(crate) sqlstate: Option<String>,
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
                sqlstate: None,
                lsn,
                ordinal: None,
                decoding,
            })
        } else if let Some(f) = c.downcast_ref::<EvaluationFailed>() {
            Some(BlockSite {
                reason: BlockReason::ScopeEvaluationFailed,
                relation_id: relation.clone(),
                detail: Some(f.detail),
                sqlstate: f.sqlstate.clone(),
                lsn,
                ordinal: None,
                decoding,
            })
        } else {
            c.downcast_ref::<Drifted>().map(|d| BlockSite {
                reason: BlockReason::RegisteredRelationDrift,
                relation_id: Some(d.relation_id.clone()),
                detail: Some(d.detail),
                sqlstate: None,
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
            detail: BlockDetail::ColumnAdded,
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
        assert_eq!(site.detail, Some(BlockDetail::ColumnAdded));
        assert_eq!(site.lsn, Some(0x1_0000_0010));
        assert_eq!(site.ordinal, Some(3));
        assert!(InTransaction(0x1_0000_0010).to_string().ends_with("1/10"));
    }

    #[test]
    fn drift_details_parse_back() {
        for d in BlockDetail::ALL {
            assert_eq!(BlockDetail::parse(d.as_str()), Some(*d));
        }
        assert_eq!(BlockDetail::parse("other"), None);
    }
}
