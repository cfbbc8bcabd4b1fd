//! `peregrine bench spec`: speculative decoding offline (no HTTP). The same prompts go
//! through the engine without drafts and then with them (decode steps through graphs in
//! both unless --enforce-eager), greedy unless --temperature says otherwise; it prints the
//! wall time of each, the speedup, the acceptance rate, the tokens per verification
//! forward, the acceptance at each draft position, and how many outputs were identical
//! (greedy decoding must not change; sampled outputs differ, each run drawing its own).
//! With `--rounds N` each kind runs N times, in the order without, with, with, without,
//! ...: the times are summed, each round's speedup is printed, and the last run with
//! drafts gives the acceptance figures.

use super::bench_serve::prompts;
use super::engine::load_backend;
use crate::cli::BenchSpecArgs;
use anyhow::Context;
use peregrine_actors::backend::Loaded;
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_actors::messages::{
    GenerateRequest, RequestEvent, RequestId, RequestSpec, SchedulerLimits, SchedulerMsg, Usage,
};
use peregrine_config::{DeviceKind, ServeConfig};
use peregrine_models::tokenizer::Tokenizer;
use peregrine_ops::sampling::SamplingParams;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// One run's outputs and time.
struct RunResult {
    outputs: Vec<(Vec<u32>, Usage)>,
    seconds: f64,
}

/// Runs both passes and prints the comparison.
pub fn run(args: BenchSpecArgs) -> anyhow::Result<()> {
    let dir = super::resolve_model(&args.model)?;
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let list = match &args.dataset {
        Some(path) => prompts::dataset(path, args.num_prompts, args.output_len)?,
        None => prompts::random(args.num_prompts, args.input_len, args.output_len, args.seed),
    };
    let mut reqs = Vec::with_capacity(list.len());
    for p in &list {
        reqs.push((tokenizer.encode(&p.text, true)?, p.max_tokens, p.ignore_eos));
    }
    let command: Vec<String> = std::env::args().collect();
    println!("command: {}", command.join(" "));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for speculate in [round % 2 == 1, round % 2 == 0] {
            let run = runtime.block_on(run_engine(&args, &dir, &reqs, speculate))?;
            match speculate {
                true => on.push(run),
                false => off.push(run),
            }
        }
    }
    if let Some(path) = &args.outputs {
        write_outputs(path, &off, &on)?;
    }
    let rounds: Vec<String> = off
        .iter()
        .zip(&on)
        .map(|(a, b)| format!(" {:.2}x", a.seconds / b.seconds))
        .collect();
    let off_outputs = &off[0].outputs;
    // Greedy outputs must be the same in every run.
    let same_everywhere = off.iter().chain(&on).all(|r| {
        args.temperature > 0.0
            || r.outputs
                .iter()
                .map(|o| &o.0)
                .eq(off_outputs.iter().map(|o| &o.0))
    });
    let off = RunResult {
        seconds: off.iter().map(|r| r.seconds).sum(),
        outputs: off.swap_remove(0).outputs,
    };
    let on = RunResult {
        seconds: on.iter().map(|r| r.seconds).sum(),
        outputs: on.pop().expect("at least one round").outputs,
    };
    let tokens: usize = on.outputs.iter().map(|(_, u)| u.completion_tokens).sum();
    let sum = |f: fn(&Usage) -> usize| on.outputs.iter().map(|(_, u)| f(u)).sum::<usize>();
    let (drafts, draft_tokens, accepted) = (
        sum(|u| u.num_drafts),
        sum(|u| u.num_draft_tokens),
        sum(|u| u.num_accepted_tokens),
    );
    let same = off
        .outputs
        .iter()
        .zip(&on.outputs)
        .filter(|(a, b)| a.0 == b.0)
        .count();
    let runs = args.rounds as f64;
    if args.rounds > 1 {
        println!(
            "{} rounds (times summed), speedup of each:{}",
            args.rounds,
            rounds.concat()
        );
    }
    println!(
        "no speculation: {:.2} s, {:.1} output tok/s",
        off.seconds,
        runs * tokens as f64 / off.seconds
    );
    println!(
        "{} k={}: {:.2} s, {:.1} output tok/s, speedup {:.2}x",
        args.speculative_method.as_str(),
        args.num_speculative_tokens,
        on.seconds,
        runs * tokens as f64 / on.seconds,
        off.seconds / on.seconds
    );
    println!(
        "acceptance {:.1}% ({accepted} of {draft_tokens} draft tokens), tokens per \
         verification forward {:.2} ({drafts} verifications with drafts), decode forwards \
         saved {:.1}%",
        100.0 * accepted as f64 / draft_tokens.max(1) as f64,
        (accepted + drafts) as f64 / drafts.max(1) as f64,
        100.0 * accepted as f64 / tokens.max(1) as f64
    );
    println!(
        "per-position acceptance (accepted at the position over verifications with drafts):{}",
        per_position(&on.outputs, drafts)
    );
    if args.temperature > 0.0 {
        println!(
            "identical outputs: {same} of {} (sampled at temperature {}: a run with drafts \
             draws other numbers, so outputs need not match)",
            reqs.len(),
            args.temperature
        );
    } else if same_everywhere {
        println!("identical outputs: {same} of {}", reqs.len());
    } else {
        println!(
            "identical outputs: {same} of {} in the last runs; NOT identical in every run",
            reqs.len()
        );
    }
    Ok(())
}

/// Each draft position's accepted drafts over `drafts` verifications, as vLLM's and
/// Peregrine's `/metrics` count it, up to the last position any draft reached.
fn per_position(outputs: &[(Vec<u32>, Usage)], drafts: usize) -> String {
    let mut accepted = [0usize; peregrine_config::MAX_SPECULATIVE_TOKENS];
    for (_, usage) in outputs {
        for (sum, n) in accepted.iter_mut().zip(usage.accepted_per_position) {
            *sum += n;
        }
    }
    let reached = accepted.iter().rposition(|&n| n > 0).map_or(0, |i| i + 1);
    accepted[..reached]
        .iter()
        .map(|&n| format!(" {:.4}", n as f64 / drafts.max(1) as f64))
        .collect()
}

/// The engine settings of `args` as a server's configuration, speculating with the chosen
/// method when `speculate`: what the shared loader (`commands::engine::load_backend`) reads.
fn engine_config(args: &BenchSpecArgs, speculate: bool) -> anyhow::Result<ServeConfig> {
    let device = match args.device.as_str() {
        "cpu" => DeviceKind::Cpu,
        "cuda" => DeviceKind::Cuda,
        other => anyhow::bail!("--device {other}: expected cpu or cuda"),
    };
    Ok(ServeConfig {
        model: args.model.model.clone(),
        cache_dir: args.model.cache_dir.clone(),
        device,
        block_size: args.block_size,
        kv_cache_memory: (device == DeviceKind::Cpu).then_some(args.kv_cache_memory),
        gpu_memory_utilization: args.gpu_memory_utilization,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_num_seqs: args.concurrency,
        deterministic: args.deterministic,
        speculative_method: speculate.then_some(args.speculative_method),
        draft_model: args.draft_model.clone(),
        num_speculative_tokens: args.num_speculative_tokens,
        speculative_adaptive: !args.no_speculative_adaptive,
        ngram_min: args.ngram_min,
        ngram_max: args.ngram_max,
        ..ServeConfig::default()
    })
}

/// All requests through a fresh engine, with or without the drafter.
async fn run_engine(
    args: &BenchSpecArgs,
    dir: &std::path::Path,
    reqs: &[(Vec<u32>, usize, bool)],
    speculate: bool,
) -> anyhow::Result<RunResult> {
    let eos = peregrine_models::ModelConfig::from_dir(dir)?.eos_token_ids;
    let config = engine_config(args, speculate)?;
    let Loaded {
        target: backend,
        drafter,
    } = load_backend(&config, dir)?;
    let settings = EngineSettings {
        block_size: args.block_size,
        prefix_caching: false,
        limits: SchedulerLimits {
            max_num_seqs: args.concurrency,
            max_num_batched_tokens: args.max_num_batched_tokens,
            max_waiting: reqs.len().max(1),
            num_speculative_tokens: args.num_speculative_tokens,
            speculative_adaptive: !args.no_speculative_adaptive,
        },
        max_model_len: None,
        async_scheduling: !args.no_async_scheduling && backend.host_waits_on_device(),
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let engine = start_engine(backend, &settings, drafter)?;
    let sizes = (!args.enforce_eager).then(|| CaptureSizes::for_max_num_seqs(args.concurrency));
    engine.graphs.capture(sizes).await?;
    let start = Instant::now();
    let mut streams = Vec::new();
    for (i, (prompt, max_tokens, ignore_eos)) in reqs.iter().enumerate() {
        let params = SamplingParams {
            temperature: args.temperature,
            seed: Some(i as u64),
            ..SamplingParams::greedy()
        };
        let req = Submitted {
            id: i as u64,
            prompt,
            params,
            max_tokens: *max_tokens,
            ignore_eos: *ignore_eos,
        };
        streams.push(submit(&engine.scheduler, req, &eos).await?);
    }
    let mut outputs = Vec::new();
    for mut rx in streams {
        let mut tokens = Vec::new();
        loop {
            match rx.recv().await {
                Some(RequestEvent::Tokens(t)) => tokens.extend(t.iter().map(|t| t.id)),
                // Not asked for.
                Some(RequestEvent::PromptLogprobs(_)) => {}
                Some(RequestEvent::Finished { usage, .. }) => {
                    outputs.push((tokens, usage));
                    break;
                }
                None => anyhow::bail!("the engine dropped a request"),
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // The next run sizes its pool from the memory this one leaves, and the process must not
    // exit while a thread still frees device memory.
    engine.shutdown().await;
    Ok(RunResult { outputs, seconds })
}

/// Writes each run's outputs to `path`, a JSON line per request, runs without drafts first.
fn write_outputs(path: &Path, off: &[RunResult], on: &[RunResult]) -> anyhow::Result<()> {
    let mut lines = String::new();
    for (run, results) in [("without", off), ("with", on)] {
        for (round, result) in results.iter().enumerate() {
            for (request, (tokens, _)) in result.outputs.iter().enumerate() {
                let line = serde_json::json!({
                    "run": run, "round": round, "request": request, "tokens": tokens,
                });
                lines.push_str(&line.to_string());
                lines.push('\n');
            }
        }
    }
    std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))
}

/// One request of the benchmark.
struct Submitted<'a> {
    id: u64,
    prompt: &'a [u32],
    params: SamplingParams,
    max_tokens: usize,
    ignore_eos: bool,
}

async fn submit(
    scheduler: &mpsc::Sender<SchedulerMsg>,
    req: Submitted<'_>,
    eos: &[u32],
) -> anyhow::Result<mpsc::UnboundedReceiver<RequestEvent>> {
    let Submitted {
        id,
        prompt,
        params,
        max_tokens,
        ignore_eos,
    } = req;
    params.validate()?;
    let (events, rx) = mpsc::unbounded_channel();
    let request = GenerateRequest {
        id: RequestId(id),
        spec: RequestSpec {
            prompt: Arc::from(prompt),
            params,
            max_tokens,
            stop_token_ids: if ignore_eos { Vec::new() } else { eos.to_vec() },
            ignore_eos,
            logprobs: None,
            prompt_logprobs: None,
            priority: 0,
            grammar: None,
        },
        arrival: Instant::now(),
        events,
    };
    let (reply, accepted) = oneshot::channel();
    scheduler
        .send(SchedulerMsg::Submit(request, reply))
        .await
        .map_err(|_| anyhow::anyhow!("the scheduler has stopped"))?;
    accepted
        .await
        .map_err(|_| anyhow::anyhow!("the scheduler dropped a submission"))??;
    Ok(rx)
}
