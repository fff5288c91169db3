//! The client's local benchmark in headless Chromium on OPFS (a dedicated worker), the same
//! code as examples/client_bench.rs: run by `scripts/bench-client.sh` with `--features bench`.
#![cfg(all(target_arch = "wasm32", feature = "bench"))]

use wasm_bindgen::JsCast;
use wasm_bindgen_test::{console_log, wasm_bindgen_test};

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

#[wasm_bindgen_test]
async fn client_benchmark_on_opfs() {
    synchro_client::wasm::install_opfs().await.unwrap();
    synchro_client::wasm::ensure_opfs_capacity(16)
        .await
        .unwrap();
    let rows: i64 = option_env!("SYNCHRO_BENCH_ROWS")
        .and_then(|r| r.parse().ok())
        .unwrap_or(100_000);
    let replace_rows: i64 = option_env!("SYNCHRO_BENCH_REPLACE_ROWS")
        .and_then(|r| r.parse().ok())
        .unwrap_or(1_000_000);
    let stamp = js_sys::Date::now() as u64;
    let n = std::cell::Cell::new(0);
    let open = || {
        n.set(n.get() + 1);
        synchro_client::storage::Storage::open(format!("/bench-{stamp}-{}.db", n.get()))
    };
    let performance = js_sys::global()
        .unchecked_into::<web_sys::WorkerGlobalScope>()
        .performance()
        .expect("performance");
    let now = move || performance.now() / 1000.0;
    console_log!("synchro client benchmark (Chromium, dedicated worker, OPFS)");
    for line in synchro_client::bench::run(open, rows, replace_rows, &now)
        .await
        .unwrap()
    {
        console_log!("{line}");
    }
}
