//! Digest benchmark (native). Prints throughput and the ratio of each digest kernel to raw
//! SHA-256 over the same octets, measured in the same run (the machines here are noisy, so
//! the ratio is the figure to compare). Not a test: it never fails on time.
//!
//!   cargo run --release -p synchro-protocol --features bench --example digest_bench -- \
//!       [--rows 200000] [--entries 1000000] [--runs 5] [--seed 42]

use std::time::Instant;

use synchro_protocol::bench::Workload;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
        .unwrap_or(default)
}

/// Median seconds of `runs` timed calls (after one warm-up call).
fn time(runs: u64, mut f: impl FnMut() -> u8) -> f64 {
    time_with_setup(runs, || (), |()| f())
}

/// Like [`time`], with an untimed `setup` before each call.
fn time_with_setup<S>(runs: u64, mut setup: impl FnMut() -> S, mut f: impl FnMut(S) -> u8) -> f64 {
    std::hint::black_box(f(setup()));
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let input = setup();
            let start = Instant::now();
            std::hint::black_box(f(input));
            start.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let (rows, entries, runs, seed) = (
        arg("--rows", 200_000) as usize,
        arg("--entries", 1_000_000) as usize,
        arg("--runs", 5).max(1),
        arg("--seed", 42),
    );
    eprintln!("generating {rows} rows and {entries} scope entries (seed {seed})...");
    let w = Workload::new(rows, entries, seed);
    let sorted = w.sorted_entries();
    let row_mb = w.row_input_bytes() as f64 / 1e6;
    let scope_mb = w.scope_input_bytes() as f64 / 1e6;

    let raw_rows = time(runs, || w.raw_sha256_rows());
    let wire = time(runs, || w.row_digests_from_wire());
    let values = time(runs, || w.row_digests_from_values());
    let raw_scope = time(runs, || w.raw_sha256_scope());
    let scope_sorted = time(runs, || w.scope_digest_presorted(&sorted));
    let scope_unsorted = time_with_setup(
        runs,
        || w.unsorted_entries(),
        |mut e| w.scope_digest_with_sort(&mut e),
    );

    let n = w.row_count() as f64;
    println!(
        "synchro digest benchmark: native ({}), median of {runs} runs",
        std::env::consts::ARCH
    );
    println!(
        "rows: {} x 10 mixed-type fields, {:.1} MB of digest input",
        w.row_count(),
        row_mb
    );
    println!(
        "  raw SHA-256 over the same octets   {:>10.0} rows/s  {:>7.1} MB/s",
        n / raw_rows,
        row_mb / raw_rows
    );
    println!(
        "  row digest from validated values   {:>10.0} rows/s  {:>7.1} MB/s  ratio to raw SHA-256 {:.2}",
        n / values, row_mb / values, raw_rows / values
    );
    println!(
        "  row digest from wire JSON          {:>10.0} rows/s  {:>7.1} MB/s  ratio to raw SHA-256 {:.2}",
        n / wire, row_mb / wire, raw_rows / wire
    );
    println!(
        "scope: {} entries, {:.1} MB of digest input",
        w.entry_count(),
        scope_mb
    );
    println!(
        "  raw SHA-256 over the same octets   {:>8.1} ms",
        raw_scope * 1e3
    );
    println!(
        "  scope digest, presorted entries    {:>8.1} ms  ratio to raw SHA-256 {:.2}",
        scope_sorted * 1e3,
        raw_scope / scope_sorted
    );
    println!(
        "  scope digest, including the sort   {:>8.1} ms  ratio to raw SHA-256 {:.2}",
        scope_unsorted * 1e3,
        raw_scope / scope_unsorted
    );
}
