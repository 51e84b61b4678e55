//! `sup`: parse the command line, run the command, map the outcome to an exit code.

fn main() -> std::process::ExitCode {
    sup::cli::main()
}
