//! Provisioning for `synchro-server dev` and the integration tests: login roles for each
//! group role, an application owner, and a small demo schema (two tables, one multi_scope).

use anyhow::{Context, Result};
use tokio_postgres::Client;

use crate::install::quote_ident;
use crate::registry::{register, RegisterRequest};

/// Login principals created for development, one per runtime group role (the worker
/// login is created by [`ensure_worker_login`]).
pub const DEV_LOGINS: [(&str, &str); 4] = [
    ("synchro_dev_adapter", "synchro_adapter"),
    ("synchro_dev_operator", "synchro_operator"),
    ("synchro_dev_monitor", "synchro_monitor"),
    ("synchro_dev_seed", "synchro_seed"),
];

/// Creates (or keeps) a LOGIN role with `attributes` that is a member of `group`.
async fn ensure_member_login(
    admin: &Client,
    login: &str,
    attributes: &str,
    group: &str,
) -> Result<()> {
    let exists = admin
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&login])
        .await?
        .is_some();
    if !exists {
        admin
            .batch_execute(&format!(
                "CREATE ROLE {} LOGIN {attributes} NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS",
                quote_ident(login)
            ))
            .await?;
    }
    admin
        .batch_execute(&format!(
            "GRANT {} TO {}",
            quote_ident(group),
            quote_ident(login)
        ))
        .await?;
    Ok(())
}

/// Creates (or keeps) a LOGIN role that is a member of exactly `group`.
pub async fn ensure_login(admin: &Client, login: &str, group: &str) -> Result<()> {
    ensure_member_login(admin, login, "NOREPLICATION", group).await
}

/// Creates (or keeps) the capture worker login: REPLICATION, NOINHERIT, member of exactly
/// synchro_worker (spec 001).
pub async fn ensure_worker_login(admin: &Client, login: &str) -> Result<()> {
    ensure_member_login(admin, login, "REPLICATION NOINHERIT", "synchro_worker").await
}

/// Creates the demo application schema `app` owned by `app_owner`, and lets synchro_owner
/// act for that owner (needed to add triggers and publication membership).
pub async fn create_demo_schema(admin: &Client) -> Result<()> {
    admin
        .batch_execute(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'app_owner') THEN
                 CREATE ROLE app_owner NOLOGIN;
               END IF;
             END $$;
             GRANT app_owner TO synchro_owner;
             CREATE SCHEMA IF NOT EXISTS app AUTHORIZATION app_owner;
             SET ROLE app_owner;
             CREATE TABLE IF NOT EXISTS app.projects (
               id text PRIMARY KEY, name text NOT NULL, budget numeric(12,2), archived boolean NOT NULL DEFAULT false,
               updated_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE IF NOT EXISTS app.notes (
               id bigint PRIMARY KEY, project_id text NOT NULL, body text, meta jsonb, attachment bytea);
             RESET ROLE;",
        )
        .await
        .context("creating the demo schema")
}

/// Registers the demo tables (projects single_scope, notes multi_scope) as `operator`.
pub async fn register_demo(operator: &Client) -> Result<()> {
    for (relation, composition) in [("projects", "single_scope"), ("notes", "multi_scope")] {
        register(
            operator,
            &RegisterRequest::synced("app", relation, composition),
        )
        .await
        .map_err(|e| anyhow::anyhow!("registering app.{relation}: {e}"))?;
    }
    Ok(())
}
