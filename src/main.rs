//! The `peregrine` command line: parses the arguments and hands them to the command.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    peregrine::commands::run(peregrine::cli::Cli::parse())
}
