//! The `peregrine` binary's commands. The engine itself lives in the workspace crates.

pub mod cli;
pub mod commands;
