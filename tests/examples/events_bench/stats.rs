//! Statements the server instances run, from `pg_stat_statements` (the cluster preloads
//! it): executions (`calls`) of top-level statements per login, reset before each measured
//! window. Each instance has its own adapter login, the capture worker its worker login; the
//! benchmark's own statements run as the superuser and are not counted.

use std::collections::BTreeMap;

use anyhow::Result;
use tokio_postgres::Client;

/// Statements of one login in a window, by kind.
#[derive(Clone, Copy, Debug, Default)]
pub struct Calls {
    /// The dispatcher's `synchro_changed_scopes_since` (one per notification per instance).
    pub dispatch: i64,
    /// A stream's own `synchro_changed_scopes` (its client's scopes, generation, assignment).
    pub per_client: i64,
    /// Everything else (readiness, `LISTEN`, ...).
    pub other: i64,
}

impl Calls {
    pub fn total(&self) -> i64 {
        self.dispatch + self.per_client + self.other
    }

    pub fn add(&mut self, o: &Calls) {
        self.dispatch += o.dispatch;
        self.per_client += o.per_client;
        self.other += o.other;
    }
}

/// Forgets every statement counted so far.
pub async fn reset(admin: &Client) -> Result<()> {
    admin
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await?;
    Ok(())
}

/// Statements counted since the last [`reset`] in this database, per login.
pub async fn read(admin: &Client) -> Result<BTreeMap<String, Calls>> {
    let rows = admin
        .query(
            "SELECT r.rolname::text, s.query, s.calls FROM pg_stat_statements s
               JOIN pg_roles r ON r.oid = s.userid
              WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await?;
    let mut by_login: BTreeMap<String, Calls> = BTreeMap::new();
    for r in rows {
        let (login, query, calls): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
        let c = by_login.entry(login).or_default();
        if query.contains("synchro_changed_scopes_since(") {
            c.dispatch += calls;
        } else if query.contains("synchro_changed_scopes(") {
            c.per_client += calls;
        } else {
            c.other += calls;
        }
    }
    Ok(by_login)
}
