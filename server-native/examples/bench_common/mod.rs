//! The stack the capture and retention benchmarks share: a throwaway cluster with synchro
//! installed, and `app.items` registered with one scope per owner.

use anyhow::Result;
use synchro_server::pg_harness::TempCluster;
use synchro_server::registry::{register, RegisterRequest};
use synchro_server::{connect_db, dev, install, publish};
use tokio_postgres::Client;

/// A throwaway cluster with a database `bench`, synchro installed, the dev logins, an `app`
/// schema whose owner runs `app_sql` (the tables and their rows), and a `rules` schema for
/// the operator's membership functions. Returns the cluster and a superuser session.
pub async fn bench_database(app_sql: &str) -> Result<(TempCluster, Client)> {
    let cluster = TempCluster::start()?;
    connect_db(&cluster.admin_url())
        .await?
        .batch_execute("CREATE DATABASE bench")
        .await?;
    let mut admin = connect_db(&cluster.url("postgres", "bench")).await?;
    install::install(&mut admin).await?;
    for (login, group) in dev::DEV_LOGINS {
        dev::ensure_login(&admin, login, group).await?;
    }
    dev::ensure_worker_login(&admin, "synchro_dev_worker").await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE app_owner NOLOGIN; GRANT app_owner TO synchro_owner;
             CREATE SCHEMA app AUTHORIZATION app_owner;
             SET ROLE app_owner;
             {app_sql}
             RESET ROLE;
             CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;"
        ))
        .await?;
    Ok((cluster, admin))
}

/// Registers `app.items` (with an `owner` column) with the rule `user:<owner>` and publishes.
pub async fn register_items_by_owner(op: &mut Client) -> Result<()> {
    register(op, &RegisterRequest::synced("app", "items", "multi_scope"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    op.batch_execute(
        "CREATE FUNCTION rules.item_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'user:' || owner FROM synchro_projection.\"app.items\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.item_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.item_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'items', 'rules.item_scopes(bigint)');",
    )
    .await?;
    publish::publish(op).await?;
    Ok(())
}
