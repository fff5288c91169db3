//! Lets one test file run natively (tokio, temp files) and in headless Chromium (a dedicated
//! worker, databases on the OPFS pool VFS): `fresh_path` gives a new database location on
//! either, `open` opens it, `remove` deletes it where the platform can.
#![allow(dead_code)]

use std::path::PathBuf;

use synchro_client::storage::Storage;

#[cfg(not(target_arch = "wasm32"))]
pub async fn fresh_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("synchro-client-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{name}-{n}.db"));
    let _ = std::fs::remove_file(&path);
    path
}

#[cfg(target_arch = "wasm32")]
pub async fn fresh_path(name: &str) -> PathBuf {
    use std::cell::Cell;
    thread_local!(static N: Cell<u64> = const { Cell::new(0) });
    synchro_client::wasm::install_opfs().await.unwrap();
    synchro_client::wasm::ensure_opfs_capacity(64)
        .await
        .unwrap();
    let n = N.with(|n| {
        n.set(n.get() + 1);
        n.get()
    });
    PathBuf::from(format!("/{name}-{}-{n}.db", js_sys::Date::now() as u64))
}

/// Opens a fresh file-backed database.
pub async fn fresh(name: &str) -> Storage {
    Storage::open(fresh_path(name).await).unwrap()
}

pub fn open(path: &PathBuf) -> Storage {
    Storage::open(path).unwrap()
}

pub fn remove(path: &PathBuf) {
    #[cfg(not(target_arch = "wasm32"))]
    let _ = std::fs::remove_file(path);
    // The OPFS pool reuses the slot of a database only after an explicit unlink; test
    // databases are few and their names unique, so they stay until the pool is cleared.
    #[cfg(target_arch = "wasm32")]
    let _ = path;
}
