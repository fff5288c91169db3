//! `docs/spec-map.md` stays true: every path it names exists, every test it cites is a test
//! function of the file it names, and every section of specs 000, 001 and 003 has a row.
//!
//! What counts as a reference (the rule `docs/spec-map.md` states):
//!
//! - A backticked span is a repository path when it has no whitespace, contains a `/`, and,
//!   after removing any `::name` suffix, ends in one of [`EXTENSIONS`]. It is relative to the
//!   repository root (the parent of this crate's directory); an absolute path is an error.
//! - A path followed by `::name` (e.g. `protocol/src/state.rs::the_documented_map_is_the_code`)
//!   is a test reference: the file must contain `fn name`, and the attributes directly above
//!   that function must include a test attribute (`#[test]`, `#[tokio::test]`,
//!   `wasm_bindgen_test`, a `cfg_attr` carrying one of them).
//! - Every `## Spec NNN` heading opens that spec's table; a row is a `|` line other than the
//!   header and the separator, and its first cell is a section title. Each title in
//!   [`SPECS`] must have exactly one row, no row may name a title the list lacks, and the
//!   other two cells must not be empty.
//! - When the specification files are present (`SYNCHRO_SPEC_DIR`, default `../shared/spec`
//!   beside the repository), the section titles found in each file must equal its list in
//!   [`SPECS`], so a new or renamed section fails here until the list and the map follow.
//!
//! `SYNCHRO_SPEC_MAP` points the tests at another copy of the map (paths in it are still
//! relative to the repository root), which is how a wrong path is shown to fail.
//!
//! Every check collects all its problems and fails once, listing them all.
#![cfg(not(target_arch = "wasm32"))]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// File endings that make a backticked span with a `/` a repository path.
const EXTENSIONS: &[&str] = &[
    ".rs", ".sql", ".md", ".toml", ".sh", ".json", ".txt", ".mjs", ".py",
];

/// Section titles of spec 000 (document title excluded), in spec order.
const SPEC_000: &[&str] = &[
    "Scope And Authority",
    "Registered Relation Identity",
    "Logical Identity",
    "Physical Identity",
    "Registration Contract",
    "Primary Key And Replica Identity",
    "Deterministic Membership Registration",
    "Scope Assignment",
    "Registration Errors",
    "Canonical Schema Model",
    "Immutable Manifest Body, Hash, And Lineage",
    "Portable Type System",
    "Canonical Wire Values",
    "Portable To SQLite Mapping",
    "Explicit Local Composition",
    "Schema Change Classes",
    "Class 1: Server-Only Change",
    "Class 2: Compatible Additive Change",
    "Class 3: Compatible Rebuild-Requiring Change",
    "Class 4: Incompatible Structural Or Identity Change",
    "Connect-Time Schema Decision",
    "Explicit Incompatible-Schema Reset",
    "Exact Current Schema Gate",
    "Authored-Schema Queued Mutations",
    "Client Migration Rules",
    "Durable Migration State",
    "Schema Change Affecting Scope Composition",
    "Schema Change Without Structural Change",
    "Expand, Migrate, Contract Rollout",
    "Membership Generations And Controlled Reconfiguration",
    "Relation Drift",
    "Controlled Relation Reconfiguration",
    "Seed Schema Reconciliation",
    "Exact Error And Action Dispatch",
];

/// Section titles of spec 001 (document title excluded), in spec order.
const SPEC_001: &[&str] = &[
    "Context",
    "Decision",
    "Portable type system and wire JSON",
    "Immutable schema hash",
    "Canonical typed binary grammar",
    "Row identity and row digest",
    "Scope digest",
    "Wire checksum objects and terminal maps",
    "Legal client state transitions",
    "SemVer 2.0 precedence",
    "PostgreSQL schema and authorization",
    "Fail-closed readiness",
    "Logging and failure-state redaction",
    "Snapshot-bound portable seed export",
    "Seed page token",
    "Seed continuation receipt",
    "Seed verification and artifact publication",
    "Installation and migration baseline",
    "Rejected alternatives",
    "Consequences",
    "Required negative controls",
    "Audit disposition",
];

/// Section titles of spec 003 (document title excluded), in spec order.
const SPEC_003: &[&str] = &[
    "Status",
    "Context",
    "Decision",
    "Logical and Physical Relation Identity",
    "Registered-relation validation",
    "Primary key and replica identity contract",
    "Relation drift and controlled reconfiguration",
    "Deterministic Scope Membership",
    "Function signatures",
    "Scope assignment",
    "Function restrictions",
    "Registry and Membership Generations",
    "Staged membership backfill",
    "Immutable Schema Manifests",
    "Schema classes",
    "Protocol 3 Schema Dispatch",
    "Explicit incompatible-schema reset",
    "Crash-safe local schema application",
    "Exact Current Schema Gate and Authored Mutation Schema",
    "Per-Scope Retention and Client Generations",
    "Explicit client generation and expiry",
    "Scope-local compaction",
    "Strict Positive Limits",
    "Error and Action Dispatch",
    "Audit Dispositions",
    "Rejected Alternatives",
    "Bare names and automatic relation rebinding",
    "Composite, partial, or arbitrary unique keys",
    "Arbitrary scope SQL and inferred dependencies",
    "Live delete-and-rebuild backfills",
    "Mutable or live-generated manifests",
    "Schema fetch in protocol 3",
    "Silent queue rewriting or unknown-field omission",
    "Global or inferred retention floors",
    "Silent limit normalization",
    "Consequences",
];

/// (spec number as in the map's `## Spec NNN` heading, spec file name, its sections).
const SPECS: &[(&str, &str, &[&str])] = &[
    ("000", "000_b775ef98ed4e2e7e.txt", SPEC_000),
    ("001", "001_e0773f5e19648fb8.txt", SPEC_001),
    ("003", "003_50495c0349ae24a2.txt", SPEC_003),
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the protocol crate lives inside the repository")
        .to_path_buf()
}

fn map_path() -> PathBuf {
    match std::env::var_os("SYNCHRO_SPEC_MAP") {
        Some(p) => PathBuf::from(p),
        None => repo_root().join("docs/spec-map.md"),
    }
}

fn read_map() -> (PathBuf, String) {
    let path = map_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the spec map {}: {e}", path.display()));
    (path, text)
}

/// One backticked reference of the map.
#[derive(Debug, PartialEq)]
enum Reference {
    /// A repository path.
    Path { line: usize, path: String },
    /// `path::name`: a test function `name` in the file at `path`.
    Test {
        line: usize,
        path: String,
        name: String,
    },
}

/// Whether `s` (without any `::name` suffix) is a repository path by the module's rule.
fn is_repo_path(s: &str) -> bool {
    !s.is_empty()
        && s.contains('/')
        && !s.chars().any(char::is_whitespace)
        && EXTENSIONS.iter().any(|e| s.ends_with(e))
}

/// Every backticked span of `text`, with its 1-based line number.
fn backticked(text: &str) -> Vec<(usize, &str)> {
    let mut spans = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find('`') {
            let after = &rest[start + 1..];
            let Some(end) = after.find('`') else { break };
            spans.push((i + 1, &after[..end]));
            rest = &after[end + 1..];
        }
    }
    spans
}

/// Every path and test reference of `text`, by the module's rule.
fn references(text: &str) -> Vec<Reference> {
    let mut out = Vec::new();
    for (line, span) in backticked(text) {
        match span.split_once("::") {
            Some((path, rest)) if is_repo_path(path) => {
                // `file.rs::module::name` names the function `name`.
                let name = rest.rsplit("::").next().unwrap_or(rest).to_owned();
                out.push(Reference::Test {
                    line,
                    path: path.to_owned(),
                    name,
                });
            }
            Some(_) => {}
            None if is_repo_path(span) => out.push(Reference::Path {
                line,
                path: span.to_owned(),
            }),
            None => {}
        }
    }
    out
}

/// Why `path` is not an existing repository path, if it is not.
fn path_problem(root: &Path, path: &str) -> Option<String> {
    if path.starts_with('/') {
        return Some("is absolute; paths are relative to the repository root".into());
    }
    if path.split('/').any(|c| c == "..") {
        return Some("leaves the repository (`..`)".into());
    }
    if root.join(path).exists() {
        None
    } else {
        Some("does not exist".into())
    }
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `line` declares the function `name` (`fn name`, optionally `pub`, `async`, ...).
fn declares(line: &str, name: &str) -> bool {
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        for prefix in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "async ",
            "const ",
            "unsafe ",
        ] {
            if let Some(r) = rest.strip_prefix(prefix) {
                rest = r.trim_start();
            }
        }
        if rest == before {
            break;
        }
    }
    match rest.strip_prefix("fn ") {
        Some(r) => {
            let r = r.trim_start();
            r.strip_prefix(name)
                .is_some_and(|after| !after.starts_with(is_ident_char))
        }
        None => false,
    }
}

/// Whether one attribute line marks a test (`#[cfg(test)]` alone does not).
fn is_test_attribute(attr: &str) -> bool {
    let a: String = attr.chars().filter(|c| !c.is_whitespace()).collect();
    a != "#[cfg(test)]"
        && (a.contains("#[test]")
            || a.contains("::test]")
            || a.contains("::test)")
            || a.contains("::test(")
            || a.contains(",test)")
            || a.contains("wasm_bindgen_test")
            || a.contains("test_case"))
}

/// Why `name` is not a test function of `source`, if it is not.
fn test_problem(source: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = source.lines().collect();
    let decls: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| declares(l, name))
        .map(|(i, _)| i)
        .collect();
    if decls.is_empty() {
        return Some(format!("has no `fn {name}`"));
    }
    for &i in &decls {
        // The attributes and comments directly above the function.
        let mut j = i;
        while j > 0 {
            let above = lines[j - 1].trim();
            if above.starts_with("#[") || above.starts_with("//") {
                if is_test_attribute(above) {
                    return None;
                }
                j -= 1;
            } else {
                break;
            }
        }
    }
    Some(format!("has `fn {name}`, but it is not marked as a test"))
}

/// One table row of the map: the spec it belongs to and its cells.
#[derive(Debug)]
struct Row {
    line: usize,
    spec: Option<String>,
    cells: Vec<String>,
}

/// The rows of every table, each with the spec of the `## Spec NNN` heading above it.
fn rows(text: &str) -> Vec<Row> {
    let mut spec = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(h) = t.strip_prefix("## ") {
            spec = h.strip_prefix("Spec ").map(|r| {
                r.chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
            });
            continue;
        }
        if !t.starts_with('|') {
            continue;
        }
        let inner = t.strip_prefix('|').unwrap_or(t);
        let inner = inner.strip_suffix('|').unwrap_or(inner);
        let cells: Vec<String> = inner.split('|').map(|c| c.trim().to_owned()).collect();
        let separator = cells
            .iter()
            .all(|c| !c.is_empty() && c.chars().all(|ch| ch == '-' || ch == ':'));
        let header = cells.first().is_some_and(|c| c == "section");
        if separator || header {
            continue;
        }
        out.push(Row {
            line: i + 1,
            spec: spec.clone(),
            cells,
        });
    }
    out
}

/// Section titles of a spec file: a line between two blank lines that starts with an ASCII
/// capital, is shorter than 80 characters, and has no tab, no code punctuation and no
/// sentence-ending punctuation. The document title (the first line) is not a section.
fn spec_headings(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    let title = lines.first().copied().unwrap_or("");
    let mut out = Vec::new();
    for (i, &l) in lines.iter().enumerate().skip(1) {
        let blank_before = lines[i - 1].trim().is_empty();
        let blank_after = lines.get(i + 1).is_none_or(|n| n.trim().is_empty());
        let shaped = l.trim() == l
            && l.len() < 80
            && l.starts_with(|c: char| c.is_ascii_uppercase())
            && !l.contains(['\t', '(', ')', '|', '=', '{', '}', '"', '[', ']'])
            && !l.ends_with(['.', ':', ';', ',']);
        if blank_before && blank_after && shaped && l != title {
            out.push(l.to_owned());
        }
    }
    out
}

fn fail_with(what: &str, map: &Path, problems: &[String]) {
    if !problems.is_empty() {
        panic!(
            "{} ({} problem(s)) in {}:\n  {}",
            what,
            problems.len(),
            map.display(),
            problems.join("\n  ")
        );
    }
}

/// Problems of every path reference (`path` and the file part of `path::name`).
fn path_problems(root: &Path, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for r in references(text) {
        let (line, path) = match &r {
            Reference::Path { line, path } => (*line, path),
            Reference::Test { line, path, .. } => (*line, path),
        };
        if let Some(p) = path_problem(root, path) {
            problems.push(format!("line {line}: `{path}` {p}"));
        }
    }
    problems
}

/// Problems of every test reference.
fn test_problems(root: &Path, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut sources: BTreeMap<String, Option<String>> = BTreeMap::new();
    for r in references(text) {
        let Reference::Test { line, path, name } = r else {
            continue;
        };
        if path_problem(root, &path).is_some() {
            problems.push(format!(
                "line {line}: `{path}::{name}`: the file does not exist"
            ));
            continue;
        }
        let source = sources
            .entry(path.clone())
            .or_insert_with(|| std::fs::read_to_string(root.join(&path)).ok());
        match source {
            None => problems.push(format!("line {line}: `{path}` cannot be read as text")),
            Some(s) => {
                if let Some(p) = test_problem(s, &name) {
                    problems.push(format!("line {line}: `{path}::{name}`: {path} {p}"));
                }
            }
        }
    }
    problems
}

/// Problems of the section rows: missing, unknown, duplicate, outside a spec, empty cells.
fn section_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    for row in rows(text) {
        let line = row.line;
        let Some(spec) = row.spec.as_deref() else {
            problems.push(format!(
                "line {line}: a table row outside any `## Spec NNN` section"
            ));
            continue;
        };
        let Some((id, _, sections)) = SPECS.iter().find(|(id, _, _)| *id == spec) else {
            problems.push(format!(
                "line {line}: spec {spec} is not one the map covers"
            ));
            continue;
        };
        if row.cells.len() != 3 {
            problems.push(format!(
                "line {line}: {} cells, expected 3 (section | implemented in | held by)",
                row.cells.len()
            ));
        }
        let title = row.cells[0].clone();
        if !sections.contains(&title.as_str()) {
            problems.push(format!(
                "line {line}: spec {id} has no section \"{title}\" (a typo, or add it to SPECS)"
            ));
        }
        for (k, what) in [(1, "implemented in"), (2, "held by")] {
            if row.cells.get(k).is_none_or(|c| c.is_empty()) {
                problems.push(format!(
                    "line {line}: spec {id} \"{title}\": the \"{what}\" cell is empty (write \"not yet\" or \"—\")"
                ));
            }
        }
        if let Some(first) = seen.entry(id).or_default().insert(title.clone(), line) {
            problems.push(format!(
                "line {line}: spec {id} \"{title}\" has a second row (first at line {first})"
            ));
        }
    }
    for (id, _, sections) in SPECS {
        let have = seen.get(id);
        if have.is_none() {
            problems.push(format!(
                "spec {id} has no rows at all (no `## Spec {id}` table)"
            ));
        }
        for s in *sections {
            if !have.is_some_and(|h| h.contains_key(*s)) {
                problems.push(format!("spec {id} section \"{s}\" has no row"));
            }
        }
    }
    problems
}

#[test]
fn every_path_in_the_spec_map_exists() {
    let (map, text) = read_map();
    let problems = path_problems(&repo_root(), &text);
    fail_with("paths in the spec map that do not exist", &map, &problems);
}

#[test]
fn every_test_the_spec_map_cites_is_a_test_of_its_file() {
    let (map, text) = read_map();
    let problems = test_problems(&repo_root(), &text);
    fail_with("cited tests that do not exist", &map, &problems);
}

#[test]
fn every_spec_section_has_exactly_one_row() {
    let (map, text) = read_map();
    let problems = section_problems(&text);
    fail_with("spec sections without a correct row", &map, &problems);
}

#[test]
fn the_section_lists_match_the_spec_files() {
    let dir = match std::env::var_os("SYNCHRO_SPEC_DIR") {
        Some(d) => PathBuf::from(d),
        None => repo_root().join("../shared/spec"),
    };
    let mut problems = Vec::new();
    let mut checked = 0;
    for (id, file, sections) in SPECS {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
            eprintln!(
                "spec_map: {} not found; spec {id}'s section list is not compared with it",
                dir.join(file).display()
            );
            continue;
        };
        checked += 1;
        let found = spec_headings(&text);
        let listed: BTreeSet<&str> = sections.iter().copied().collect();
        let present: BTreeSet<&str> = found.iter().map(String::as_str).collect();
        for h in &found {
            if !listed.contains(h.as_str()) {
                problems.push(format!(
                    "spec {id} has section \"{h}\" that SPECS lacks: add it there and a row to docs/spec-map.md"
                ));
            }
        }
        for s in *sections {
            if !present.contains(s) {
                problems.push(format!(
                    "SPECS lists \"{s}\" for spec {id}, which is not a section of {file}"
                ));
            }
        }
    }
    eprintln!("spec_map: compared {checked} of {} spec files", SPECS.len());
    if !problems.is_empty() {
        panic!(
            "section lists differ from the specs in {} ({} problem(s)):\n  {}",
            dir.display(),
            problems.len(),
            problems.join("\n  ")
        );
    }
}

/// The checks themselves fail on a wrong path, a wrong or non-test function name, and a
/// missing section, and list every problem rather than the first.
#[test]
fn the_checks_catch_wrong_paths_tests_and_missing_sections() {
    let root = repo_root();
    let scratch = "\
Rule examples: `docs/` is no path, `a b/c.rs` is no path, `x.rs` is no path.
## Spec 000: scratch
| section | implemented in | held by |
|---|---|---|
| Scope And Authority | `protocol/src/digest.rs`, `protocol/src/no_such_file.rs` | `protocol/src/state.rs::names_parse_exactly`, `protocol/src/state.rs::no_such_test`, `protocol/tests/spec_map.rs::repo_root`, `protocol/tests/nope.rs::x` |
| Scope And Authority | not yet | |
| No Such Section | — | — |
";
    let paths = path_problems(&root, scratch);
    assert_eq!(paths.len(), 2, "{paths:#?}");
    assert!(
        paths[0].contains("protocol/src/no_such_file.rs"),
        "{paths:#?}"
    );
    assert!(paths[1].contains("protocol/tests/nope.rs"), "{paths:#?}");

    let tests = test_problems(&root, scratch);
    assert_eq!(tests.len(), 3, "{tests:#?}");
    assert!(tests[0].contains("has no `fn no_such_test`"), "{tests:#?}");
    assert!(tests[1].contains("not marked as a test"), "{tests:#?}");
    assert!(tests[2].contains("the file does not exist"), "{tests:#?}");

    let sections = section_problems(scratch);
    let text = sections.join("\n");
    assert!(text.contains("\"held by\" cell is empty"), "{text}");
    assert!(text.contains("has a second row"), "{text}");
    assert!(text.contains("no section \"No Such Section\""), "{text}");
    assert!(text.contains("spec 001 has no rows at all"), "{text}");
    assert!(
        text.contains("spec 000 section \"Logical Identity\" has no row"),
        "{text}"
    );
    // Every missing section of every spec is listed, not just the first.
    let missing = sections
        .iter()
        .filter(|p| p.ends_with("has no row"))
        .count();
    assert_eq!(
        missing,
        SPEC_000.len() - 1 + SPEC_001.len() + SPEC_003.len(),
        "{text}"
    );

    // The heading rule on a small spec-shaped text.
    let spec = "Title\n\nTitle\n\nFirst Section\n\nProse that ends.\n\nlowercase_term\n\nSECTION IN CODE (x)\n\nSecond: Section\n\nASCII(\"d\") || 0x00\n";
    assert_eq!(spec_headings(spec), ["First Section", "Second: Section"]);
}
