//! Opening the storage: SQLite's default VFS is the OPFS sync-access-handle pool (one
//! pool directory per worker), on which databases open by name.

use sqlite_wasm_rs::vfs::transfer::DbTransfer;
use sqlite_wasm_rs::vfs::VfsFilesManager;
use sqlite_wasm_vfs::sahpool::{install, OpfsSAHError, OpfsSAHPoolCfgBuilder, OpfsSAHPoolUtil};

use crate::error::StorageError;
use crate::store::seed::SeedOutcome;
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
    pool()?
        .ensure_capacity(files)
        .await
        .map_err(|_| opfs_unavailable())
}

/// Opens (or creates) the database `name` on OPFS.
pub async fn open_opfs(name: &str) -> Result<Storage, StorageError> {
    install_opfs().await?;
    Storage::open(name)
}

/// The installed pool.
fn pool() -> Result<OpfsSAHPoolUtil, StorageError> {
    OPFS.with(|o| o.borrow().as_ref().map(|(u, _)| u.clone()))
        .ok_or_else(opfs_unavailable)
}

/// Where a seed's bytes come from: its length when known, and its chunks in order.
pub(super) trait SeedSource {
    /// The number of bytes (the response's `Content-Length`), when known.
    fn length(&self) -> Option<u64>;
    /// The next chunk, `None` at the end.
    async fn next(&mut self) -> Result<Option<Vec<u8>>, StorageError>;
}

fn seed_error(what: &'static str) -> impl Fn(OpfsSAHError) -> StorageError {
    move |_| StorageError::Seed(what)
}

/// Opens the database `name` on the installed pool, first creating it from the seed
/// `source` gives when it does not exist yet: the bytes are streamed into OPFS under the
/// database's name, then the database is checked as [`Storage::verify_seed`] does before
/// anything else opens it; a seed that fails is removed and the database starts fresh
/// ([`SeedOutcome::Refused`]). `source` is asked for only when the database is new. A
/// database that exists is opened as it is, unless it is a seed whose check was interrupted
/// (the tab closed mid-way): that is checked again, and removed if it fails.
pub(super) async fn open_opfs_seeded<S: SeedSource>(
    name: &str,
    source: impl std::future::Future<Output = Result<S, StorageError>>,
) -> Result<(Storage, SeedOutcome), StorageError> {
    let util = pool()?;
    if util.contains(name).map_err(|_| opfs_unavailable())? {
        let mut storage = Storage::open(name)?;
        if !storage.is_unclaimed_seed()? {
            return Ok((storage, SeedOutcome::Skipped));
        }
        return Ok(match storage.verify_seed_in_place() {
            Ok(summary) => (storage, SeedOutcome::Installed(summary)),
            Err(e) => {
                drop(storage);
                remove(&util, name);
                (Storage::open(name)?, SeedOutcome::Refused(e))
            }
        });
    }
    remove(&util, name);
    let outcome = match import(&util, name, source).await {
        Err(e) => {
            remove(&util, name);
            SeedOutcome::Refused(e)
        }
        Ok(()) => {
            let mut storage = Storage::open(name)?;
            match storage.verify_seed_in_place() {
                Ok(summary) => return Ok((storage, SeedOutcome::Installed(summary))),
                Err(e) => {
                    drop(storage);
                    remove(&util, name);
                    SeedOutcome::Refused(e)
                }
            }
        }
    };
    Ok((Storage::open(name)?, outcome))
}

/// Opens (or creates) the database `name` on OPFS, a new one from the portable seed at
/// `url` (absolute), downloaded with `transport`'s token when it is on the server's origin:
/// see [`open_opfs_seeded`]. The OPFS pool must be installed.
pub async fn open_opfs_from_seed(
    name: &str,
    transport: &super::FetchTransport,
    url: &str,
) -> Result<(Storage, SeedOutcome), StorageError> {
    open_opfs_seeded(name, transport.download_seed(url)).await
}

/// Streams the seed into the pool as `name` (its SQLite header checked on the way).
async fn import<S: SeedSource>(
    util: &OpfsSAHPoolUtil,
    name: &str,
    source: impl std::future::Future<Output = Result<S, StorageError>>,
) -> Result<(), StorageError> {
    let mut source = source.await?;
    util.ensure_capacity(util.capacity().max(6) + 2)
        .await
        .map_err(|_| opfs_unavailable())?;
    let not_sqlite = "the seed is not a SQLite database, or OPFS could not hold it";
    // The size is needed to import into OPFS as the bytes arrive (the servers and the edge
    // always send it for a seed).
    let length = source.length().ok_or(StorageError::Seed(
        "the seed's size was not announced (no Content-Length)",
    ))?;
    let mut import = util
        .begin_import(name, length)
        .map_err(seed_error(not_sqlite))?;
    while let Some(chunk) = source.next().await? {
        import.write(&chunk).map_err(seed_error(not_sqlite))?;
    }
    import.finish().map_err(seed_error(not_sqlite))
}

/// Removes the database `name` and its journal from the pool (those that exist).
fn remove(util: &OpfsSAHPoolUtil, name: &str) {
    for suffix in ["", "-journal", "-wal"] {
        let _ = util.remove(&format!("{name}{suffix}"));
    }
}
