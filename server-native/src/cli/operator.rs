//! The operator's and monitor's one-shot commands: `install`, `publish`, `health`,
//! `settings`, `compact` and the ways out of a blocked capture (`capture unblock|...`). Each
//! prints one JSON object.

use std::process::ExitCode;

use anyhow::{Context, Result};

use super::{CaptureCommand, SeedCommand};
use crate::{connect_db, install};

/// `install`: the schema, roles and grants (idempotent; a superuser connection).
pub(super) async fn install(database_url: &str, check: bool) -> Result<ExitCode> {
    let mut db = connect_db(database_url).await?;
    if check {
        let (report, ok) = crate::preflight::check(&mut db).await?;
        println!("{report}");
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let report = install::install(&mut db).await?;
    println!(
        "{}",
        serde_json::json!({"version": report.version, "applied": report.applied})
    );
    Ok(ExitCode::SUCCESS)
}

/// `publish`: a new manifest when the registry changed.
pub(super) async fn publish(database_url: &str) -> Result<ExitCode> {
    let mut db = connect_db(database_url).await?;
    println!("{}", crate::publish::publish(&mut db).await?.to_json());
    Ok(ExitCode::SUCCESS)
}

/// `health`: one JSON object `{ready, not_ok, checks, report}`; exit 1 unless every check
/// is ok.
pub(super) async fn health(database_url: &str) -> Result<ExitCode> {
    let db = connect_db(database_url).await?;
    let row = db
        .query_one(
            "SELECT synchro.synchro_health_detail()::text, synchro.synchro_capture_report()::text",
            &[],
        )
        .await
        .map_err(|e| anyhow::anyhow!(install::describe(&e)))?;
    let mut checks: serde_json::Value = serde_json::from_str(&row.get::<_, String>(0))?;
    // The SQL contract this binary is built for (only the binary knows its steps).
    let installed = match install::ledger_matches(&db).await {
        Ok(true) => "ok",
        _ => "failed",
    };
    if let Some(c) = checks.as_object_mut() {
        c.insert("schema_installed".into(), installed.into());
    }
    let report: serde_json::Value = serde_json::from_str(&row.get::<_, String>(1))?;
    let ready = checks
        .as_object()
        .is_some_and(|c| c.values().all(|v| v == "ok"));
    let waiting: Vec<&String> = checks
        .as_object()
        .map(|c| {
            c.iter()
                .filter(|(_, v)| *v != "ok")
                .map(|(k, _)| k)
                .collect()
        })
        .unwrap_or_default();
    // One JSON object; a closed pipe (`| head`) is not an error worth a panic.
    use std::io::Write;
    let _ = writeln!(
        std::io::stdout(),
        "{}",
        serde_json::json!({"ready": ready, "not_ok": waiting, "checks": checks, "report": report})
    );
    // Scripts and probes branch on the exit status: 0 only when every check is ok.
    Ok(if ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `settings [--set KEY VALUE]`.
pub(super) async fn settings(database_url: &str, set: Option<Vec<String>>) -> Result<ExitCode> {
    let (sql, args) = match set {
        Some(kv) => ("SELECT synchro.synchro_set_setting($1, $2)::text", kv),
        None => ("SELECT synchro.synchro_settings()::text", vec![]),
    };
    operator_function(database_url, sql, &args).await
}

/// `compact`: one retention pass now, or with `every` one per interval for ever (a failed
/// pass after the first is logged and retried at the next interval, on a new connection).
/// Counts only.
pub(super) async fn compact(
    database_url: &str,
    batch_size: i32,
    every: Option<u64>,
) -> Result<ExitCode> {
    let print = |c: crate::retention::Compaction| {
        println!(
            "{}",
            serde_json::json!({"clients_expired": c.clients_expired, "scopes_compacted": c.scopes_compacted,
                               "effects_deleted": c.effects_deleted})
        )
    };
    // The first pass fails the command: a wrong login or URL shows at once.
    let db = connect_db(database_url).await?;
    print(
        crate::retention::compact(&db, batch_size)
            .await
            .context("compaction runs as an operator login (a member of synchro_operator)")?,
    );
    drop(db);
    if let Some(every) = every {
        let every = std::time::Duration::from_secs(every);
        tokio::select! {
            () = crate::retention::every(database_url, batch_size, every, print) => {}
            () = super::serve::shutdown_signal() => {}
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `codegen typescript`: the served manifest's tables as TypeScript types, to `out` or
/// standard output.
pub(super) async fn codegen(
    database_url: &str,
    manifest_json: bool,
    out: Option<&std::path::Path>,
) -> Result<ExitCode> {
    let db = connect_db(database_url).await?;
    let lineage = crate::publish::load_serving_lineage(&db).await?;
    let manifest = lineage
        .current()
        .context("no manifest is served yet: publish one first (synchro-server publish)")?;
    let text = if manifest_json {
        // The manifest exactly as connect serves it (`schema_definition`): the client checks
        // its hash before installing it.
        synchro_protocol::jcs::to_output_string(&manifest.definition_json()) + "\n"
    } else {
        crate::codegen::typescript(manifest)
    };
    match out {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `capture unblock|retry-staging|skip-staging`: one SQL function each, its answer as JSON.
pub(super) async fn capture_command(action: CaptureCommand) -> Result<ExitCode> {
    let (url, sql, args): (_, _, Vec<String>) = match action {
        CaptureCommand::Unblock { database_url } => (
            database_url,
            "SELECT jsonb_build_object('unblocked', synchro.synchro_capture_unblock())::text",
            vec![],
        ),
        CaptureCommand::RetryStaging(r) => (
            r.database_url,
            "SELECT jsonb_build_object('restarted', synchro.synchro_retry_staging($1, $2))::text",
            vec![r.schema, r.relation],
        ),
        CaptureCommand::SkipStaging(r) => (
            r.database_url,
            "SELECT jsonb_build_object('outcome', synchro.synchro_skip_staging($1, $2))::text",
            vec![r.schema, r.relation],
        ),
    };
    operator_function(&url, sql, &args).await
}

/// `lineage reset`: asks for the reset (or, with `dry_run`, only prints the plan), then
/// waits up to `wait_secs` for the capture worker to carry it out, printing its progress on
/// stderr. Exit 0 once done (or after a dry run), 1 while it is still to be done.
pub(super) async fn lineage_reset(url: &str, dry_run: bool, wait_secs: u64) -> Result<ExitCode> {
    let db = connect_db(url).await?;
    let ask = |dry: bool| {
        let db = &db;
        async move {
            let text: String = db
                .query_one("SELECT synchro.synchro_lineage_reset($1)::text", &[&dry])
                .await
                .map_err(|e| anyhow::anyhow!("{}", crate::install::describe(&e)))?
                .get(0);
            anyhow::Ok(serde_json::from_str::<serde_json::Value>(&text)?)
        }
    };
    let plan = ask(dry_run).await?;
    if dry_run {
        println!("{plan}");
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "lineage reset requested: the capture worker makes a new slot and copies {} relation(s)",
        plan["relations"].as_array().map_or(0, Vec::len)
    );
    let leading: Option<String> = db
        .query_one(
            "SELECT synchro.synchro_health_detail() ->> 'capture_worker'",
            &[],
        )
        .await
        .map(|r| r.get(0))
        .unwrap_or(None);
    if leading.as_deref() != Some("ok") {
        eprintln!(
            "no capture worker is running now: the reset is carried out when `synchro-server serve` (or `capture`) starts"
        );
    }
    let from = plan["stream_generation"].as_i64();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait_secs);
    let mut last_pending = None;
    loop {
        let now = ask(true).await?;
        // Taken by the worker (or already under way when asked: then this only follows it).
        let taken = now["requested_at"].is_null()
            && (now["stream_generation"].as_i64() != from
                || plan["in_progress"].as_i64().unwrap_or(0) > 0);
        let pending = now["in_progress"].as_i64().unwrap_or(0);
        if taken && pending == 0 {
            println!(
                "{}",
                serde_json::json!({
                    "reset": "done",
                    "stream_generation": {"from": from, "to": now["stream_generation"]},
                    "slot": now["slot"],
                    "relations": plan["relations"],
                })
            );
            return Ok(ExitCode::SUCCESS);
        }
        if taken && last_pending != Some(pending) {
            eprintln!("lineage reset: {pending} relation cop(ies) still to reach the stream");
            last_pending = Some(pending);
        }
        if std::time::Instant::now() >= deadline {
            println!(
                "{}",
                serde_json::json!({
                    "reset": if taken { "in_progress" } else { "requested" },
                    "waiting_for": "the capture worker (synchro-server serve or capture) carries the reset out at its next step; run this command again to follow it",
                    "plan": plan,
                })
            );
            return Ok(ExitCode::FAILURE);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Runs one `seed` subcommand.
pub(super) async fn seed_command(command: SeedCommand) -> Result<ExitCode> {
    let (url, sql, args) = match command {
        SeedCommand::Export {
            database_url,
            scopes,
            out,
            page_limit,
        } => return seed_export(&database_url, &scopes, &out, page_limit).await,
        SeedCommand::Verify { file } => {
            return Ok(seed_printed(crate::seed::verify_artifact(&file)))
        }
        SeedCommand::Declare(s) => (
            s.database_url,
            "SELECT synchro.synchro_declare_portable_scope($1)::text",
            vec![s.scope],
        ),
        SeedCommand::Undeclare(s) => (
            s.database_url,
            "SELECT synchro.synchro_undeclare_portable_scope($1)::text",
            vec![s.scope],
        ),
        SeedCommand::List { database_url } => (
            database_url,
            "SELECT jsonb_build_object('scopes', coalesce(jsonb_agg(jsonb_build_object(
                 'scope_id', scope_id, 'shared', shared, 'declared_at', declared_at)), '[]'))::text
               FROM synchro.synchro_portable_scopes()",
            vec![],
        ),
    };
    operator_function(&url, sql, &args).await
}

/// `seed export`: the export, verified, written as an artifact; a progress line on stderr
/// about every second.
async fn seed_export(
    url: &str,
    scopes: &[String],
    out: &std::path::Path,
    page_limit: u32,
) -> Result<ExitCode> {
    // Before the export: a file that cannot be written would be found only at its end.
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return Ok(seed_printed(Err(crate::seed::SeedError::Database(
            "the directory of --out does not exist".into(),
        ))));
    }
    let mut db = connect_db(url).await?;
    let mut last = std::time::Instant::now();
    let exported = crate::seed::export(&mut db, scopes, page_limit, |p| {
        if last.elapsed() >= std::time::Duration::from_secs(1) || p.rows == p.total {
            last = std::time::Instant::now();
            let what = if p.pass == 1 { "digested" } else { "paged" };
            eprintln!("seed export: {} of {} rows {what}", p.rows, p.total);
        }
    })
    .await;
    Ok(seed_printed(
        exported.and_then(|e| crate::seed::write_artifact(&e, out)),
    ))
}

/// Prints an artifact's evidence (exit 0) or the typed refusal (exit 1; names no scope).
fn seed_printed(result: Result<crate::seed::Evidence, crate::seed::SeedError>) -> ExitCode {
    use crate::seed::SeedError;
    let error = match result {
        Ok(evidence) => {
            println!("{}", evidence.to_json());
            return ExitCode::SUCCESS;
        }
        Err(SeedError::Refused { code, reason }) => {
            serde_json::json!({"code": code, "reason": reason})
        }
        Err(SeedError::Verification(why)) => {
            serde_json::json!({"code": "seed_verification_failed", "reason": why})
        }
        Err(SeedError::Database(why)) => {
            serde_json::json!({"code": "seed_failed", "reason": why})
        }
    };
    println!("{}", serde_json::json!({ "error": error }));
    ExitCode::FAILURE
}

/// The refusals operator functions raise as 22023 with their code as the message and a
/// JSON detail.
const TYPED_REFUSALS: [&str; 2] = ["invalid_setting", "invalid_portable_scope"];

/// Runs one operator SQL function returning JSON text and prints it; a refusal it raises
/// (`invalid_registration`, or one of [`TYPED_REFUSALS`]) is printed as `{"error": ...}`
/// with exit code 1.
pub(super) async fn operator_function(url: &str, sql: &str, args: &[String]) -> Result<ExitCode> {
    let db = connect_db(url).await?;
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
        .iter()
        .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    match db.query_one(sql, &params).await {
        Ok(row) => {
            println!("{}", row.get::<_, String>(0));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let typed = e
                .as_db_error()
                .filter(|d| TYPED_REFUSALS.contains(&d.message()));
            if let Some(d) = typed {
                let detail: serde_json::Value = d
                    .detail()
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or(serde_json::Value::Null);
                let mut error = serde_json::json!({"code": d.message()});
                if let (Some(e), Some(d)) = (error.as_object_mut(), detail.as_object()) {
                    e.extend(d.clone());
                }
                println!("{}", serde_json::json!({ "error": error }));
                return Ok(ExitCode::FAILURE);
            }
            match crate::registry::registration_error(e) {
                crate::registry::RegistrationError::Database(text) => Err(anyhow::anyhow!(text)),
                invalid => super::registry::printed(Err::<String, _>(invalid)),
            }
        }
    }
}
