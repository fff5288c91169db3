//! `synchro-conformance`: the protocol conformance tool for implementers in any language.
//!
//! `synchro-conformance eval` reads `{"cases":[{"id","command","input"}]}` on stdin and
//! writes `{"results":[{"id","output"}]}` on stdout (RFC 8785 canonical JSON), one result
//! per case, in order, exit status 0. A malformed document exits with status 2.

use std::io::{Read, Write};
use std::process::ExitCode;

const USAGE: &str = "usage: synchro-conformance eval < cases.json > results.json
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
