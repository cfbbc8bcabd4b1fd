//! `peregrine bench soak`: the soak that broke another engine's speculative decoding (an
//! EAGLE-3 draft layer past 2 GiB whose acceptance fell from 80% to 25% once block ids
//! passed 65,535), against a running server. Waves of `--concurrency` copies of one prompt
//! at temperature 0, `--max-tokens` each (past end-of-sequence), then one request alone.
//! Per wave it prints the largest KV block id in use (`/metrics`' `kv_block_id_max`,
//! polled while the wave runs), the per-position acceptance and the tokens per
//! verification (the difference of `/metrics`' counters over the wave), how many outputs
//! equal wave 1's (request for request) and whether the acceptance alarm was raised; and,
//! where a wave's drafts lay in more than one band of block ids (below and above 65,536,
//! ...), each band's acceptance over all draft positions.
//!
//! The server's flags decide where the KV lives: the allocator hands out never-used
//! blocks in id order before it reuses freed ones, so with a shared prompt (served from
//! the prefix cache) each wave's generated tokens take `concurrency * max_tokens /
//! block_size` fresh blocks, and a small `--block-size` carries the ids past 65,535
//! within a few waves in a pool that large (docs/performance.md has the run).

mod scrape;

use crate::cli::BenchSoakArgs;
use crate::commands::bench_serve::request::Server;
use anyhow::{bail, Context};
use scrape::{alarm_raised, bands, bands_since, block_id_max, SpecCounters};
use std::time::Duration;

/// Runs the soak and prints its table; fails when a request fails.
pub fn run(args: BenchSoakArgs) -> anyhow::Result<()> {
    if args.waves == 0 || args.concurrency == 0 || args.max_tokens == 0 {
        bail!("--waves, --concurrency and --max-tokens must be at least 1");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(soak(&args))
}

/// What one wave (or the request alone) gave.
struct Wave {
    outputs: Vec<String>,
    largest_block: Option<i64>,
    spec: SpecCounters,
    /// Per band of block ids that verified drafts: its draft tokens and their acceptance.
    bands: Vec<(String, f64, f64)>,
    alarm: bool,
}

async fn soak(args: &BenchSoakArgs) -> anyhow::Result<()> {
    let server = Server::new(&args.url, args.api_key.clone())?;
    let model = match &args.model {
        Some(model) => model.clone(),
        None => server.first_model().await?,
    };
    println!(
        "soak: {} waves of {} requests of one prompt ({} characters), {} tokens each, then one \
         alone, against {} ({model})",
        args.waves,
        args.concurrency,
        args.prompt.chars().count(),
        args.max_tokens,
        args.url
    );
    println!(
        "{:>5} {:>13} {:>26} {:>12} {:>11} {:>6}",
        "wave", "largest_block", "per-position acceptance", "tokens/verif", "identical", "alarm"
    );
    let mut first: Option<Vec<String>> = None;
    let (mut all_identical, mut alarms) = (true, 0.0);
    for wave in 1..=args.waves + 1 {
        let alone = wave > args.waves;
        let n = if alone { 1 } else { args.concurrency };
        let got = run_wave(&server, &model, args, n).await?;
        let want = first.get_or_insert_with(|| got.outputs.clone());
        let same = got
            .outputs
            .iter()
            .zip(want.iter())
            .filter(|(a, b)| a == b)
            .count();
        all_identical &= same == got.outputs.len();
        alarms += got.spec.alarms;
        let acceptance: Vec<String> = got
            .spec
            .per_position()
            .iter()
            .map(|a| format!("{a:.3}"))
            .collect();
        let label = if alone {
            "alone".to_string()
        } else {
            wave.to_string()
        };
        println!(
            "{label:>5} {:>13} {:>26} {:>12} {:>11} {:>6}",
            got.largest_block.map_or("-".to_string(), |b| b.to_string()),
            if acceptance.is_empty() {
                "-".to_string()
            } else {
                acceptance.join(" ")
            },
            got.spec
                .tokens_per_verification()
                .map_or("-".to_string(), |t| format!("{t:.2}")),
            format!("{same}/{}", got.outputs.len()),
            if got.alarm || got.spec.alarms > 0.0 {
                "RAISED"
            } else {
                "quiet"
            },
        );
        if got.bands.len() > 1 {
            let bands: Vec<String> = got
                .bands
                .iter()
                .map(|(band, drafts, rate)| format!("{band}: {rate:.3} of {drafts:.0}"))
                .collect();
            println!("      by band: {}", bands.join(", "));
        }
    }
    println!(
        "every output equal to wave 1's: {}; acceptance alarms raised: {alarms}",
        if all_identical { "yes" } else { "no" }
    );
    println!(
        "largest_block: the largest KV block id a request owned while the wave ran (polled \
         every {} ms); acceptance: accepted at the position over verifications with drafts; \
         identical: outputs equal to wave 1's, request for request (the request alone: to \
         wave 1's first)",
        args.poll_ms
    );
    Ok(())
}

/// Sends `n` copies of the prompt at once and polls `/metrics` until they are answered.
async fn run_wave(
    server: &Server,
    model: &str,
    args: &BenchSoakArgs,
    n: usize,
) -> anyhow::Result<Wave> {
    let text = server.metrics().await?;
    let (before, bands_before) = (SpecCounters::read(&text), bands(&text));
    let requests: Vec<_> = (0..n)
        .map(|_| {
            let (server, model, prompt) = (server.clone(), model.to_owned(), args.prompt.clone());
            let max_tokens = args.max_tokens;
            tokio::spawn(async move { server.complete_greedy(&model, &prompt, max_tokens).await })
        })
        .collect();
    let (mut largest, mut alarm) = (None, false);
    let poll = Duration::from_millis(args.poll_ms.max(1));
    while !requests.iter().all(|r| r.is_finished()) {
        if let Ok(text) = server.metrics().await {
            largest = largest.max(block_id_max(&text).filter(|&b| b >= 0));
            alarm |= alarm_raised(&text);
        }
        tokio::time::sleep(poll).await;
    }
    let mut outputs = Vec::with_capacity(n);
    for request in requests {
        outputs.push(request.await.context("a request task failed")??);
    }
    let after = server.metrics().await?;
    alarm |= alarm_raised(&after);
    Ok(Wave {
        outputs,
        largest_block: largest,
        spec: SpecCounters::read(&after).since(&before),
        bands: bands_since(&bands(&after), &bands_before),
        alarm,
    })
}
