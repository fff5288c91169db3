//! `synchro-server`: the command line of [`synchro_server::cli`].

fn main() -> std::process::ExitCode {
    synchro_server::cli::main()
}
