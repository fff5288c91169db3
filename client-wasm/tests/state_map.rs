//! The engine changes its state only through the state map (`StateMachine::apply`): the one
//! `StateMachine::new` is the initial state an opened engine starts from. A refused
//! transition used to be forced by constructing a new machine (issue 32), which bypassed the
//! map; nothing may do that again.
#![cfg(not(target_arch = "wasm32"))]

use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
}

#[test]
fn only_the_opened_engine_constructs_its_state_machine() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 10, "the engine's sources were not found");
    let uses: Vec<String> = files
        .iter()
        .flat_map(|(path, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.contains("StateMachine::new("))
                .map(move |(i, l)| format!("{path}:{}: {}", i + 1, l.trim()))
        })
        .collect();
    assert_eq!(uses.len(), 1, "{uses:#?}");
    assert!(
        uses[0].contains("machine: StateMachine::new(state)"),
        "{uses:#?}"
    );
}
