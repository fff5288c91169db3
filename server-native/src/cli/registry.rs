//! `synchro-server registry ...`: registration, plans and reconfigurations, local and
//! projection indexes, retirement and resets, the rollout advisor. Each prints one JSON
//! object; a refusal prints the spec's error body and exits 1.

use std::process::ExitCode;

use anyhow::Result;
use serde_json::Value;

use super::{ReconfigureArgs, RegistryCommand};
use crate::connect_db;
use crate::registry::{register, RegisterRequest, RegistrationError};

/// Prints a registry command's JSON result (exit 0), or the spec's error body it was refused
/// with (exit 1; why and the way out, when known, on stderr); any other failure is the
/// command's error.
pub(super) fn printed<T: std::fmt::Display>(
    result: Result<T, RegistrationError>,
) -> Result<ExitCode> {
    match result {
        Ok(v) => {
            println!("{v}");
            Ok(ExitCode::SUCCESS)
        }
        Err(RegistrationError::Invalid(body, _, hint)) => {
            println!("{body}");
            if let Some(hint) = hint {
                eprintln!("{hint}");
            }
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// The server-only columns of each relation: as given with one relation; with several, each
/// entry RELATION.COLUMN goes to its relation (one not being registered is an error).
fn server_only_by_relation(
    relations: &[String],
    several: bool,
    entries: &[String],
) -> Result<Vec<Vec<String>>> {
    if !several {
        return Ok(vec![entries.to_vec(); relations.len()]);
    }
    let mut out = vec![Vec::new(); relations.len()];
    for entry in entries {
        let placed = entry.split_once('.').and_then(|(relation, column)| {
            let i = relations.iter().position(|r| r == relation)?;
            out[i].push(column.to_owned());
            Some(())
        });
        if placed.is_none() {
            anyhow::bail!(
                "--server-only {entry}: with several relations, name RELATION.COLUMN of one of them"
            );
        }
    }
    Ok(out)
}

/// The `--timestamp-zone` entries of each relation: ZONE (every relation's `*`), COLUMN=ZONE
/// with one relation, RELATION.COLUMN=ZONE with several.
fn zones_by_relation(
    relations: &[String],
    several: bool,
    entries: &[String],
) -> Result<Vec<std::collections::BTreeMap<String, String>>> {
    let mut out = vec![std::collections::BTreeMap::new(); relations.len()];
    for entry in entries {
        let Some((target, zone)) = entry.split_once('=') else {
            for zones in &mut out {
                zones.insert("*".to_owned(), entry.clone());
            }
            continue;
        };
        let (i, column) = if several {
            let placed = target.split_once('.').and_then(|(relation, column)| {
                Some((relations.iter().position(|r| r == relation)?, column))
            });
            placed.ok_or_else(|| {
                anyhow::anyhow!(
                    "--timestamp-zone {entry}: with several relations, name RELATION.COLUMN=ZONE of one of them"
                )
            })?
        } else {
            (0, target)
        };
        if let Some(zones) = out.get_mut(i) {
            zones.insert(column.to_owned(), zone.to_owned());
        }
    }
    // Capture reads zones with this machine's tz database, PostgreSQL with its own: a zone
    // only PostgreSQL knows would stop capture, so it is refused here.
    for zone in out.iter().flat_map(|z| z.values()) {
        if zone != "text" && jiff::tz::TimeZone::get(zone).is_err() {
            anyhow::bail!(
                "--timestamp-zone {zone}: this machine's time zone database (/usr/share/zoneinfo) does not know it"
            );
        }
    }
    Ok(out)
}

/// Runs one `registry` subcommand.
pub(super) async fn run(command: RegistryCommand) -> Result<ExitCode> {
    match command {
        RegistryCommand::Register {
            database_url,
            schema,
            relation,
            all,
            check,
            kind,
            composition,
            no_push,
            table_name,
            fanout_bound,
            impact_bound,
            server_only,
            lifecycle,
            timestamp_zone,
        } => {
            let mut db = connect_db(&database_url).await?;
            let relations = if all {
                db.query(
                    "SELECT synchro.synchro_unregistered_tables($1)",
                    &[&schema],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect()
            } else {
                relation
            };
            let several = all || relations.len() > 1;
            if several && table_name.is_some() {
                anyhow::bail!("--table-name names one relation's table: register it on its own");
            }
            let server_only = server_only_by_relation(&relations, several, &server_only)?;
            let zones = zones_by_relation(&relations, several, &timestamp_zone)?;
            let requests: Vec<RegisterRequest> = relations
                .iter()
                .zip(server_only)
                .zip(zones)
                .map(|((relation, server_only), timestamp_zones)| RegisterRequest {
                    schema: schema.clone(),
                    relation: relation.clone(),
                    kind: kind.clone(),
                    composition: composition.clone(),
                    push_enabled: !no_push,
                    fanout_bound,
                    impact_bound,
                    table_name: table_name.clone(),
                    server_only,
                    lifecycle: lifecycle.map(),
                    timestamp_zones,
                })
                .collect();
            if check {
                let reports = crate::registry::check_registrations(&mut db, &requests).await?;
                let ok = reports.iter().all(|r| r["ok"] == true);
                println!("{}", serde_json::json!({"ok": ok, "relations": reports}));
                return Ok(if ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
            if !several {
                return match requests.first() {
                    Some(req) => printed(register(&db, req).await),
                    None => anyhow::bail!("name a relation (--relation) or --all"),
                };
            }
            match crate::registry::register_all(&mut db, &requests).await {
                Ok(registered) => {
                    println!("{}", serde_json::json!({"registered": registered}));
                    Ok(ExitCode::SUCCESS)
                }
                Err((i, e)) => {
                    // Which relation was refused (nothing was registered), then the refusal.
                    if let (Some(r), RegistrationError::Invalid(..)) = (requests.get(i), &e) {
                        eprintln!(
                            "{}.{} was refused; nothing was registered",
                            r.schema, r.relation
                        );
                    }
                    printed::<Value>(Err(e))
                }
            }
        }
        RegistryCommand::Rollout {
            database_url,
            schema,
            relation,
            retire,
        } => {
            let db = connect_db(&database_url).await?;
            let contract = match (&schema, &relation) {
                (Some(s), Some(r)) if !retire.is_empty() => {
                    Some((s.as_str(), r.as_str(), retire.as_slice()))
                }
                _ => None,
            };
            printed(crate::registry::rollout(&db, contract).await)
        }
        RegistryCommand::Index {
            database_url,
            schema,
            relation,
            name,
            columns,
            unique,
        } => {
            let db = connect_db(&database_url).await?;
            printed(
                crate::registry::declare_index(&db, &schema, &relation, &name, &columns, unique)
                    .await,
            )
        }
        RegistryCommand::ProjectionIndex {
            database_url,
            schema,
            relation,
            columns,
            drop,
        } => match drop {
            Some(index) => {
                super::operator::operator_function(
                    &database_url,
                    "SELECT jsonb_build_object('dropped', synchro.synchro_drop_projection_index($1))::text",
                    &[index],
                )
                .await
            }
            None => {
                let db = connect_db(&database_url).await?;
                let created = db
                    .query_one(
                        "SELECT synchro.synchro_index_projection($1, $2, $3)::text",
                        &[&schema, &relation, &columns],
                    )
                    .await
                    .map(|row| row.get::<_, String>(0))
                    .map_err(crate::registry::registration_error);
                printed(created)
            }
        },
        RegistryCommand::RetireTable {
            database_url,
            schema,
            relation,
        } => relation_command(&database_url, &schema, &relation, false).await,
        RegistryCommand::Reset {
            database_url,
            schema,
            relation,
        } => relation_command(&database_url, &schema, &relation, true).await,
        RegistryCommand::Plan { change } => reconfigure_command(&change, false).await,
        RegistryCommand::Reconfigure { change } => reconfigure_command(&change, true).await,
    }
}

/// `registry plan` (dry run) and `registry reconfigure`: prints the plan as JSON; an
/// invalid reconfiguration prints the spec's error body and fails.
async fn reconfigure_command(change: &ReconfigureArgs, apply: bool) -> Result<ExitCode> {
    let mut db = connect_db(&change.database_url).await?;
    printed(
        crate::registry::reconfigure(&mut db, &change.request(), apply)
            .await
            .map(|plan| plan.to_json()),
    )
}

/// `registry reset` (`reset`) and `registry retire-table`: the change and the publish, in one
/// transaction; prints both.
async fn relation_command(
    database_url: &str,
    schema: &str,
    relation: &str,
    reset: bool,
) -> Result<ExitCode> {
    let mut db = connect_db(database_url).await?;
    let done = if reset {
        crate::registry::reset(&mut db, schema, relation).await
    } else {
        crate::registry::retire(&mut db, schema, relation).await
    };
    printed(done.map(
        |(change, outcome)| serde_json::json!({"change": change, "publish": outcome.to_json()}),
    ))
}
