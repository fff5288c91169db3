//! The client's local benchmark, natively: verified pull application against a raw insert
//! of the same rows into the same SQLite (same run, as a ratio), and a Class 2 replace over
//! a large table. The same code runs in Chromium on OPFS (tests/bench_browser.rs).
//!
//! `cargo run --release -p synchro-client --features bench --example client_bench -- [rows] [replace_rows]`
//! (or `scripts/bench-client.sh`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use synchro_client::storage::Storage;

fn arg(i: usize, default: i64) -> i64 {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rows = arg(1, 100_000);
    let replace_rows = arg(2, 1_000_000);
    let dir = std::env::temp_dir().join(format!("synchro-client-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let n = AtomicU64::new(0);
    let open = || Storage::open(dir.join(format!("{}.db", n.fetch_add(1, Ordering::Relaxed))));
    let t0 = Instant::now();
    let now = move || t0.elapsed().as_secs_f64();
    println!(
        "synchro client benchmark (native, SQLite files in {})",
        dir.display()
    );
    match synchro_client::bench::run(open, rows, replace_rows, &now).await {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            std::process::exit(1);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
