//! The scopes a written row is in, by its table's live membership function
//! (`synchro.synchro_push_scopes`, 52_push): any number of rows in one call on an adapter
//! connection, each evaluated as if alone, with only that row placed in the projection, as
//! the function's owner (through its evaluator), in a transaction that is always rolled
//! back.

use std::collections::BTreeSet;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::api::{ApiError, Integrity};

/// One row to evaluate.
pub(super) struct Probe<'a> {
    /// Its relation.
    pub(super) relation_id: &'a str,
    /// The key's wire JSON text (the projection's key).
    pub(super) pk_wire: &'a str,
    /// The key's text input form (the function's argument).
    pub(super) key: &'a str,
    /// The row by field ID, in canonical JSON (the projection's form).
    pub(super) row: &'a str,
}

/// The scopes of each probe, in order; `None` when the rule failed on one of them (see
/// [`rule_failed`]: the caller then finds which, one at a time).
pub(super) async fn evaluate(
    db: &mut Client,
    probes: &[Probe<'_>],
) -> Result<Option<Vec<BTreeSet<String>>>, ApiError> {
    if probes.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let relations: Vec<&str> = probes.iter().map(|p| p.relation_id).collect();
    let pk_wires: Vec<&str> = probes.iter().map(|p| p.pk_wire).collect();
    let keys: Vec<&str> = probes.iter().map(|p| p.key).collect();
    let rows: Vec<&str> = probes.iter().map(|p| p.row).collect();
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 4] = [
        (&relations, Type::TEXT_ARRAY),
        (&pk_wires, Type::TEXT_ARRAY),
        (&keys, Type::TEXT_ARRAY),
        (&rows, Type::TEXT_ARRAY),
    ];
    let tx = db.transaction().await?;
    let scopes = tx
        .query_typed(
            "SELECT ord, scopes FROM synchro.synchro_push_scopes($1, $2, $3, $4)",
            &params,
        )
        .await;
    let scopes = match scopes {
        Ok(scopes) => scopes,
        Err(e) if rule_failed(&e) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    tx.rollback().await?;
    // One result per probe, by its 1-based ordinal.
    let mut out: Vec<Option<BTreeSet<String>>> = vec![None; probes.len()];
    for row in &scopes {
        let i = usize::try_from(row.get::<_, i32>(0) - 1)
            .map_err(|_| ApiError::integrity(Integrity::Answer))?;
        let slot = out
            .get_mut(i)
            .ok_or_else(|| ApiError::integrity(Integrity::Answer))?;
        if slot.is_some() {
            return Err(ApiError::integrity(Integrity::Answer));
        }
        *slot = Some(row.get::<_, Vec<String>>(1).into_iter().collect());
    }
    out.into_iter()
        .map(|s| s.ok_or_else(|| ApiError::integrity(Integrity::Answer)))
        .collect::<Result<_, _>>()
        .map(Some)
}

/// Whether evaluating the rule failed because of the row (the function raised, divided by
/// zero, cast a value it could not, ...): an error the same row would raise again, not one
/// of the connection, the server's resources or a cancellation, which a retry can clear.
fn rule_failed(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        return false;
    };
    let class = &db.code().code()[..2];
    // 08 connection, 40 rollback (serialization, deadlock), 53 resources, 55 prerequisite
    // state (a lock not available; a rule whose definition or evaluator is not the
    // registered one, which capture blocks on too), 57 operator intervention (cancel,
    // shutdown), 58 system, XX internal.
    !matches!(class, "08" | "40" | "53" | "55" | "57" | "58" | "XX")
}
