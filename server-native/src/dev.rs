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
    grant_role_once(admin, group, login).await
}

/// `GRANT group TO member` unless it is already granted (a repeated grant makes
/// PostgreSQL emit a NOTICE, and start-up must leave the operator's log quiet).
async fn grant_role_once(admin: &Client, group: &str, member: &str) -> Result<()> {
    if !is_member(admin, group, member).await? {
        admin
            .batch_execute(&format!(
                "GRANT {} TO {}",
                quote_ident(group),
                quote_ident(member)
            ))
            .await?;
    }
    Ok(())
}

/// Lets the connected login `SET ROLE role` unless it already may: a superuser may; a
/// CREATEROLE login that is not (a managed service's database owner) grants itself the role,
/// which from PostgreSQL 16 on it administers without being able to act as it.
async fn ensure_can_set_role(admin: &Client, role: &str) -> Result<()> {
    let row = admin
        .query_one(
            "SELECT rolsuper OR CASE WHEN current_setting('server_version_num')::int >= 160000
                                     THEN pg_has_role(current_user, $1::text, 'SET')
                                     ELSE pg_has_role(current_user, $1::text, 'MEMBER') END,
                    current_setting('server_version_num')::int >= 160000
               FROM pg_roles WHERE rolname = current_user",
            &[&role],
        )
        .await?;
    if row.get::<_, bool>(0) {
        return Ok(());
    }
    let options = if row.get::<_, bool>(1) {
        " WITH SET TRUE"
    } else {
        ""
    };
    admin
        .batch_execute(&format!(
            "GRANT {} TO CURRENT_USER{options}",
            quote_ident(role)
        ))
        .await
        .with_context(|| format!("letting this login act as {role}"))
}

async fn is_member(admin: &Client, group: &str, member: &str) -> Result<bool> {
    Ok(admin
        .query_opt(
            "SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
               JOIN pg_roles r ON r.oid = m.member WHERE g.rolname = $1 AND r.rolname = $2",
            &[&group, &member],
        )
        .await?
        .is_some())
}

/// Creates (or keeps) a LOGIN role that is a member of exactly `group`.
pub async fn ensure_login(admin: &Client, login: &str, group: &str) -> Result<()> {
    ensure_member_login(admin, login, "NOREPLICATION", group).await
}

/// Gives every dev login (the runtime logins and the worker) `password`: what `dev
/// --database-url` does when its login is not a superuser, so that each role has sessions
/// of its own ([`with_login`]).
pub async fn set_passwords(admin: &Client, password: &str) -> Result<()> {
    let logins = DEV_LOGINS
        .iter()
        .map(|(login, _)| *login)
        .chain(["synchro_dev_worker"]);
    // Sent as a SCRAM verifier, never the password itself (a statement log would show it).
    let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
    for login in logins {
        admin
            .batch_execute(&format!(
                "ALTER ROLE {} PASSWORD '{}'",
                quote_ident(login),
                verifier.replace('\'', "''")
            ))
            .await
            .with_context(|| format!("setting the password of {login}"))?;
    }
    Ok(())
}

/// The connection string `url` (URL or `key=value` form) as `user` with `password`: the same
/// server, database and TLS settings.
pub fn with_login(url: &str, user: &str, password: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let encode = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let joiner = if url.contains('?') { '&' } else { '?' };
        format!(
            "{url}{joiner}user={}&password={}",
            encode(user),
            encode(password)
        )
    } else {
        let quote = |s: &str| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"));
        format!("{url} user={} password={}", quote(user), quote(password))
    }
}

/// Creates (or keeps) the capture worker login: REPLICATION, NOINHERIT, member of exactly
/// synchro_worker (spec 001).
pub async fn ensure_worker_login(admin: &Client, login: &str) -> Result<()> {
    ensure_member_login(admin, login, "REPLICATION NOINHERIT", "synchro_worker")
        .await
        .map_err(|e| {
            e.context(format!(
                "creating the capture worker's login (this login must be able to give it REPLICATION: {})",
                crate::preflight::REPLICATION_GRANT
            ))
        })
}

/// Whether the catalog query `sql` returns a row.
async fn exists(admin: &Client, sql: &str) -> Result<bool> {
    admin
        .query_opt(sql, &[])
        .await
        .map(|r| r.is_some())
        .context("reading the catalog")
}

/// Creates the demo application schema `app` owned by `app_owner`, and lets synchro_owner
/// act for that owner (needed to add triggers and publication membership). Whatever exists
/// already is kept, without DDL that would make PostgreSQL emit a NOTICE.
pub async fn create_demo_schema(admin: &Client) -> Result<()> {
    if !exists(admin, "SELECT 1 FROM pg_roles WHERE rolname = 'app_owner'").await? {
        admin.batch_execute("CREATE ROLE app_owner NOLOGIN").await?;
    }
    grant_role_once(admin, "app_owner", "synchro_owner").await?;
    ensure_can_set_role(admin, "app_owner").await?;
    if !exists(admin, "SELECT 1 FROM pg_namespace WHERE nspname = 'app'").await? {
        admin
            .batch_execute("CREATE SCHEMA app AUTHORIZATION app_owner")
            .await?;
    }
    let mut ddl = String::from("SET ROLE app_owner;");
    if !exists(
        admin,
        "SELECT 1 FROM pg_class WHERE oid = to_regclass('app.projects')",
    )
    .await?
    {
        ddl.push_str(
            "CREATE TABLE app.projects (
               id text PRIMARY KEY, name text NOT NULL, budget numeric(12,2), archived boolean NOT NULL DEFAULT false,
               updated_at timestamptz NOT NULL DEFAULT now());",
        );
    }
    if !exists(
        admin,
        "SELECT 1 FROM pg_class WHERE oid = to_regclass('app.notes')",
    )
    .await?
    {
        ddl.push_str(
            "CREATE TABLE app.notes (
               id bigint PRIMARY KEY, project_id text NOT NULL, body text, meta jsonb, attachment bytea);",
        );
    }
    ddl.push_str("RESET ROLE;");
    admin
        .batch_execute(&ddl)
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

/// The task board of the web demo (`web-demo/`): `app.tasks` beside `app.projects` and
/// `app.notes`, each with a membership rule putting every row in the scope `board:demo`, a
/// shared scope (every user holds it, so every user reads and writes all three) declared
/// portable (a seed of it can be exported). A task's title is at
/// most 200 characters (a CHECK constraint: a longer one pushed is refused for good,
/// `rejected_terminal`, which the demo shows). `admin` creates the
/// table and the `rules` schema; `operator` registers, writes the rules and grants. What
/// exists already is kept (a rule is registered once).
pub async fn create_board(admin: &Client, operator: &Client) -> Result<()> {
    if !exists(
        admin,
        "SELECT 1 FROM pg_class WHERE oid = to_regclass('app.tasks')",
    )
    .await?
    {
        admin
            .batch_execute(
                "SET ROLE app_owner;
                 CREATE TABLE app.tasks (
                   id text PRIMARY KEY, project_id text NOT NULL,
                   title text NOT NULL CONSTRAINT tasks_title_length CHECK (length(title) <= 200),
                   done boolean NOT NULL DEFAULT false, assignee text, position integer NOT NULL DEFAULT 0,
                   updated_at timestamptz NOT NULL DEFAULT now());
                 RESET ROLE;",
            )
            .await
            .context("creating app.tasks")?;
    }
    register(
        operator,
        &RegisterRequest::synced("app", "tasks", "single_scope"),
    )
    .await
    .map_err(|e| anyhow::anyhow!("registering app.tasks: {e}"))?;
    if !exists(admin, "SELECT 1 FROM pg_namespace WHERE nspname = 'rules'").await? {
        let superuser = exists(
            admin,
            "SELECT 1 FROM pg_roles WHERE rolname = current_user AND rolsuper",
        )
        .await?;
        let (who, sql) = if superuser {
            (
                admin,
                "CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
                 GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
            )
        } else {
            // A database owner that is not a superuser may not act as the operator login
            // (and should not: with REPLICATION it would then count as a second replication
            // login of a synchro group): the operator creates the schema itself.
            let database: String = admin
                .query_one("SELECT current_database()", &[])
                .await?
                .get(0);
            admin
                .batch_execute(&format!(
                    "GRANT CREATE ON DATABASE {} TO synchro_dev_operator",
                    quote_ident(&database)
                ))
                .await?;
            (
                operator,
                "CREATE SCHEMA rules; GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
            )
        };
        who.batch_execute(sql)
            .await
            .context("creating the rules schema")?;
    }
    for (relation, function, key) in [
        ("projects", "board_projects", "text"),
        ("tasks", "board_tasks", "text"),
        ("notes", "board_notes", "bigint"),
    ] {
        let registered = operator
            .query_opt(
                "SELECT 1 FROM pg_proc WHERE proname = $1 AND pronamespace = 'rules'::regnamespace",
                &[&function],
            )
            .await?
            .is_some();
        if registered {
            continue;
        }
        operator
            .batch_execute(&format!(
                "CREATE FUNCTION rules.{function}(p_id {key}) RETURNS SETOF text LANGUAGE sql STABLE
                 BEGIN ATOMIC
                   SELECT 'board:demo' FROM synchro_projection.\"app.{relation}\" WHERE id = p_id;
                 END;
                 REVOKE EXECUTE ON FUNCTION rules.{function}({key}) FROM PUBLIC;
                 GRANT EXECUTE ON FUNCTION rules.{function}({key}) TO synchro_worker;
                 SELECT synchro.synchro_register_membership_function('app', '{relation}', 'rules.{function}({key})');"
            ))
            .await
            .with_context(|| format!("the membership rule of app.{relation}"))?;
    }
    operator
        .batch_execute(
            "SELECT synchro.synchro_add_shared_scope('board:demo');
             SELECT synchro.synchro_declare_portable_scope('board:demo');",
        )
        .await
        .context("sharing board:demo")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::with_login;

    #[test]
    fn with_login_changes_only_the_login_in_both_forms() {
        for url in [
            "postgres://owner:secret@db.example.com:6543/app?sslmode=require",
            "postgresql://owner@db.example.com:6543/app",
            "host=db.example.com port=6543 user=owner password='sec ret' dbname=app sslmode=require",
        ] {
            let t = crate::pgconn::parse(&with_login(url, "synchro_dev_adapter", "p'w\\d&x"))
                .unwrap();
            assert_eq!(t.config.get_user(), Some("synchro_dev_adapter"), "{url}");
            assert_eq!(t.config.get_password(), Some(&b"p'w\\d&x"[..]), "{url}");
            assert_eq!(t.config.get_dbname(), Some("app"), "{url}");
            assert_eq!(t.config.get_ports(), &[6543], "{url}");
        }
    }
}
