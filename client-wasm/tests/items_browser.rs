//! The items workload's client in headless Chromium on OPFS (a dedicated worker) against a
//! real server: `tests/examples/items_bench` (synchro-tests) starts the server and a control
//! endpoint, then runs this test (`SYNCHRO_BENCH_BROWSER_CMD`, see
//! `scripts/bench-vs-zero.sh`). It reports (a) a fresh client fully synced and verified,
//! (s) a fresh client from a portable seed (when the control endpoint names one), and
//! (b) commit-to-visible latency over single-row updates that the control endpoint commits on
//! PostgreSQL. Needs `--features bench`; the control endpoint's address is compiled in
//! (`SYNCHRO_ITEMS_CONTROL`, default `http://127.0.0.1:8798`). Chromium must run with
//! `--disable-web-security`: the server answers no CORS preflight.
#![cfg(all(target_arch = "wasm32", feature = "bench"))]

use js_sys::Function;
use synchro_client::engine::{Client, SeedOutcome};
use synchro_client::wasm::FetchTransport;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

const CONTROL: &str = match option_env!("SYNCHRO_ITEMS_CONTROL") {
    Some(c) => c,
    None => "http://127.0.0.1:8798",
};

fn global() -> web_sys::WorkerGlobalScope {
    js_sys::global().unchecked_into()
}

/// A plain-text request to the control endpoint (a CORS "simple request").
async fn control(method: &str, path: &str, body: Option<&str>) -> Result<String, JsValue> {
    let init = web_sys::RequestInit::new();
    init.set_method(method);
    if let Some(b) = body {
        init.set_body(&JsValue::from_str(b));
    }
    let request = web_sys::Request::new_with_str_and_init(&format!("{CONTROL}{path}"), &init)?;
    let response: web_sys::Response = JsFuture::from(global().fetch_with_request(&request))
        .await?
        .unchecked_into();
    Ok(JsFuture::from(response.text()?)
        .await?
        .as_string()
        .unwrap_or_default())
}

async fn say(line: &str) {
    let _ = control("POST", "/line", Some(line)).await;
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[wasm_bindgen_test]
async fn items_against_the_real_server() {
    let config = control("GET", "/config", None)
        .await
        .expect("the control endpoint");
    let parts: Vec<&str> = config.split_whitespace().collect();
    let (base, token) = (parts[0].to_owned(), parts[1].to_owned());
    let rows: i64 = parts[2].parse().unwrap();
    let updates: usize = parts[3].parse().unwrap();
    let performance = global().performance().expect("performance");
    let now = move || performance.now();

    synchro_client::wasm::install_opfs().await.unwrap();
    synchro_client::wasm::ensure_opfs_capacity(8).await.unwrap();
    let name = format!("/items-{}.db", js_sys::Date::now() as u64);
    let storage = synchro_client::wasm::open_opfs(&name).await.unwrap();
    let provider = Function::new_no_args(&format!("return {token:?};"));
    // Each client its own stream (its own client ID).
    let random = |salt: u64| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ js_sys::Date::now() as u64 ^ salt;
        move || {
            let mut out = [0u8; 16];
            for chunk in out.chunks_mut(8) {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                chunk.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
            }
            out
        }
    };
    let mut client = Client::open(
        storage,
        FetchTransport::new(&base, provider.clone()),
        random(1),
    )
    .unwrap();
    let count = |c: &Client<FetchTransport>| -> i64 {
        c.storage()
            .connection()
            .query_row("SELECT count(*) FROM items", [], |r| r.get(0))
            .unwrap_or(0)
    };

    // (a) A fresh client, fully synced and verified.
    let started = now();
    let report = client.sync_once().await.unwrap();
    let secs = (now() - started) / 1000.0;
    assert_eq!(count(&client), rows, "the fresh client is incomplete");
    assert!(
        report.verified.contains("items"),
        "the scope did not verify"
    );
    say(&format!(
        "browser (a) fresh client fully synced and verified: {secs:.2} s for {rows} rows ({:.0} rows/s)",
        rows as f64 / secs
    ))
    .await;
    let _ = control("POST", "/rss", Some("after (a)")).await;

    // (s) A fresh client from the portable seed the server serves (exported just before
    // this run, a few rows changed since): downloaded into OPFS, verified, then one connect
    // and the pull of what changed since its boundary.
    if let Some(seed_url) = parts.get(4) {
        // The download alone (the same request, its body read and dropped), for what the
        // verification and install add to it.
        let started = now();
        let init = web_sys::RequestInit::new();
        let headers = web_sys::Headers::new().unwrap();
        headers
            .set("authorization", &format!("Bearer {token}"))
            .unwrap();
        init.set_headers(&headers);
        let request = web_sys::Request::new_with_str_and_init(seed_url, &init).unwrap();
        let response: web_sys::Response = JsFuture::from(global().fetch_with_request(&request))
            .await
            .unwrap()
            .unchecked_into();
        let body = JsFuture::from(response.array_buffer().unwrap())
            .await
            .unwrap();
        let bytes = js_sys::ArrayBuffer::from(body).byte_length();
        let download = (now() - started) / 1000.0;
        let started = now();
        let transport = FetchTransport::new(&base, provider.clone());
        let name = format!("/items-seeded-{}.db", js_sys::Date::now() as u64);
        let (storage, outcome) =
            synchro_client::wasm::open_opfs_from_seed(&name, &transport, seed_url)
                .await
                .unwrap();
        assert!(
            matches!(outcome, SeedOutcome::Installed(_)),
            "the seed was not installed: {outcome:?}"
        );
        let opened = now();
        let mut seeded = Client::open(storage, transport, random(2)).unwrap();
        let mut pulled = 0;
        let mut report;
        loop {
            report = seeded.sync_once().await.unwrap();
            pulled += report.pulled_changes;
            if pulled >= 10 {
                break;
            }
            assert!(
                now() - started < 120_000.0,
                "the later changes never arrived"
            );
        }
        let secs = (now() - started) / 1000.0;
        assert!(!report.rebuilt.contains("items") && report.verified.contains("items"));
        assert_eq!(count(&seeded), rows, "the seeded client is incomplete");
        say(&format!(
            "browser (s) fresh client from a seed: {secs:.2} s for {rows} rows (download into OPFS and verification {:.2} s, connect and pull of the {pulled} later changes {:.2} s; the download of its {:.1} MB alone, in memory: {download:.2} s)",
            (opened - started) / 1000.0,
            secs - (opened - started) / 1000.0,
            f64::from(bytes) / 1e6
        ))
        .await;
    }

    // (b) Commit-to-visible latency: the control endpoint commits, then the client syncs in
    // a loop until its SQLite shows the value.
    let mut latencies = Vec::with_capacity(updates);
    for i in 0..updates {
        let answer = control("POST", "/update", Some(&i.to_string()))
            .await
            .unwrap();
        let committed = now();
        let mut it = answer.split_whitespace();
        let id: i64 = it.next().unwrap().parse().expect(&answer);
        let val: i64 = it.next().unwrap().parse().unwrap();
        loop {
            client.sync_once().await.unwrap();
            let local: i64 = client
                .storage()
                .connection()
                .query_row("SELECT val FROM items WHERE id = ?", [id], |r| r.get(0))
                .unwrap();
            if local == val {
                break;
            }
            assert!(now() - committed < 60_000.0, "update never arrived");
        }
        latencies.push(now() - committed);
    }
    latencies.sort_by(f64::total_cmp);
    say(&format!(
        "browser (b) commit-to-visible latency over {updates} single-row updates: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms (measured from the control endpoint's answer after the commit)",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        percentile(&latencies, 0.99)
    ))
    .await;
    let _ = control("POST", "/rss", Some("after (b)")).await;
}
