//! `synchro-server registry ...`: registration, plans and reconfigurations, local and
//! projection indexes, retirement and resets, the rollout advisor. Each prints one JSON
//! object; a refusal prints the spec's error body and exits 1.

use std::process::ExitCode;

use anyhow::Result;

use super::{ReconfigureArgs, RegistryCommand};
use crate::connect_db;
use crate::registry::{register, RegisterRequest, RegistrationError};

/// Prints a registry command's JSON result (exit 0), or the spec's error body it was refused
/// with (exit 1); any other failure is the command's error.
pub(super) fn printed<T: std::fmt::Display>(
    result: Result<T, RegistrationError>,
) -> Result<ExitCode> {
    match result {
        Ok(v) => {
            println!("{v}");
            Ok(ExitCode::SUCCESS)
        }
        Err(RegistrationError::Invalid(body, _)) => {
            println!("{body}");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs one `registry` subcommand.
pub(super) async fn run(command: RegistryCommand) -> Result<ExitCode> {
    match command {
        RegistryCommand::Register {
            database_url,
            schema,
            relation,
            kind,
            composition,
            no_push,
            table_name,
            fanout_bound,
            impact_bound,
            server_only,
            lifecycle,
        } => {
            let db = connect_db(&database_url).await?;
            let req = RegisterRequest {
                schema,
                relation,
                kind,
                composition,
                push_enabled: !no_push,
                fanout_bound,
                impact_bound,
                table_name,
                server_only,
                lifecycle: lifecycle.map(),
            };
            printed(register(&db, &req).await)
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
