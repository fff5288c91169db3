//! `synchro-conformance`: the protocol conformance tool for implementers in any language.
//!
//! `synchro-conformance eval` reads `{"cases":[{"id","command","input"}]}` on stdin and
//! writes `{"results":[{"id","output"}]}` on stdout (RFC 8785 canonical JSON), one result
//! per case, in order, exit status 0. A malformed document exits with status 2.
//! `synchro-conformance check FILE...` runs vector files whose cases carry `expect`
//! objects and reports every mismatch.

use std::io::{Read, Write};
use std::process::ExitCode;

const USAGE: &str = "usage: synchro-conformance eval < cases.json > results.json
       synchro-conformance check FILE...  (run vector files with expect members; exit 1 on a mismatch)
       synchro-conformance commands      (list the supported commands)
       synchro-conformance --version";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["eval"] => eval(),
        ["check", files @ ..] if !files.is_empty() => check(files),
        ["commands"] => {
            for c in synchro_protocol::conformance::COMMANDS {
                println!("{c}");
            }
            ExitCode::SUCCESS
        }
        ["--version"] => {
            println!(
                "synchro-conformance {} (protocol {})",
                synchro_protocol::VERSION,
                synchro_protocol::PROTOCOL_VERSION
            );
            ExitCode::SUCCESS
        }
        ["--help" | "-h"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn check(files: &[&str]) -> ExitCode {
    let mut failed = false;
    for file in files {
        let report = std::fs::read_to_string(file)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                synchro_protocol::conformance::check_document(&t)
                    .map_err(|e| format!("{e} ({})", e.code()))
            });
        match report {
            Ok(r) => {
                for m in &r.mismatches {
                    println!("MISMATCH {m}");
                }
                println!(
                    "{file}: {}/{} cases match",
                    r.total - r.mismatches.len(),
                    r.total
                );
                failed |= !r.mismatches.is_empty();
            }
            Err(e) => {
                eprintln!("synchro-conformance: {file}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn eval() -> ExitCode {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("synchro-conformance: cannot read stdin as UTF-8: {e}");
        return ExitCode::from(2);
    }
    match synchro_protocol::conformance::eval_document(&input) {
        Ok(out) => {
            let mut stdout = std::io::stdout().lock();
            if writeln!(stdout, "{out}")
                .and_then(|_| stdout.flush())
                .is_err()
            {
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("synchro-conformance: {} ({})", e, e.code());
            ExitCode::from(2)
        }
    }
}
