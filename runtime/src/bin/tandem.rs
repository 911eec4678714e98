//! The `tandem` binary; see `runtime::cli`.

fn main() -> std::process::ExitCode {
    runtime::cli::main()
}
