//! Replays every input kept under `protocol/fuzz/regressions/<target>/` (crashers the fuzzers
//! found, plus seeds) through the same check its fuzz target runs.
#![cfg(not(target_arch = "wasm32"))]

#[path = "../fuzz/checks.rs"]
mod checks;

#[test]
fn every_kept_fuzz_input_passes_its_check() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut replayed = 0;
    for (name, check) in checks::TARGETS {
        let Ok(entries) = std::fs::read_dir(dir.join(name)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            check(&std::fs::read(&path).unwrap());
            replayed += 1;
        }
    }
    assert!(
        replayed > 0,
        "no regression inputs found under {}",
        dir.display()
    );
}
