//! Repository invariants: wasm-pack.toml is the one source of the wasm-bindgen version, and
//! every place Cargo must repeat it agrees.
#![cfg(not(target_arch = "wasm32"))]

use std::path::Path;

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)).unwrap()
}

/// The quoted value of `key = "..."` inside `[section]` of a simple TOML file.
fn toml_value(text: &str, section: &str, key: &str) -> Option<String> {
    let mut in_section = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == format!("[{section}]");
        } else if in_section {
            if let Some(rest) = line.strip_prefix(key).map(str::trim_start) {
                if let Some(v) = rest.strip_prefix('=') {
                    return Some(v.trim().trim_matches('"').to_owned());
                }
            }
        }
    }
    None
}

#[test]
fn wasm_pin_matches_wasm_pack_toml() {
    let pinned = toml_value(&read("wasm-pack.toml"), "wasm-bindgen", "version")
        .expect("wasm-pack.toml pins a version");
    for manifest in ["protocol/Cargo.toml", "edge-worker/Cargo.toml"] {
        let cargo = read(manifest);
        let dep = toml_value(
            &cargo,
            "target.'cfg(target_arch = \"wasm32\")'.dependencies",
            "wasm-bindgen",
        )
        .unwrap_or_else(|| panic!("{manifest} has a wasm-bindgen dependency"));
        assert_eq!(
            dep,
            format!("={pinned}"),
            "{manifest} must pin wasm-bindgen exactly to wasm-pack.toml's version"
        );
    }
    // The lock file resolves exactly that version, once.
    let lock = read("Cargo.lock");
    let locked: Vec<&str> = lock
        .split("[[package]]")
        .filter(|p| p.contains("\nname = \"wasm-bindgen\"\n"))
        .filter_map(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .collect();
    assert_eq!(locked, vec![format!("\"{pinned}\"").as_str()]);
}

#[test]
fn crate_version_is_the_workspace_version() {
    let version = toml_value(&read("Cargo.toml"), "workspace.package", "version").unwrap();
    assert_eq!(synchro_protocol::VERSION, version);
}
