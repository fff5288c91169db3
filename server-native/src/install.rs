//! `synchro-server install`: the six group roles of spec 001 and the fixed `synchro` schema,
//! installed from checked-in SQL and recorded in a ledger.
//!
//! Roles are cluster-wide, so they are created when missing and always forced to exactly
//! their attributes. The schema is ledger version 1, the install script (`sql/install/*.sql`,
//! concatenated in name order); each later version is one upgrade script (`sql/upgrades/`).
//! A database at version N applies the steps after N in order, each in one transaction. An
//! applied step whose text changed, or a ledger newer than this binary, refuses to run. See
//! `server-native/sql/README.md`.

use anyhow::{bail, Result};
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

/// One checked-in SQL file.
#[derive(Debug, Clone, Copy)]
pub struct SqlFile {
    /// File name, inside its directory.
    pub name: &'static str,
    /// SQL text.
    pub sql: &'static str,
}

/// The install script: every file of `sql/install/`, in name order (a test holds this list
/// to the directory). Applied together, in one transaction, as ledger version 1.
pub const INSTALL: &[SqlFile] = &[
    SqlFile {
        name: "00_schema.sql",
        sql: include_str!("../sql/install/00_schema.sql"),
    },
    SqlFile {
        name: "10_registry.sql",
        sql: include_str!("../sql/install/10_registry.sql"),
    },
    SqlFile {
        name: "11_manifests.sql",
        sql: include_str!("../sql/install/11_manifests.sql"),
    },
    SqlFile {
        name: "12_values.sql",
        sql: include_str!("../sql/install/12_values.sql"),
    },
    SqlFile {
        name: "20_assignment.sql",
        sql: include_str!("../sql/install/20_assignment.sql"),
    },
    SqlFile {
        name: "21_clients.sql",
        sql: include_str!("../sql/install/21_clients.sql"),
    },
    SqlFile {
        name: "30_capture.sql",
        sql: include_str!("../sql/install/30_capture.sql"),
    },
    SqlFile {
        name: "31_fences.sql",
        sql: include_str!("../sql/install/31_fences.sql"),
    },
    SqlFile {
        name: "32_bootstrap.sql",
        sql: include_str!("../sql/install/32_bootstrap.sql"),
    },
    SqlFile {
        name: "33_reconfigure.sql",
        sql: include_str!("../sql/install/33_reconfigure.sql"),
    },
    SqlFile {
        name: "34_rollout.sql",
        sql: include_str!("../sql/install/34_rollout.sql"),
    },
    SqlFile {
        name: "35_lineage.sql",
        sql: include_str!("../sql/install/35_lineage.sql"),
    },
    SqlFile {
        name: "40_membership.sql",
        sql: include_str!("../sql/install/40_membership.sql"),
    },
    SqlFile {
        name: "41_dependencies.sql",
        sql: include_str!("../sql/install/41_dependencies.sql"),
    },
    SqlFile {
        name: "42_staging.sql",
        sql: include_str!("../sql/install/42_staging.sql"),
    },
    SqlFile {
        name: "50_pull.sql",
        sql: include_str!("../sql/install/50_pull.sql"),
    },
    SqlFile {
        name: "51_rebuild.sql",
        sql: include_str!("../sql/install/51_rebuild.sql"),
    },
    SqlFile {
        name: "52_push.sql",
        sql: include_str!("../sql/install/52_push.sql"),
    },
    SqlFile {
        name: "55_seed.sql",
        sql: include_str!("../sql/install/55_seed.sql"),
    },
    SqlFile {
        name: "60_retention.sql",
        sql: include_str!("../sql/install/60_retention.sql"),
    },
    SqlFile {
        name: "70_readiness.sql",
        sql: include_str!("../sql/install/70_readiness.sql"),
    },
    SqlFile {
        name: "71_events.sql",
        sql: include_str!("../sql/install/71_events.sql"),
    },
];

/// The upgrade scripts of `sql/upgrades/`: the first takes a database from version 1 to 2,
/// and so on. Empty until the first release; add new ones at the end and never edit one
/// that has been released (the ledger records each step's SHA-256).
pub const UPGRADES: &[SqlFile] = &[];

/// The ledger name of version 1.
pub const INSTALL_NAME: &str = "install";

/// The schema version this binary installs: the install script and every upgrade.
pub const VERSION: i32 = 1 + UPGRADES.len() as i32;

/// One ledger step: a version and the SQL that reaches it.
#[derive(Debug, Clone)]
pub struct Step {
    /// Ledger version (1 is the install script).
    pub version: i32,
    /// Ledger name: [`INSTALL_NAME`] or the upgrade's file name.
    pub name: &'static str,
    /// SQL text (for version 1, the install files concatenated in name order).
    pub sql: String,
}

impl Step {
    /// The SHA-256 the ledger records for this step.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.sql.as_bytes()))
    }
}

/// The install script as one text, the files concatenated in name order.
pub fn install_sql() -> String {
    INSTALL.iter().map(|f| f.sql).collect()
}

/// Every step, in version order: the install script, then each upgrade.
pub fn steps() -> Vec<Step> {
    let mut steps = vec![Step {
        version: 1,
        name: INSTALL_NAME,
        sql: install_sql(),
    }];
    steps.extend(UPGRADES.iter().zip(2..).map(|(f, version)| Step {
        version,
        name: f.name,
        sql: f.sql.to_owned(),
    }));
    steps
}

/// Whether the database's install ledger holds exactly this binary's steps
/// (`synchro_schema_ledger`): the SQL contract the server is built for. Not so on a
/// database installed or upgraded by another version, or not upgraded yet.
pub async fn ledger_matches(db: &Client) -> Result<bool> {
    let recorded: Vec<(i32, String)> = db
        .query(
            "SELECT version, sha256 FROM synchro.synchro_schema_ledger()",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // The binary's steps hash once (the install script is large; `/ready` asks often).
    static EXPECTED: std::sync::OnceLock<Vec<(i32, String)>> = std::sync::OnceLock::new();
    let expected =
        EXPECTED.get_or_init(|| steps().iter().map(|s| (s.version, s.sha256())).collect());
    Ok(recorded == *expected)
}

/// What an install run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// Versions applied by this run (empty when already current).
    pub applied: Vec<i32>,
    /// The ledger's version afterwards.
    pub version: i32,
}

/// Creates or corrects the group roles. Needs a superuser or a CREATEROLE login (a managed
/// service's database owner): a role is created with no attributes but NOLOGIN (PostgreSQL's
/// defaults are the spec's), and altered only when its attributes differ, which only a
/// superuser may do for SUPERUSER, REPLICATION and BYPASSRLS; a CREATEROLE login is told so.
pub async fn ensure_roles(db: &Client) -> Result<()> {
    for role in ROLES {
        let attributes = db
            .query_opt(
                "SELECT ARRAY[rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolreplication]
                   FROM pg_roles WHERE rolname = $1",
                &[&role],
            )
            .await?
            .map(|r| r.get::<_, Vec<bool>>(0));
        match attributes {
            None => db
                .batch_execute(&format!("CREATE ROLE {role} NOLOGIN"))
                .await
                .map_err(|e| anyhow::anyhow!("creating role {role}: {}", describe(&e)))?,
            Some(a) if a.iter().all(|set| !set) => {}
            Some(_) => db
                .batch_execute(&format!("ALTER ROLE {role} {ROLE_ATTRIBUTES}"))
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "role {role} has attributes a synchro group role must not have, and this login cannot remove them: {}; \
                         as a superuser (your provider's administrator), run ALTER ROLE {role} {ROLE_ATTRIBUTES}",
                        describe(&e)
                    )
                })?,
        }
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

/// Installs or upgrades up to version `target` (all when `None`); used to prove that a
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
    let recorded = read_ledger(db).await?;
    let steps = steps();
    for (version, name, sha) in &recorded {
        match steps.iter().find(|s| s.version == *version) {
            None if *version > VERSION => bail!(
                "the database is at synchro schema version {version}, newer than this binary knows ({VERSION}); upgrade synchro-server"
            ),
            None => bail!("the ledger records an unknown version {version}"),
            Some(s) if s.sha256() != *sha => bail!(
                "the ledger's version {version} ({name}) differs from this binary's {}; applied steps are immutable",
                s.name
            ),
            Some(_) => {}
        }
    }
    let mut applied = Vec::new();
    for step in steps
        .iter()
        .filter(|s| target.is_none_or(|t| s.version <= t))
    {
        if recorded.iter().any(|(v, _, _)| *v == step.version) {
            continue;
        }
        let tx = db.transaction().await?;
        // The scripts create everything as synchro_owner (SET LOCAL ROLE), which a login that
        // is not a superuser may do only as a member: such a login (a CREATEROLE database owner,
        // administrator of the roles it created) is a member for this transaction only.
        let joined = join_owner_for_the_transaction(&tx).await?;
        tx.batch_execute(&step.sql).await.map_err(|e| {
            anyhow::anyhow!(
                "schema version {} ({}) failed: {}",
                step.version,
                step.name,
                describe(&e)
            )
        })?;
        // Scripts create their objects as synchro_owner (SET LOCAL ROLE); the installer
        // records the step.
        tx.batch_execute("RESET ROLE").await?;
        tx.execute(
            "INSERT INTO synchro.schema_migrations (version, name, sha256) VALUES ($1, $2, $3)",
            &[&step.version, &step.name, &step.sha256()],
        )
        .await?;
        if joined {
            tx.batch_execute("REVOKE synchro_owner FROM CURRENT_USER")
                .await?;
        }
        tx.commit().await?;
        applied.push(step.version);
    }
    let version = recorded
        .iter()
        .map(|(v, _, _)| *v)
        .chain(applied.iter().copied())
        .max()
        .unwrap_or(0);
    Ok(InstallReport { applied, version })
}

/// The install ledger's rows (version, name, SHA-256), empty where synchro is not installed.
/// The ledger is synchro_owner's: it is read as it (a login that is not a superuser joins it
/// for this read only, in a transaction rolled back).
pub async fn read_ledger(db: &mut Client) -> Result<Vec<(i32, String, String)>> {
    let tx = db.transaction().await?;
    join_owner_for_the_transaction(&tx).await?;
    let schema_exists = tx
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = 'synchro'", &[])
        .await?
        .is_some();
    let mut recorded: Vec<(i32, String, String)> = Vec::new();
    if schema_exists {
        let ledger = tx
            .query_one(
                "SELECT to_regclass('synchro.schema_migrations') IS NOT NULL",
                &[],
            )
            .await?
            .get::<_, bool>(0);
        if !ledger {
            bail!("schema synchro exists but has no migration ledger: it was not installed by synchro-server");
        }
        for row in tx
            .query(
                "SELECT version, name, sha256 FROM synchro.schema_migrations ORDER BY version",
                &[],
            )
            .await?
        {
            recorded.push((row.get(0), row.get(1), row.get(2)));
        }
    }
    tx.rollback().await?;
    Ok(recorded)
}

/// Makes the connected login a member of synchro_owner for the open transaction when it is
/// neither a superuser nor a member already (true: the caller revokes it before committing).
async fn join_owner_for_the_transaction(tx: &tokio_postgres::Transaction<'_>) -> Result<bool> {
    // PostgreSQL 16 on: the creator of a role is its administrator but, unless
    // createrole_self_grant says otherwise, may neither SET ROLE to it nor inherit from it.
    let row = tx
        .query_one(
            "SELECT rolsuper OR CASE WHEN current_setting('server_version_num')::int >= 160000
                      THEN pg_has_role(current_user, 'synchro_owner', 'SET')
                       AND pg_has_role(current_user, 'synchro_owner', 'USAGE')
                      ELSE pg_has_role(current_user, 'synchro_owner', 'USAGE') END,
                    current_setting('server_version_num')::int >= 160000,
                    pg_has_role(current_user, 'synchro_owner', 'MEMBER')
               FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await?;
    if row.get::<_, bool>(0) {
        return Ok(false);
    }
    if !row.get::<_, bool>(1) && row.get::<_, bool>(2) {
        // PostgreSQL 15 keeps one membership per pair: a grant would change nothing, and
        // the revoke at the end would take the login's own membership away.
        bail!(
            "this login is a member of synchro_owner but does not inherit its privileges (NOINHERIT): \
             install with a login that does (ALTER ROLE <this login> INHERIT), or a superuser"
        );
    }
    let grant = if row.get::<_, bool>(1) {
        "GRANT synchro_owner TO CURRENT_USER WITH INHERIT TRUE, SET TRUE"
    } else {
        "GRANT synchro_owner TO CURRENT_USER"
    };
    tx.batch_execute(grant)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "this login must act as synchro_owner to install, and cannot make itself a member: {}; \
                 install with the login that created the synchro roles, or have a role with ADMIN OPTION on synchro_owner \
                 run GRANT synchro_owner TO <this login>",
                describe(&e)
            )
        })?;
    Ok(true)
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
        None => with_causes(e),
    }
}

/// A client-side error with its causes (tokio-postgres displays "error performing TLS
/// handshake" and keeps why, say a certificate not valid for the host name, as the source).
fn with_causes(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// A database error for an operator's command output: message, SQLSTATE and the hint (the
/// way out) when there is one.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => match d.hint() {
            Some(hint) => format!("{} (SQLSTATE {}); {hint}", d.message(), d.code().code()),
            None => format!("{} (SQLSTATE {})", d.message(), d.code().code()),
        },
        None => with_causes(e),
    }
}
