//! Opening the storage: SQLite's default VFS is the OPFS sync-access-handle pool (one
//! pool directory per worker), on which databases open by name.

use sqlite_wasm_vfs::sahpool::{install, OpfsSAHPoolCfgBuilder, OpfsSAHPoolUtil};

use crate::error::StorageError;
use crate::store::Storage;

thread_local! {
    /// The installed pool and its directory.
    static OPFS: std::cell::RefCell<Option<(OpfsSAHPoolUtil, String)>> = const { std::cell::RefCell::new(None) };
}

/// The pool directory of [`install_opfs`].
pub(super) const DEFAULT_OPFS_DIRECTORY: &str = ".synchro";

/// Installs the OPFS pool VFS (in `.synchro`) as SQLite's default (once per worker). Must
/// run in a dedicated worker of a secure context.
pub async fn install_opfs() -> Result<(), StorageError> {
    install_opfs_in(DEFAULT_OPFS_DIRECTORY).await
}

/// [`install_opfs`] with the pool in `directory`. One worker holds a pool directory at a
/// time (its files' sync access handles are exclusive), so workers that run at once (two
/// databases of one origin, each in its own worker) need their own directories. A worker
/// installs one pool: asking for another directory afterwards is an error.
pub async fn install_opfs_in(directory: &str) -> Result<(), StorageError> {
    match OPFS.with(|o| o.borrow().as_ref().map(|(_, d)| d == directory)) {
        Some(true) => return Ok(()),
        Some(false) => {
            return Err(StorageError::Schema(
                "this worker already holds another OPFS storage directory".into(),
            ))
        }
        None => {}
    }
    let cfg = OpfsSAHPoolCfgBuilder::new().directory(directory).build();
    let util = install::<sqlite_wasm_rs::WasmOsCallback>(&cfg, true)
        .await
        .map_err(|_| opfs_unavailable())?;
    OPFS.with(|o| *o.borrow_mut() = Some((util, directory.to_owned())));
    Ok(())
}

fn opfs_unavailable() -> StorageError {
    StorageError::Schema("the OPFS storage could not be opened".into())
}

/// Makes room for at least `files` OPFS files (each database takes two: itself and its
/// rollback journal). The pool starts with six.
pub async fn ensure_opfs_capacity(files: usize) -> Result<(), StorageError> {
    install_opfs().await?;
    let util = OPFS
        .with(|o| o.borrow().as_ref().map(|(u, _)| u.clone()))
        .ok_or_else(opfs_unavailable)?;
    util.ensure_capacity(files)
        .await
        .map_err(|_| opfs_unavailable())
}

/// Opens (or creates) the database `name` on OPFS.
pub async fn open_opfs(name: &str) -> Result<Storage, StorageError> {
    install_opfs().await?;
    Storage::open(name)
}
