//! `peregrine bench latency`: offline (no HTTP) prefill and decode timings of a model at
//! several batch sizes, with the memory-bandwidth floor of a decode step beside them.

mod backend;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod mtp_round;

use crate::cli::BenchLatencyArgs;
use anyhow::bail;
use backend::{CpuModel, LatencyModel};
use peregrine_config::MAX_SPECULATIVE_TOKENS;
use peregrine_ops::{AttentionPlan, SeqSpec};
use std::time::Instant;

/// Opens the model `args` names on the device it names.
fn open(args: &BenchLatencyArgs, largest: usize) -> anyhow::Result<Box<dyn LatencyModel>> {
    match args.device.as_str() {
        "cpu" => Ok(Box::new(CpuModel::open(args, largest)?)),
        #[cfg(feature = "cuda")]
        "cuda" => {
            crate::commands::kv_dtype::check_gpu_kv_dtype(args.kv_cache_dtype)?;
            Ok(Box::new(cuda::GpuModel::open(args)?))
        }
        #[cfg(not(feature = "cuda"))]
        "cuda" => bail!("this binary was built without the `cuda` feature"),
        other => bail!("--device {other}: expected cpu or cuda"),
    }
}

/// Runs the benchmark and prints one line per batch size, then, with --verify-rows, one
/// line per batch size of verification steps against decode steps.
pub fn run(args: BenchLatencyArgs) -> anyhow::Result<()> {
    let largest = args.batch_sizes.iter().copied().max().unwrap_or(1);
    if !(1..=1 + MAX_SPECULATIVE_TOKENS).contains(&args.verify_rows) {
        anyhow::bail!(
            "--verify-rows {}: expected 1 to {} (the last token and up to {MAX_SPECULATIVE_TOKENS} drafts)",
            args.verify_rows,
            1 + MAX_SPECULATIVE_TOKENS
        );
    }
    let mut model = open(&args, largest)?;
    let command: Vec<String> = std::env::args().collect();
    println!("command: {}", command.join(" "));
    println!("{}", model.describe());
    let floor_ms = model.decode_floor_ms()?;
    if let Some(floor) = floor_ms {
        println!(
            "roofline: {:.2} GB of weights / {:.2} TB/s measured copy bandwidth = {floor:.3} ms per \
             decode step",
            model.weight_bytes() as f64 / 1e9,
            model.weight_bytes() as f64 / floor / 1e9,
        );
    }
    println!(
        "{:>6} {:>10} {:>12} {:>14} {:>12} {:>12} {:>12} {:>14} {:>13}",
        "batch",
        "prefill_ms",
        "prefill_tok/s",
        "decode_ms/step",
        "decode_tok/s",
        "of_floor",
        "host_ms/step",
        "device_ms/step",
        "ahead_ms/step"
    );
    let mut verified = Vec::new();
    let mut rounds = Vec::new();
    for &batch in &args.batch_sizes {
        // One untimed pass warms up caches, cuBLAS heuristics and the allocator.
        let shape = Shape { batch, rows: 1 };
        measure(&mut *model, &args, shape, 4, Decode::Plain)?;
        let m = measure(&mut *model, &args, shape, args.output_len, Decode::Plain)?;
        let steps = args.output_len as f64;
        let step_ms = m.decode_s * 1e3 / steps;
        // A mixture's floor is what its batch is expected to read, at the mean context.
        let context = args.input_len + args.output_len / 2;
        let floor_ms = match (floor_ms, model.routed_step_bytes(batch, context)) {
            (Some(f), Some(bytes)) => Some(f * bytes as f64 / model.weight_bytes() as f64),
            (f, _) => f,
        };
        let of_floor = floor_ms.map_or("-".to_string(), |f| format!("{:.0}%", 100.0 * f / step_ms));
        let replays = model.replays_step(batch, 1, args.input_len + args.output_len);
        let (device_ms, ahead_ms) = if replays {
            let twice = measure(&mut *model, &args, shape, args.output_len, Decode::Twice)?;
            let ahead = measure(&mut *model, &args, shape, args.output_len, Decode::Ahead)?;
            if ahead.tokens != m.tokens {
                anyhow::bail!(
                    "batch {batch}: decoding with each step queued ahead chose other tokens than \
                     the plain decode"
                );
            }
            (
                Some((twice.decode_s - m.decode_s) * 1e3 / steps),
                format!("{:.3}", ahead.decode_s * 1e3 / steps),
            )
        } else {
            (None, "-".to_string())
        };
        if let Some(round_ms) = model.draft_round_ms(batch, context)? {
            rounds.push((batch, step_ms, round_ms));
        }
        if args.verify_rows > 1 {
            let decode = StepCost {
                ms: step_ms,
                device_ms,
            };
            let shape = Shape {
                batch,
                rows: args.verify_rows,
            };
            verified.push((batch, decode, verify_cost(&mut *model, &args, shape)?));
        }
        let device_ms = device_ms.map_or("-".to_string(), |ms| format!("{ms:.3}"));
        println!(
            "{batch:>6} {:>10.2} {:>12.0} {step_ms:>14.3} {:>12.0} {of_floor:>12} {:>12.3} \
             {device_ms:>14} {ahead_ms:>13}",
            m.prefill_s * 1e3,
            (batch * args.input_len) as f64 / m.prefill_s,
            (batch * args.output_len) as f64 / m.decode_s,
            m.host_s * 1e3 / steps,
        );
    }
    if model.routed_step_bytes(1, 1).is_some() {
        println!(
            "of_floor (a mixture of experts): against the bytes a step reads at least: the \
             routed experts its batch is expected to choose, every other weight and the KV \
             rows at the mean context"
        );
    }
    println!(
        "host_ms/step: from the start of a decode step (its plan built on the host) until all \
         of its device work is queued; the rest of decode_ms/step is waiting on the device"
    );
    println!(
        "device_ms/step: the device's time for a decode step with no host work ahead of it: \
         the decode timed again with each step's graph queued twice back to back (the second \
         replay writes the same KV slots and tokens), less the first timing; '-' without \
         graphs"
    );
    println!(
        "ahead_ms/step: the decode again with each step's successor queued before its tokens \
         reach the host, fed them on the device (as the engine's async scheduling does), \
         its tokens checked against the plain decode's; '-' without graphs"
    );
    if !verified.is_empty() {
        print_verified(args.verify_rows, &verified);
    }
    if !rounds.is_empty() {
        println!(
            "{:>6} {:>14} {:>14} {:>14}",
            "batch", "decode_ms/step", "mtp_round_ms", "round/step"
        );
        for (batch, step_ms, round_ms) in rounds {
            println!(
                "{batch:>6} {step_ms:>14.3} {round_ms:>14.3} {:>14.2}",
                round_ms / step_ms
            );
        }
        println!(
            "mtp_round_ms: a drafting round of {} drafts a sequence by the multi-token \
             prediction layer at the mean context: step 0 over each sequence's {} verified \
             rows (fed the feature ring), then the chained steps, through its graphs, each \
             step's drafts downloaded",
            args.mtp_drafts, args.verify_rows
        );
    }
    Ok(())
}

/// What one step costs: wall time, and the device's alone where graphs replay it.
#[derive(Clone, Copy)]
struct StepCost {
    ms: f64,
    device_ms: Option<f64>,
}

/// Times verification steps of `shape` (plain, then queued twice where a graph replays
/// them).
fn verify_cost(
    model: &mut dyn LatencyModel,
    args: &BenchLatencyArgs,
    shape: Shape,
) -> anyhow::Result<StepCost> {
    measure(model, args, shape, 4, Decode::Plain)?;
    let steps = args.output_len as f64;
    let plain = measure(model, args, shape, args.output_len, Decode::Plain)?;
    let longest = args.input_len + args.output_len + shape.rows;
    let device_ms = if model.replays_step(shape.batch, shape.rows, longest) {
        let twice = measure(model, args, shape, args.output_len, Decode::Twice)?;
        Some((twice.decode_s - plain.decode_s) * 1e3 / steps)
    } else {
        None
    };
    Ok(StepCost {
        ms: plain.decode_s * 1e3 / steps,
        device_ms,
    })
}

/// The verification steps' table: each batch's step of `rows` rows per sequence against its
/// one-row decode step.
fn print_verified(rows: usize, verified: &[(usize, StepCost, StepCost)]) {
    println!(
        "{:>6} {:>5} {:>14} {:>14} {:>8} {:>14} {:>14} {:>8}",
        "batch",
        "rows",
        "verify_ms/step",
        "decode_ms/step",
        "ratio",
        "verify_device",
        "decode_device",
        "ratio"
    );
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    for &(batch, decode, verify) in verified {
        let device_ratio = match (verify.device_ms, decode.device_ms) {
            (Some(v), Some(d)) => format!("{:.2}x", v / d),
            _ => "-".to_string(),
        };
        println!(
            "{batch:>6} {rows:>5} {:>14.3} {:>14.3} {:>7.2}x {:>14} {:>14} {device_ratio:>8}",
            verify.ms,
            decode.ms,
            verify.ms / decode.ms,
            ms(verify.device_ms),
            ms(decode.device_ms),
        );
    }
    println!(
        "verify: steps of {rows} rows a sequence (its last token and {} drafts, every row a \
         logit row), at the contexts of the decode steps (each keeps one row, the next writes \
         over the rest), on the GPU through verification graphs; ratio: against the one-row \
         decode step of the same batch",
        rows - 1
    );
}

struct Timing {
    prefill_s: f64,
    decode_s: f64,
    /// Host time of the decode steps until their work was queued (plain decode only).
    host_s: f64,
    /// The tokens each decode step chose.
    tokens: Vec<Vec<u32>>,
}

/// How the decode steps are driven.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Decode {
    /// Each step's tokens reach the host before the next step is staged.
    Plain,
    /// Each step is first queued once more ([`LatencyModel::queue_step`]).
    Twice,
    /// Each step queues the next before its tokens are read
    /// ([`LatencyModel::step_ahead`]).
    Ahead,
}

/// The steps timed: `batch` sequences of `rows` rows each (1: decode).
#[derive(Clone, Copy)]
struct Shape {
    batch: usize,
    rows: usize,
}

/// Prefills `shape.batch` sequences of `input_len` tokens in one step, then decodes `steps`
/// steps of `shape.rows` tokens per sequence, each step asking logits for every row (a
/// sequence's next tokens: its rows' greedy tokens of the step before), driven as `decode`
/// says (`Twice` and `Ahead` only where [`LatencyModel::replays_step`] holds; `Ahead` for
/// one row alone).
fn measure(
    model: &mut dyn LatencyModel,
    args: &BenchLatencyArgs,
    shape: Shape,
    steps: usize,
    decode: Decode,
) -> anyhow::Result<Timing> {
    let Shape { batch, rows: per } = shape;
    let vocab = model.vocab_size() as u32;
    let bs = args.block_size;
    // Step `i` runs rows at positions `input_len + i ..`: it keeps one, as a decode step
    // does, and the next writes over the rest.
    let per_seq = (args.input_len + steps + per).div_ceil(bs);
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    let num_blocks = model.num_blocks();
    let prompt: Vec<u32> = (0..batch * args.input_len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) % vocab)
        .collect();
    let plan_at = |cached: usize, new: usize| {
        let specs: Vec<SeqSpec> = tables
            .iter()
            .map(|t| SeqSpec {
                num_cached: cached,
                num_new: new,
                block_table: t,
            })
            .collect();
        AttentionPlan::new(&specs, bs, num_blocks)
    };
    let plan = plan_at(0, args.input_len)?;
    let last_rows: Vec<usize> = (1..=batch).map(|s| s * args.input_len - 1).collect();
    let start = Instant::now();
    let first = model.step(&prompt, &plan, &last_rows)?.tokens;
    let prefill_s = start.elapsed().as_secs_f64();
    let mut next: Vec<u32> = first
        .iter()
        .flat_map(|&t| std::iter::repeat_n(t, per))
        .collect();
    let rows: Vec<usize> = (0..batch * per).collect();
    let mut tokens = Vec::with_capacity(steps);
    let start = Instant::now();
    let mut host_s = 0.0;
    for step in 0..steps {
        let step_start = Instant::now();
        if decode == Decode::Ahead {
            anyhow::ensure!(
                per == 1,
                "steps queued ahead are decode steps, one row a sequence"
            );
            // The first step's tokens come from the host; every later one was queued by
            // the step before it.
            let this = (step == 0)
                .then(|| plan_at(args.input_len, 1))
                .transpose()?;
            let following = (step + 1 < steps)
                .then(|| plan_at(args.input_len + step + 1, 1))
                .transpose()?;
            let this = this.as_ref().map(|plan| (next.as_slice(), plan));
            next = model.step_ahead(batch, this, following.as_ref())?;
            tokens.push(next.clone());
            continue;
        }
        let plan = plan_at(args.input_len + step, per)?;
        if decode == Decode::Twice {
            model.queue_step(&next, &plan, &rows)?;
        }
        let out = model.step(&next, &plan, &rows)?;
        host_s += (out.queued - step_start).as_secs_f64();
        next = out.tokens;
        tokens.push(next.clone());
    }
    model.synchronize()?;
    Ok(Timing {
        prefill_s,
        decode_s: start.elapsed().as_secs_f64(),
        host_s,
        tokens,
    })
}
