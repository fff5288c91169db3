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

/// A blocking condition, raised as an error so that `?` carries it to the step.
#[derive(Debug, thiserror::Error)]
#[error("capture blocked: {0}")]
pub(crate) struct Blocked(pub(crate) BlockReason);

/// The reason of the first blocking condition in an error's chain.
pub(crate) fn block_reason(e: &anyhow::Error) -> Option<BlockReason> {
    e.chain()
        .find_map(|c| c.downcast_ref::<Blocked>())
        .map(|b| b.0)
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
}
