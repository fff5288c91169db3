//! Benchmark fixtures (feature `bench`): a synced table filled directly, the way a client
//! holds it after syncing, without downloading it first.

use synchro_protocol::manifest::Manifest;
use synchro_protocol::value::TypedValue;

use super::rows::{record_server_row, table_of, write_row};
use super::scopes::{add_edge, install_final};
use super::values::to_sql;
use super::Storage;
use crate::error::StorageError;

impl Storage {
    /// Writes every row of `rows` (values in field order, and the server version) into
    /// `table_id`, justified by `scope`, with placeholder (all-zero) digests, and installs a
    /// verified cursor for `scope`; one transaction.
    pub(crate) fn seed_synced_rows(
        &mut self,
        manifest: &Manifest,
        table_id: &str,
        scope: &str,
        rows: impl Iterator<Item = (Vec<TypedValue>, String)>,
    ) -> Result<(), StorageError> {
        let table = table_of(manifest, table_id)?;
        let pk_index = table
            .fields
            .iter()
            .position(|f| f.field_id == table.primary_key_field_id)
            .expect("a validated table has its primary key");
        self.with_index_tx(|tx, ix| {
            ix.for_manifest(manifest);
            for (values, version) in rows {
                let pk = &values[pk_index];
                write_row(tx, table, values.iter().map(to_sql))?;
                record_server_row(tx, ix, table, pk, &pk.to_wire_text(), &version, &[0; 32])?;
                add_edge(tx, ix, table, pk, scope)?;
            }
            install_final(tx, scope, Some("c"))?;
            Ok(())
        })
    }

    /// How many stored row digests are not the placeholder.
    pub(crate) fn digested_rows(&self) -> Result<i64, StorageError> {
        Ok(self.connection().query_row(
            r#"SELECT count(*) FROM "_synchro_rows" WHERE "digest" <> zeroblob(32)"#,
            [],
            |r| r.get(0),
        )?)
    }
}
