//! One module per subcommand.

mod bench_latency;
mod bench_serve;
mod bench_soak;
mod bench_spec;
mod convert;
mod engine;
mod fetch;
mod generate;
mod heads;
mod kv_dtype;
mod perplexity;
mod serve;
mod tensor_parallel;

use crate::cli::{BenchCommand, Cli, Command, ModelArgs};
use peregrine_config::ServeConfig;
use peregrine_models::fetch::{default_cache_dir, fetch_model, model_folder};
use std::path::PathBuf;
use std::process::ExitCode;

/// The model served when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// Runs the parsed command; errors are printed with their causes.
pub fn run(cli: Cli) -> ExitCode {
    if !matches!(cli.command, Command::Serve(_)) {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                cli.log_level.as_deref().unwrap_or("warn"),
            ))
            .with_writer(std::io::stderr)
            .init();
    }
    let result = match cli.command {
        Command::Generate(args) => generate::run(*args),
        Command::Fetch(args) => fetch::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Bench(BenchCommand::Serve(args)) => bench_serve::run(args),
        Command::Bench(BenchCommand::Latency(args)) => bench_latency::run(args),
        Command::Bench(BenchCommand::Spec(args)) => bench_spec::run(args),
        Command::Bench(BenchCommand::Soak(args)) => bench_soak::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The model directory `config` names (for a `.gguf` file, its folder in the cache), or
/// the default model (fetched on first use), with the name it is served under unless
/// `served_model_name` says otherwise.
pub fn model_dir(config: &ServeConfig) -> anyhow::Result<(PathBuf, String)> {
    let cache = default_cache_dir(config.cache_dir.as_deref())?;
    Ok(match &config.model {
        Some(path) => (model_folder(path, &cache)?, path.display().to_string()),
        None => (
            fetch_model(DEFAULT_MODEL, &cache)?,
            DEFAULT_MODEL.to_string(),
        ),
    })
}

/// The model directory: `--model` (a GGUF file's folder in the cache for a `.gguf`), or
/// the default model, fetched on first use.
fn resolve_model(args: &ModelArgs) -> anyhow::Result<PathBuf> {
    let cache = default_cache_dir(args.cache_dir.as_deref())?;
    match &args.model {
        Some(path) => model_folder(path, &cache),
        None => fetch_model(DEFAULT_MODEL, &cache),
    }
}
