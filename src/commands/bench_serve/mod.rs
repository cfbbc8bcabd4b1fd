//! `peregrine bench serve`: load-tests an OpenAI-compatible server the way
//! `vllm bench serve` does. It sends `--num-prompts` streamed requests, at most
//! `--concurrency` at a time, times every chunk, and prints throughput, TTFT / TPOT /
//! ITL / end-to-end percentiles, and how many requests were constrained and how they
//! ended. Random prompts go to `/v1/completions`; the lines of a `--dataset` go there or,
//! for a chat or tools, to `/v1/chat/completions`, with their output constraints.

mod constraint;
mod dataset;
mod job;
pub(crate) mod prompts;
mod report;
pub(crate) mod request;
mod sse;
mod stats;
mod stream;
mod tally;
#[cfg(test)]
mod tests;

use crate::cli::BenchServeArgs;
use anyhow::{bail, Context};
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use job::Job;
use report::Report;
use request::Server;
use std::time::Instant;

/// Runs the benchmark, prints the table and writes `--result-file`. Fails when the
/// server cannot be reached or when every request failed.
pub fn run(args: BenchServeArgs) -> anyhow::Result<()> {
    let jobs = load_jobs(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let bar = progress_bar(jobs.len());
    let report = runtime.block_on(benchmark(&args, &jobs, &bar));
    bar.finish_and_clear();
    let report = report?;
    print!("{}", report.table());
    if let Some(path) = &args.result_file {
        let text = serde_json::to_string_pretty(&report.json())?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("Results written to {}", path.display());
    }
    match report.first_error() {
        Some(error) if report.summary.completed == 0 => {
            bail!(
                "all {} requests failed; the first error: {error}",
                report.summary.failed
            )
        }
        _ => Ok(()),
    }
}

/// The requests `args` asks for, after checking the numbers: the dataset's lines, going
/// round the file again when it has fewer, or random prompts.
fn load_jobs(args: &BenchServeArgs) -> anyhow::Result<Vec<Job>> {
    if args.num_prompts == 0 || args.concurrency == 0 || args.output_len == 0 || args.n == 0 {
        bail!("--num-prompts, --concurrency, --output-len and --n must be at least 1");
    }
    let jobs: Vec<Job> = match &args.dataset {
        Some(path) => dataset::load(path, args.output_len)?
            .into_iter()
            .map(Job::from_line)
            .collect(),
        None if args.input_len == 0 => bail!("--input-len must be at least 1"),
        None => {
            let prompts =
                prompts::random(args.num_prompts, args.input_len, args.output_len, args.seed);
            prompts.iter().map(Job::from_prompt).collect()
        }
    };
    let mut jobs: Vec<Job> = jobs
        .iter()
        .cycle()
        .take(args.num_prompts)
        .cloned()
        .collect();
    if args.n > 1 {
        for job in &mut jobs {
            job.body.insert("n".into(), serde_json::json!(args.n));
        }
    }
    Ok(jobs)
}

/// A bar over the requests, drawn on stderr when it is a terminal.
fn progress_bar(len: usize) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:40} {pos}/{len} requests [{elapsed_precise}<{eta_precise}]",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Finds the model (unless `--model` names it), sends every job with at most
/// `--concurrency` in flight, and summarises.
async fn benchmark(
    args: &BenchServeArgs,
    jobs: &[Job],
    bar: &ProgressBar,
) -> anyhow::Result<Report> {
    let server = Server::new(&args.url, args.api_key.clone())?;
    let model = match &args.model {
        Some(model) => model.clone(),
        None => server.first_model().await?,
    };
    let before = server.prefill_counts().await;
    let start = Instant::now();
    let mut results: Vec<_> = futures_util::stream::iter(jobs.iter().enumerate())
        .map(|(index, job)| {
            let (server, model) = (&server, &model);
            async move {
                let result = server.complete(model, job).await;
                bar.inc(1);
                (index, result.map_err(|e| format!("{e:#}")))
            }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    let duration = start.elapsed().as_secs_f64();
    results.sort_by_key(|(index, _)| *index);
    let results = results.into_iter().map(|(_, result)| result).collect();
    let after = server.prefill_counts().await;
    let constraints = jobs.iter().map(|job| job.constraint).collect();
    let mut report = Report::new(args, model, constraints, results, duration);
    report.prompt_tokens_computed = before.zip(after).map(|(b, a)| a.computed_since(&b));
    Ok(report)
}
