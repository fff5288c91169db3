//! `synchro-server install`: the six group roles of spec 001 and the versioned, checked-in
//! migrations of the fixed `synchro` schema, recorded in a ledger.
//!
//! Roles are cluster-wide, so they are created when missing and always forced to exactly
//! their attributes. Migrations run in order, each in one transaction; an applied migration
//! whose file changed, or a ledger newer than this binary, refuses to run.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use tokio_postgres::Client;

/// The fixed group roles (spec 001 "PostgreSQL schema and authorization").
pub const ROLES: [&str; 6] = [
    "synchro_owner",
    "synchro_adapter",
    "synchro_seed",
    "synchro_monitor",
    "synchro_operator",
    "synchro_worker",
];

/// The attributes every group role has, exactly.
pub const ROLE_ATTRIBUTES: &str =
    "NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOREPLICATION";

/// One checked-in migration.
pub struct Migration {
    /// Ledger version (1, 2, ...).
    pub version: i32,
    /// File name.
    pub name: &'static str,
    /// SQL text.
    pub sql: &'static str,
}

/// Every migration, in order. Add new ones at the end; never edit an applied one.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_install.sql",
        sql: include_str!("../migrations/0001_install.sql"),
    },
    Migration {
        version: 2,
        name: "0002_assignment_function.sql",
        sql: include_str!("../migrations/0002_assignment_function.sql"),
    },
    Migration {
        version: 3,
        name: "0003_capture.sql",
        sql: include_str!("../migrations/0003_capture.sql"),
    },
    Migration {
        version: 4,
        name: "0004_membership.sql",
        sql: include_str!("../migrations/0004_membership.sql"),
    },
    Migration {
        version: 5,
        name: "0005_pull.sql",
        sql: include_str!("../migrations/0005_pull.sql"),
    },
    Migration {
        version: 6,
        name: "0006_rebuild.sql",
        sql: include_str!("../migrations/0006_rebuild.sql"),
    },
    Migration {
        version: 7,
        name: "0007_bootstrap.sql",
        sql: include_str!("../migrations/0007_bootstrap.sql"),
    },
    Migration {
        version: 8,
        name: "0008_retention.sql",
        sql: include_str!("../migrations/0008_retention.sql"),
    },
    Migration {
        version: 9,
        name: "0009_readiness.sql",
        sql: include_str!("../migrations/0009_readiness.sql"),
    },
    Migration {
        version: 10,
        name: "0010_events.sql",
        sql: include_str!("../migrations/0010_events.sql"),
    },
    Migration {
        version: 11,
        name: "0011_projection_key_index.sql",
        sql: include_str!("../migrations/0011_projection_key_index.sql"),
    },
    Migration {
        version: 12,
        name: "0012_dependencies.sql",
        sql: include_str!("../migrations/0012_dependencies.sql"),
    },
    Migration {
        version: 13,
        name: "0013_membership_reevaluation.sql",
        sql: include_str!("../migrations/0013_membership_reevaluation.sql"),
    },
    Migration {
        version: 14,
        name: "0014_scope_membership_generation.sql",
        sql: include_str!("../migrations/0014_scope_membership_generation.sql"),
    },
    Migration {
        version: 15,
        name: "0015_fences.sql",
        sql: include_str!("../migrations/0015_fences.sql"),
    },
    Migration {
        version: 16,
        name: "0016_staged_backfill.sql",
        sql: include_str!("../migrations/0016_staged_backfill.sql"),
    },
    Migration {
        version: 17,
        name: "0017_staged_dependencies.sql",
        sql: include_str!("../migrations/0017_staged_dependencies.sql"),
    },
    Migration {
        version: 18,
        name: "0018_owner_privileges.sql",
        sql: include_str!("../migrations/0018_owner_privileges.sql"),
    },
    Migration {
        version: 19,
        name: "0019_staged_first_rule.sql",
        sql: include_str!("../migrations/0019_staged_first_rule.sql"),
    },
    Migration {
        version: 20,
        name: "0020_manifest_activation.sql",
        sql: include_str!("../migrations/0020_manifest_activation.sql"),
    },
    Migration {
        version: 21,
        name: "0021_scope_keys.sql",
        sql: include_str!("../migrations/0021_scope_keys.sql"),
    },
    Migration {
        version: 22,
        name: "0022_push.sql",
        sql: include_str!("../migrations/0022_push.sql"),
    },
    Migration {
        version: 23,
        name: "0023_stream_watermark.sql",
        sql: include_str!("../migrations/0023_stream_watermark.sql"),
    },
    Migration {
        version: 24,
        name: "0024_quiet_projection_index.sql",
        sql: include_str!("../migrations/0024_quiet_projection_index.sql"),
    },
    Migration {
        version: 25,
        name: "0025_unrepresentable_values.sql",
        sql: include_str!("../migrations/0025_unrepresentable_values.sql"),
    },
    Migration {
        version: 26,
        name: "0026_rebuild_session_cap.sql",
        sql: include_str!("../migrations/0026_rebuild_session_cap.sql"),
    },
];

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// What an install run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// Versions applied by this run (empty when already current).
    pub applied: Vec<i32>,
    /// The ledger's version afterwards.
    pub version: i32,
}

/// Creates or corrects the group roles. Needs a superuser or CREATEROLE connection.
pub async fn ensure_roles(db: &Client) -> Result<()> {
    for role in ROLES {
        let exists = db
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
            .await?
            .is_some();
        if !exists {
            db.batch_execute(&format!("CREATE ROLE {role} {ROLE_ATTRIBUTES}"))
                .await
                .with_context(|| format!("creating role {role}"))?;
        }
        db.batch_execute(&format!("ALTER ROLE {role} {ROLE_ATTRIBUTES}"))
            .await?;
    }
    // No runtime group may be a member of the owner or of another runtime group.
    let bad: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
               JOIN pg_roles r ON r.oid = m.member
              WHERE g.rolname = ANY($1) AND r.rolname = ANY($1)",
            &[&ROLES.as_slice()],
        )
        .await?
        .get(0);
    if bad > 0 {
        bail!("a synchro group role is a member of another synchro group role; fix the memberships first");
    }
    Ok(())
}

/// Installs or upgrades the `synchro` schema in the connected database.
pub async fn install(db: &mut Client) -> Result<InstallReport> {
    install_to(db, None).await
}

/// Installs or upgrades up to migration `target` (all when `None`); used to prove that a
/// database upgraded step by step equals a fresh install.
pub async fn install_to(db: &mut Client, target: Option<i32>) -> Result<InstallReport> {
    ensure_roles(db).await?;
    let database: String = db.query_one("SELECT current_database()", &[]).await?.get(0);
    // Publications need CREATE on the database; the owner creates the capture publication.
    db.batch_execute(&format!(
        "GRANT CREATE ON DATABASE {} TO synchro_owner",
        quote_ident(&database)
    ))
    .await?;
    let schema_exists = db
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = 'synchro'", &[])
        .await?
        .is_some();
    let mut applied_versions: Vec<(i32, String)> = Vec::new();
    if schema_exists {
        let ledger = db
            .query_one(
                "SELECT to_regclass('synchro.schema_migrations') IS NOT NULL",
                &[],
            )
            .await?
            .get::<_, bool>(0);
        if !ledger {
            bail!("schema synchro exists but has no migration ledger: it was not installed by synchro-server");
        }
        for row in db
            .query(
                "SELECT version, sha256 FROM synchro.schema_migrations ORDER BY version",
                &[],
            )
            .await?
        {
            applied_versions.push((row.get(0), row.get(1)));
        }
    }
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    for (version, sha) in &applied_versions {
        match MIGRATIONS.iter().find(|m| m.version == *version) {
            None if *version > known => bail!(
                "the database is at synchro schema version {version}, newer than this binary knows ({known}); upgrade synchro-server"
            ),
            None => bail!("the ledger records an unknown migration version {version}"),
            Some(m) if sha256_hex(m.sql) != *sha => bail!(
                "migration {} differs from the one applied to this database; applied migrations are immutable",
                m.name
            ),
            Some(_) => {}
        }
    }
    let mut applied = Vec::new();
    for m in MIGRATIONS
        .iter()
        .filter(|m| target.is_none_or(|t| m.version <= t))
    {
        if applied_versions.iter().any(|(v, _)| *v == m.version) {
            continue;
        }
        let tx = db.transaction().await?;
        tx.batch_execute(m.sql)
            .await
            .map_err(|e| anyhow::anyhow!("migration {} failed: {}", m.name, describe(&e)))?;
        tx.execute(
            "INSERT INTO synchro.schema_migrations (version, name, sha256) VALUES ($1, $2, $3)",
            &[&m.version, &m.name, &sha256_hex(m.sql)],
        )
        .await?;
        tx.commit().await?;
        applied.push(m.version);
    }
    Ok(InstallReport {
        applied,
        version: target.unwrap_or(known).min(known),
    })
}

/// `"name"` with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A database error's message and SQLSTATE (tokio-postgres displays only "db error").
/// A database error for a log line: the SQLSTATE only, since a server message can quote a
/// value (`invalid input syntax for type bigint: "…"`).
pub fn describe_for_log(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("database error (SQLSTATE {})", d.code().code()),
        None => e.to_string(),
    }
}

/// A database error for an operator's command output: message and SQLSTATE.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} (SQLSTATE {})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}
