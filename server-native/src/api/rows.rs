//! What the endpoints share about the rows and cursors they serve: a stored key's typed
//! value and row identity under the current manifest, and the issue time written into
//! cursors. (Endpoints import this, never each other.)

use synchro_protocol::digest::RowIdentity;
use synchro_protocol::value::TypedValue;

use super::{ApiError, Integrity};

/// Issue time for cursors, UTC with microseconds (RFC 3339).
pub(crate) fn now_datetime() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// A key (canonical wire text) of a table of `manifest` as its typed value and row identity.
pub(crate) fn key_identity(
    manifest: &synchro_protocol::manifest::Manifest,
    table_id: &str,
    pk: &str,
) -> Result<(TypedValue, RowIdentity), ApiError> {
    let table = manifest
        .table(table_id)
        .ok_or_else(|| ApiError::integrity(Integrity::StoredRow))?;
    let key = TypedValue::from_wire_text(&table.primary_key().spec, pk)
        .map_err(|_| ApiError::integrity(Integrity::StoredRow))?;
    let identity =
        RowIdentity::new(table, &key).map_err(|_| ApiError::integrity(Integrity::StoredRow))?;
    Ok((key, identity))
}
