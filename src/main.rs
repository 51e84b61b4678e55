//! `sup`: harden the process, parse the command line, run the command, map the outcome to an
//! exit code.

fn main() -> std::process::ExitCode {
    // Before any thread or child exists.
    sup::tools::sandbox::at_start();
    sup::cli::main()
}
