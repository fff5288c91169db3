//! The `synchro-server` program, built in this package for its tests.

fn main() -> std::process::ExitCode {
    synchro_server::cli::main()
}
