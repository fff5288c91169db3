//! The enums the store keeps as text, one definition each, with the exact strings SQLite
//! holds (the same strings the columns held before they were typed, so no data changes).
//! Each list equals the `CHECK` list of its column in [`super::schema::V1`] (tested there);
//! the outcome status has no `CHECK` and is the wire's `status`.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use synchro_protocol::wire::Outcome;

macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// Every value, in the order of the column's `CHECK` list.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The stored (and, where it is one, wire) spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value spelled `text`.
            pub fn parse(text: &str) -> Option<$name> {
                match text {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl FromSql for $name {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<$name> {
                let text = value.as_str()?;
                $name::parse(text).ok_or_else(|| {
                    FromSqlError::Other(concat!("not a stored ", stringify!($name)).into())
                })
            }
        }
    };
}

text_enum! {
    /// Where a queued mutation is in its life: pending until its outcome is stored, then
    /// the outcome's status for ever.
    MutationState {
        /// Not sent yet, or sent without a stored outcome.
        Pending = "pending",
        /// The server applied it.
        Applied = "applied",
        /// A newer write got there first.
        Conflict = "conflict",
        /// Refused for ever.
        RejectedTerminal = "rejected_terminal",
    }
}

text_enum! {
    /// The status of a stored outcome (the wire's `status`).
    OutcomeStatus {
        /// The write happened.
        Applied = "applied",
        /// A newer write got there first.
        Conflict = "conflict",
        /// Refused for ever.
        RejectedTerminal = "rejected_terminal",
    }
}

text_enum! {
    /// A durable migration journal's phase (spec 000 "Durable Migration State").
    Phase {
        /// Persisted, its DDL transaction not committed yet.
        Pending = "pending",
        /// The DDL committed; push and the rebuilds of its scopes may still be due.
        Committed = "committed",
    }
}

text_enum! {
    /// What a journaled migration does to the scopes.
    MigrationAction {
        /// Every scope keeps its rows (a replacement cursor, or a rebuild when it gets none).
        Replace = "replace",
        /// The affected scopes rebuild.
        RebuildLocal = "rebuild_local",
    }
}

impl OutcomeStatus {
    /// The status of `outcome`.
    pub fn of(outcome: &Outcome) -> OutcomeStatus {
        match outcome {
            Outcome::Applied { .. } => OutcomeStatus::Applied,
            Outcome::Conflict { .. } => OutcomeStatus::Conflict,
            Outcome::Rejected { .. } => OutcomeStatus::RejectedTerminal,
        }
    }
}

impl From<OutcomeStatus> for MutationState {
    fn from(s: OutcomeStatus) -> MutationState {
        match s {
            OutcomeStatus::Applied => MutationState::Applied,
            OutcomeStatus::Conflict => MutationState::Conflict,
            OutcomeStatus::RejectedTerminal => MutationState::RejectedTerminal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_spelling_reads_back() {
        for s in MutationState::ALL {
            assert_eq!(MutationState::parse(s.as_str()), Some(*s));
        }
        for s in OutcomeStatus::ALL {
            assert_eq!(OutcomeStatus::parse(s.as_str()), Some(*s));
            assert_eq!(MutationState::from(*s).as_str(), s.as_str());
        }
        for p in Phase::ALL {
            assert_eq!(Phase::parse(p.as_str()), Some(*p));
        }
        for o in synchro_protocol::wire::Operation::ALL {
            assert_eq!(
                synchro_protocol::wire::Operation::parse(o.as_str()),
                Some(o)
            );
        }
        assert_eq!(MutationState::parse("Pending"), None);
    }
}
