//! The worker's heartbeat while a step runs long, and what it is doing
//! (`synchro.capture_progress`).
//!
//! A step heartbeats when it ends (`capture_state.heartbeat_at`), but one step can take
//! minutes: a staged rule evaluated over a large relation, a Class 3 change whose impact
//! function names every row of another table. Readiness then saw a stale heartbeat and
//! answered 503, and a load balancer took the server out of rotation for work that was
//! progressing. So a session of its own writes `capture_progress` about once a second:
//! the phase, relation and counts the worker last reported, and a heartbeat — but only
//! while the worker's materialization session runs a statement or is between statements of
//! its transaction, and is not waiting on a lock (a worker stuck behind a lock still goes
//! stale). Nothing is written while the worker is idle and its phase is unchanged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;

/// How often the heartbeat session looks and writes.
const BEAT: Duration = Duration::from_secs(1);

/// What the worker is doing (a `capture_progress.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Between steps.
    Idle,
    /// Applying source transactions.
    Applying,
    /// Staging a rule over a relation's rows.
    Staging,
    /// Calling an impact function for a transaction's dependency changes.
    Impacts,
    /// Evaluating membership of a transaction's rows.
    Membership,
    /// Activating a staged reconfiguration or rule.
    Activating,
    /// Copying an existing table.
    Bootstrapping,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Applying => "applying",
            Phase::Staging => "staging",
            Phase::Impacts => "impacts",
            Phase::Membership => "membership",
            Phase::Activating => "activating",
            Phase::Bootstrapping => "bootstrapping",
        }
    }
}

/// The worker's last report.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Report {
    phase: Phase,
    relation_id: Option<String>,
    done: Option<i64>,
    total: Option<i64>,
    /// Bumped on every change of phase or relation (the row's `phase_started_at`).
    epoch: u64,
}

/// The heartbeat session of one worker; stopped when dropped.
pub(super) struct Heartbeat {
    report: Arc<Mutex<Report>>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeat {
    /// Starts the heartbeat session (`url`: the worker login) watching the materialization
    /// session of backend `materialize_pid`.
    pub(super) fn start(url: &str, materialize_pid: i32) -> Heartbeat {
        let report = Arc::new(Mutex::new(Report {
            phase: Phase::Idle,
            relation_id: None,
            done: None,
            total: None,
            epoch: 0,
        }));
        let task = tokio::spawn(run(url.to_owned(), materialize_pid, report.clone()));
        Heartbeat { report, task }
    }

    /// Reports a phase (of a relation), with counts when known.
    pub(super) fn report(
        &self,
        phase: Phase,
        relation_id: Option<&str>,
        done: Option<i64>,
        total: Option<i64>,
    ) {
        let mut r = self.report.lock().expect("heartbeat report");
        if r.phase != phase || r.relation_id.as_deref() != relation_id {
            r.epoch += 1;
            r.phase = phase;
            r.relation_id = relation_id.map(str::to_owned);
        }
        r.done = done;
        r.total = total;
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(url: String, materialize_pid: i32, report: Arc<Mutex<Report>>) {
    loop {
        if let Err(e) = beat(&url, materialize_pid, &report).await {
            tracing::debug!(cause = %super::cause(&e), "capture heartbeat session failed; reconnecting");
        }
        tokio::time::sleep(BEAT * 5).await;
    }
}

/// Samples the report once a second; writes the row while one phase (other than idle) has
/// lasted since the previous sample and the worker is working, and once more when it is
/// idle again. Steps shorter than a second write nothing.
async fn beat(url: &str, materialize_pid: i32, report: &Mutex<Report>) -> Result<()> {
    let db = crate::connect_db(url).await?;
    // The write runs as synchro_worker (the login is NOINHERIT); the look at the
    // materialization session as the login itself, since pg_stat_activity shows a session's
    // state only to roles with the privileges of its user.
    db.batch_execute("SET ROLE synchro_worker").await?;
    let write = db
        .prepare(
            "UPDATE synchro.capture_progress
                SET heartbeat_at = CASE WHEN $1 THEN now() ELSE heartbeat_at END,
                    phase = $2, relation_id = $3, done = $4, total = $5,
                    phase_started_at = CASE WHEN $6 THEN now() ELSE phase_started_at END",
        )
        .await?;
    db.batch_execute("RESET ROLE").await?;
    let busy = db
        .prepare(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                             WHERE pid = $1 AND state IN ('active', 'idle in transaction')
                               AND wait_event_type IS DISTINCT FROM 'Lock')",
        )
        .await?;
    let mut written: Option<Report> = None;
    let mut previous_epoch: Option<u64> = None;
    loop {
        tokio::time::sleep(BEAT).await;
        let now = report.lock().expect("heartbeat report").clone();
        let long = now.phase != Phase::Idle && previous_epoch == Some(now.epoch);
        previous_epoch = Some(now.epoch);
        let working = long
            && db
                .query_one(&busy, &[&materialize_pid])
                .await?
                .get::<_, bool>(0);
        let back_to_idle =
            now.phase == Phase::Idle && written.as_ref().is_some_and(|w| w.phase != Phase::Idle);
        if !working && !back_to_idle {
            continue;
        }
        let new_phase = written.as_ref().map(|w| w.epoch) != Some(now.epoch);
        db.batch_execute("SET ROLE synchro_worker").await?;
        db.execute(
            &write,
            &[
                &working,
                &now.phase.as_str(),
                &now.relation_id,
                &now.done,
                &now.total,
                &new_phase,
            ],
        )
        .await?;
        db.batch_execute("RESET ROLE").await?;
        written = Some(now);
    }
}
