//! The client state machine (spec 001 "Legal client state transitions"; our stand-in for the
//! referenced "State Transition Summary", see docs/client-states.md).
//!
//! States: `fresh`, `connecting`, `idle`, `pushing`, `pulling`, `rebuilding`, `migrating`,
//! `upgrade_required`, `blocked` (non-retryable local error) and `stopped`. [`TRANSITIONS`]
//! lists every legal transition exactly once; every other pair, including
//! `stopped -> pulling`, is an [`Error::IllegalTransition`], and [`StateMachine::apply`]
//! changes nothing when it rejects.

use crate::error::{Error, Result};

/// A client engine state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClientState {
    /// No schema installed and never connected.
    Fresh,
    /// A connect request is in flight.
    Connecting,
    /// Connected and quiescent; scheduling decides what runs next.
    Idle,
    /// A push is in flight.
    Pushing,
    /// A pull is in flight.
    Pulling,
    /// One or more scopes are being rebuilt.
    Rebuilding,
    /// A journaled local schema migration is being applied.
    Migrating,
    /// The server answered `unsupported` or 426; only an explicit reset connect may follow
    /// (after a 426, a client opened with an upgraded version starts again outside it).
    UpgradeRequired,
    /// A non-retryable local error; queue and local data are kept for inspection.
    Blocked,
    /// The engine is stopped; durable state is intact.
    Stopped,
}

use ClientState::*;

/// Every legal transition, once, with what causes it.
pub const TRANSITIONS: &[(ClientState, ClientState, &str)] = &[
    (Fresh, Connecting, "first connect"),
    (Fresh, Stopped, "stop before the first connect"),
    (
        Connecting,
        Fresh,
        "retryable failure before any schema is installed",
    ),
    (
        Connecting,
        Idle,
        "action none, or a retryable failure with a schema installed",
    ),
    (Connecting, Migrating, "action replace or rebuild_local"),
    (
        Connecting,
        UpgradeRequired,
        "action unsupported or HTTP 426",
    ),
    (
        Connecting,
        Blocked,
        "non-retryable error (invalid_schema_reference, inconsistent journal)",
    ),
    (Connecting, Stopped, "stop requested"),
    (
        Idle,
        Connecting,
        "reconnect (periodic, schema_mismatch or client_generation_expired seen)",
    ),
    (Idle, Pushing, "queued intent is ready"),
    (Idle, Pulling, "pull is due"),
    (
        Idle,
        Rebuilding,
        "a scope is marked for rebuild and the queue is drained",
    ),
    (Idle, Blocked, "non-retryable local error"),
    (Idle, Stopped, "stop requested"),
    (Pushing, Idle, "push finished or failed retryably"),
    (Pushing, Pulling, "push drained; pull follows push"),
    (Pushing, Rebuilding, "push drained; a marked scope rebuilds"),
    (
        Pushing,
        Connecting,
        "HTTP 422 schema_mismatch or 409 client_generation_expired",
    ),
    (Pushing, Blocked, "non-retryable error"),
    (Pushing, Stopped, "stop requested"),
    (Pulling, Idle, "pull finished or failed retryably"),
    (
        Pulling,
        Rebuilding,
        "a scope digest mismatch marked a scope for rebuild",
    ),
    (
        Pulling,
        Connecting,
        "HTTP 422 schema_mismatch or 409 client_generation_expired",
    ),
    (Pulling, Blocked, "non-retryable error"),
    (Pulling, Stopped, "stop requested"),
    (Rebuilding, Idle, "every marked scope rebuilt and verified"),
    (
        Rebuilding,
        Pushing,
        "new intent is pushed before the rebuild continues",
    ),
    (
        Rebuilding,
        Connecting,
        "HTTP 422 schema_mismatch or 409 client_generation_expired",
    ),
    (Rebuilding, Blocked, "non-retryable error"),
    (Rebuilding, Stopped, "stop requested"),
    (
        Migrating,
        Idle,
        "migration committed; nothing to push or rebuild",
    ),
    (
        Migrating,
        Pushing,
        "migration committed; push-first reconciliation under the target schema",
    ),
    (
        Migrating,
        Rebuilding,
        "migration committed; queue drained; affected scopes rebuild",
    ),
    (
        Migrating,
        Blocked,
        "journal, plan or physical schema inconsistent",
    ),
    (
        Migrating,
        Stopped,
        "stop requested (the journal is durable)",
    ),
    (
        UpgradeRequired,
        Connecting,
        "explicit schema_reset connect after an application upgrade",
    ),
    (UpgradeRequired, Stopped, "stop requested"),
    (Blocked, Stopped, "stop requested"),
    (
        Stopped,
        Connecting,
        "restart (the durable journal is read first)",
    ),
];

impl ClientState {
    /// Every state.
    pub const ALL: [ClientState; 10] = [
        Fresh,
        Connecting,
        Idle,
        Pushing,
        Pulling,
        Rebuilding,
        Migrating,
        UpgradeRequired,
        Blocked,
        Stopped,
    ];

    /// The state's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Fresh => "fresh",
            Connecting => "connecting",
            Idle => "idle",
            Pushing => "pushing",
            Pulling => "pulling",
            Rebuilding => "rebuilding",
            Migrating => "migrating",
            UpgradeRequired => "upgrade_required",
            Blocked => "blocked",
            Stopped => "stopped",
        }
    }

    /// Parses an exact state name; anything else is [`Error::UnknownState`].
    pub fn parse(name: &str) -> Result<ClientState> {
        ClientState::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or(Error::UnknownState)
    }

    /// Whether `self -> to` is in the state map.
    pub fn can_transition(self, to: ClientState) -> bool {
        TRANSITIONS.iter().any(|&(f, t, _)| f == self && t == to)
    }

    /// The state after `self -> to`, or the typed error for an unlisted transition.
    pub fn transition(self, to: ClientState) -> Result<ClientState> {
        if self.can_transition(to) {
            Ok(to)
        } else {
            Err(Error::IllegalTransition {
                from: self.as_str(),
                to: to.as_str(),
            })
        }
    }
}

/// A client's current state; [`StateMachine::apply`] is the only way to change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateMachine {
    state: ClientState,
}

impl StateMachine {
    /// Starts in `state` (a restored engine starts from its persisted state).
    pub fn new(state: ClientState) -> StateMachine {
        StateMachine { state }
    }

    /// The current state.
    pub fn state(&self) -> ClientState {
        self.state
    }

    /// Moves to `to` if the map allows it; otherwise returns the error and stays put.
    pub fn apply(&mut self, to: ClientState) -> Result<()> {
        self.state = self.state.transition(to)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unlisted_transition_is_rejected_without_change() {
        let mut legal = 0;
        for from in ClientState::ALL {
            for to in ClientState::ALL {
                let mut m = StateMachine::new(from);
                let listed = TRANSITIONS
                    .iter()
                    .filter(|&&(f, t, _)| f == from && t == to)
                    .count();
                assert!(listed <= 1, "{from:?} -> {to:?} listed twice");
                match m.apply(to) {
                    Ok(()) => {
                        assert_eq!(listed, 1);
                        assert_eq!(m.state(), to);
                        legal += 1;
                    }
                    Err(e) => {
                        assert_eq!(listed, 0, "{from:?} -> {to:?}");
                        assert_eq!(e.code(), "illegal_transition");
                        assert_eq!(m.state(), from, "a rejected transition changed the state");
                    }
                }
            }
        }
        assert_eq!(legal, TRANSITIONS.len());
        assert!(StateMachine::new(Stopped).apply(Pulling).is_err());
        assert!(StateMachine::new(UpgradeRequired).apply(Pushing).is_err());
        assert!(StateMachine::new(Blocked).apply(Pulling).is_err());
    }

    #[test]
    fn names_parse_exactly() {
        for s in ClientState::ALL {
            assert_eq!(ClientState::parse(s.as_str()).unwrap(), s);
        }
        for bad in ["Idle", "idle ", "paused", "", "upgrade-required"] {
            assert_eq!(ClientState::parse(bad).unwrap_err().code(), "unknown_state");
        }
    }

    #[test]
    fn every_state_is_reachable_and_can_stop() {
        for s in ClientState::ALL {
            assert!(
                s == Fresh || TRANSITIONS.iter().any(|&(_, t, _)| t == s),
                "{s:?} unreachable"
            );
            assert!(
                s == Stopped || s.can_transition(Stopped),
                "{s:?} cannot stop"
            );
        }
    }

    #[test]
    fn the_documented_map_is_the_code() {
        let doc = include_str!("../../docs/client-states.md");
        let rows: Vec<(String, String)> = doc
            .lines()
            .skip_while(|l| !l.starts_with("## Legal transitions"))
            .filter(|l| l.starts_with("| ") && !l.starts_with("| from"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells[1].to_owned(), cells[2].to_owned())
            })
            .collect();
        let code: Vec<(String, String)> = TRANSITIONS
            .iter()
            .map(|(f, t, _)| (f.as_str().to_owned(), t.as_str().to_owned()))
            .collect();
        assert_eq!(rows, code);
    }
}
