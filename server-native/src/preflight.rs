//! `synchro-server install --check`: every prerequisite of an install and of running synchro,
//! checked from the catalogs with the login given, changing nothing. Each check is `ok`,
//! `warning` (works, with a cost worth knowing) or `missing` (what to do is in `fix`), so an
//! operator on a managed service learns before installing what their provider must turn on.
//! No login, user or database name appears in the output: counts and settings only.

use anyhow::Result;
use serde_json::{json, Value};
use tokio_postgres::Client;

/// One check's outcome.
struct Check {
    name: &'static str,
    status: &'static str,
    detail: String,
    fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: "ok",
            detail: detail.into(),
            fix: None,
        }
    }

    fn missing(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: "missing",
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn warning(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            status: "warning",
            ..Check::missing(name, detail, fix)
        }
    }
}

/// A membership `m` of login `r` in group `g` through which `r` can act as `g`: any on 15; from
/// 16 on, not the administrator-only membership the creator of a role keeps.
const ACTS: &str = "(current_setting('server_version_num')::int < 160000
                     OR pg_has_role(r.oid, g.oid, 'SET') OR pg_has_role(r.oid, g.oid, 'USAGE'))";

/// How each managed service turns on logical decoding.
const LOGICAL_DECODING: &str = "set wal_level = logical and restart PostgreSQL. Amazon RDS and Aurora: \
     rds.logical_replication = 1 in the DB parameter group, then reboot; Google Cloud SQL: the \
     cloudsql.logical_decoding flag = on; Azure Database for PostgreSQL: the server parameter \
     wal_level = logical, then restart; Supabase: on already; Neon: Settings, Logical Replication, Enable";

/// How each managed service gives a login REPLICATION.
pub const REPLICATION_GRANT: &str =
    "give the capture worker's login REPLICATION. PostgreSQL 16 and later: a login \
     with CREATEROLE and REPLICATION can (CREATE ROLE app_worker LOGIN REPLICATION NOINHERIT); \
     Amazon RDS and Aurora: GRANT rds_replication TO app_worker; Google Cloud SQL and Azure: \
     ALTER ROLE app_worker WITH REPLICATION as the admin login; Supabase and Neon: the project's \
     owner login has REPLICATION (PostgreSQL 16+: it can create app_worker with it); PostgreSQL 15 \
     elsewhere: a superuser runs ALTER ROLE app_worker REPLICATION";

/// Runs every check; the JSON printed and whether nothing is missing.
pub async fn check(db: &mut Client) -> Result<(Value, bool)> {
    let mut checks = Vec::new();
    let row = db
        .query_one(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'),
                    current_setting('wal_level'),
                    current_setting('max_replication_slots')::int,
                    (SELECT count(*)::int FROM pg_replication_slots),
                    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'synchro_capture'
                                AND database = current_database()),
                    current_setting('max_wal_senders')::int,
                    (SELECT count(*)::int FROM pg_stat_activity WHERE backend_type = 'walsender'),
                    coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false),
                    inet_server_addr() IS NULL OR host(inet_server_addr()) IN ('127.0.0.1', '::1'),
                    r.rolsuper, r.rolcreaterole, r.rolreplication,
                    pg_has_role(current_user, (SELECT datdba FROM pg_database
                                                WHERE datname = current_database()), 'USAGE'),
                    has_database_privilege(current_database(), 'CREATE')
               FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await?;
    let version: i32 = row.get(0);
    let version_text: String = row.get(1);
    let superuser: bool = row.get(10);
    let createrole: bool = row.get(11);
    let replication: bool = row.get(12);
    checks.push(if version >= 150_000 {
        Check::ok("postgresql_version", format!("PostgreSQL {version_text}"))
    } else {
        Check::missing(
            "postgresql_version",
            format!("PostgreSQL {version_text}"),
            "synchro needs PostgreSQL 15 or later: upgrade the server",
        )
    });
    let wal_level: String = row.get(2);
    checks.push(if wal_level == "logical" {
        Check::ok("wal_level", "logical")
    } else {
        Check::missing(
            "wal_level",
            format!("{wal_level}: capture needs logical decoding"),
            LOGICAL_DECODING,
        )
    });
    let (max_slots, slots, ours): (i32, i32, bool) = (row.get(3), row.get(4), row.get(5));
    checks.push(if ours || slots < max_slots {
        Check::ok(
            "replication_slots",
            format!(
                "{slots} of max_replication_slots = {max_slots} in use{}",
                if ours { ", synchro's among them" } else { "" }
            ),
        )
    } else {
        Check::missing(
            "replication_slots",
            format!(
                "{slots} of max_replication_slots = {max_slots} in use: none free for synchro's"
            ),
            "raise max_replication_slots (a restart), or drop a slot nothing uses",
        )
    });
    let (max_senders, senders): (i32, i32) = (row.get(6), row.get(7));
    checks.push(if senders < max_senders {
        Check::ok(
            "wal_senders",
            format!("{senders} of max_wal_senders = {max_senders} in use"),
        )
    } else {
        Check::missing(
            "wal_senders",
            format!("{senders} of max_wal_senders = {max_senders} in use: none free for the capture stream"),
            "raise max_wal_senders (a restart)",
        )
    });
    let (encrypted, local): (bool, bool) = (row.get(8), row.get(9));
    checks.push(if encrypted {
        Check::ok("tls", "this connection is encrypted")
    } else if local {
        Check::ok("tls", "not encrypted, on this machine (a socket or loopback)")
    } else {
        Check::warning(
            "tls",
            "this connection is not encrypted: passwords and rows cross the network in the clear",
            "add sslmode=verify-full and sslrootcert=<your provider's CA bundle> to every connection string",
        )
    });
    let (owns_database, may_create): (bool, bool) = (row.get(13), row.get(14));
    checks.push(if superuser {
        Check::ok("installing_login", "a superuser")
    } else if createrole && owns_database {
        Check::ok(
            "installing_login",
            "the database's owner with CREATEROLE: can install and upgrade (no superuser needed)",
        )
    } else {
        Check::missing(
            "installing_login",
            format!(
                "this login has {}CREATEROLE and {} the database",
                if createrole { "" } else { "no " },
                if owns_database {
                    "owns"
                } else if may_create {
                    "may create in, but does not own,"
                } else {
                    "does not own"
                }
            ),
            "install as the database's owner with CREATEROLE (the admin login a managed service gives), or a superuser",
        )
    });
    checks.push(worker_login(db, superuser, createrole, replication, version).await?);
    checks.extend(runtime_logins(db).await?);
    checks.extend(installed(db).await?);
    let ok = checks.iter().all(|c| c.status != "missing");
    let list: Vec<Value> = checks
        .iter()
        .map(|c| {
            let mut v = json!({"check": c.name, "status": c.status, "detail": c.detail});
            if let Some(fix) = &c.fix {
                v["fix"] = json!(fix);
            }
            v
        })
        .collect();
    Ok((json!({"ok": ok, "checks": list}), ok))
}

/// Whether a worker login exists (a member of synchro_worker with LOGIN and REPLICATION, or on
/// Amazon RDS and Aurora a member of rds_replication), or this login could make one.
async fn worker_login(
    db: &Client,
    superuser: bool,
    createrole: bool,
    replication: bool,
    version: i32,
) -> Result<Check> {
    let row = db
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE r.rolreplication OR EXISTS (
                            SELECT 1 FROM pg_auth_members m
                             WHERE m.member = r.oid AND m.roleid = to_regrole('rds_replication')))::int,
                        count(*)::int,
                        coalesce(pg_has_role(current_user, to_regrole('rds_replication')::oid,
                                             'MEMBER WITH ADMIN OPTION'), false)
               FROM pg_roles r
              WHERE r.rolcanlogin AND NOT r.rolsuper
                AND EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
                             WHERE m.member = r.oid AND g.rolname = 'synchro_worker' AND {ACTS})"
            ),
            &[],
        )
        .await?;
    let (with_replication, logins, grants_rds): (i32, i32, bool) =
        (row.get(0), row.get(1), row.get(2));
    if with_replication > 0 {
        return Ok(Check::ok(
            "worker_login",
            format!("{with_replication} login(s) of synchro_worker with REPLICATION"),
        ));
    }
    let can_grant = superuser || (version >= 160_000 && createrole && replication);
    let detail = if logins > 0 {
        format!("{logins} login(s) of synchro_worker, none with REPLICATION")
    } else {
        "no login of synchro_worker yet".to_owned()
    };
    Ok(if grants_rds {
        Check::warning(
            "worker_login",
            detail + "; this login can grant rds_replication",
            "CREATE ROLE app_worker LOGIN NOINHERIT PASSWORD '...'; GRANT rds_replication TO app_worker; GRANT synchro_worker TO app_worker (after install)",
        )
    } else if can_grant {
        Check::warning(
            "worker_login",
            detail + "; this login can create one",
            "CREATE ROLE app_worker LOGIN REPLICATION NOINHERIT PASSWORD '...'; GRANT synchro_worker TO app_worker (after install)",
        )
    } else {
        Check::missing(
            "worker_login",
            detail + "; this login cannot give a login REPLICATION",
            REPLICATION_GRANT,
        )
    })
}

/// Whether each other runtime role has a login (once the roles exist): serve's and the
/// operator's are needed, health's and seed export's only where used.
async fn runtime_logins(db: &Client) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    for (group, name, used_by, needed) in [
        ("synchro_adapter", "adapter_login", "serve", true),
        (
            "synchro_operator",
            "operator_login",
            "registry, publish, lineage and retention commands",
            true,
        ),
        ("synchro_monitor", "monitor_login", "health", false),
        ("synchro_seed", "seed_login", "seed export", false),
    ] {
        let row = db
            .query_one(
                &format!("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1),
                        (SELECT count(*)::int FROM pg_roles r
                          WHERE r.rolcanlogin AND NOT r.rolsuper
                            AND EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
                                         WHERE m.member = r.oid AND g.rolname = $1 AND {ACTS}))"),
                &[&group],
            )
            .await?;
        if !row.get::<_, bool>(0) {
            continue; // not installed: the schema check says so
        }
        let logins: i32 = row.get(1);
        let create = format!(
            "CREATE ROLE app_{short} LOGIN PASSWORD '...'; GRANT {group} TO app_{short}",
            short = group.trim_start_matches("synchro_")
        );
        checks.push(if logins > 0 {
            Check::ok(name, format!("{logins} login(s) of {group}"))
        } else if needed {
            Check::missing(
                name,
                format!("no login of {group}, which {used_by} need"),
                create,
            )
        } else {
            Check {
                status: "ok",
                fix: Some(create),
                ..Check::missing(
                    name,
                    format!("no login of {group} (needed only for {used_by})"),
                    "",
                )
            }
        });
    }
    Ok(checks)
}

/// The install's own state, when synchro is installed: the ledger against this binary, and
/// who may emit logical messages.
async fn installed(db: &mut Client) -> Result<Vec<Check>> {
    let roles_exist: bool = db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'synchro_owner')",
            &[],
        )
        .await?
        .get(0);
    let ledger = if roles_exist {
        crate::install::read_ledger(db).await
    } else {
        Ok(Vec::new())
    };
    let mut checks = vec![match ledger {
        Err(e) => Check::missing(
            "schema",
            format!("the install ledger cannot be read: {e:#}"),
            "run install --check as the installing login (a superuser, or the database's owner with CREATEROLE)",
        ),
        Ok(recorded) if recorded.is_empty() => Check::missing(
            "schema",
            "synchro is not installed in this database",
            "synchro-server install",
        ),
        Ok(recorded) => {
            let steps = crate::install::steps();
            let newest = recorded.iter().map(|r| r.0).max().unwrap_or(0);
            let same = recorded.len() == steps.len()
                && recorded
                    .iter()
                    .zip(&steps)
                    .all(|(r, s)| r.0 == s.version && r.2 == s.sha256());
            if same {
                Check::ok("schema", format!("installed, version {newest}, as this binary installs it"))
            } else if newest > crate::install::VERSION {
                Check::missing(
                    "schema",
                    format!("installed at version {newest}, newer than this binary's {}", crate::install::VERSION),
                    "upgrade synchro-server",
                )
            } else if recorded
                .iter()
                .all(|r| steps.iter().any(|s| s.version == r.0 && s.sha256() == r.2))
            {
                Check::missing(
                    "schema",
                    format!("installed at version {newest}, older than this binary's {}", crate::install::VERSION),
                    "synchro-server install (it upgrades)",
                )
            } else {
                Check::missing(
                    "schema",
                    "installed by another build of synchro-server: an applied step differs from this binary's",
                    "use the synchro-server release that installed this database",
                )
            }
        }
    }];
    if !roles_exist {
        return Ok(checks);
    }
    let row = db
        .query_one(
            "SELECT coalesce(bool_or(has_function_privilege('public', p.oid, 'EXECUTE')), false),
                    coalesce(bool_and(has_function_privilege('synchro_owner', p.oid, 'EXECUTE'))
                                 FILTER (WHERE p.proargtypes[2] = 'text'::regtype), false)
               FROM pg_proc p
              WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = 'pg_logical_emit_message'",
            &[],
        )
        .await?;
    let (public, owner): (bool, bool) = (row.get(0), row.get(1));
    checks.push(if !owner {
        Check::missing(
            "logical_messages",
            "synchro_owner may not emit logical messages: capture's fences cannot be written",
            "as the functions' owner (the bootstrap superuser; on a managed service, the provider): GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO synchro_owner (on 17 and later the signature has a fourth argument, boolean)",
        )
    } else if public {
        Check::warning(
            "logical_messages",
            "every login of this database may emit logical messages (PostgreSQL's default, which only the functions' owner can change): one could write a message with synchro's prefix into the WAL",
            "as the functions' owner (the bootstrap superuser; on a managed service, the provider), for each signature of pg_catalog.pg_logical_emit_message: REVOKE EXECUTE ... FROM PUBLIC; GRANT EXECUTE ... TO synchro_owner",
        )
    } else {
        Check::ok("logical_messages", "only synchro_owner may emit logical messages")
    });
    Ok(checks)
}
