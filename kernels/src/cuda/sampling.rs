//! Launchers of the token-sampling kernels (`cuda/sampling.cu`): greedy argmax, grammar
//! masks and penalties applied in place, and the sampled path (temperature, top-k, top-p, min-p and one
//! inverse-CDF draw per row with a uniform chosen by the host).
//!
//! Every kernel runs one block per row of the `[rows, vocab]` f32 logits, so a row's result
//! never depends on the other rows. The sampled path ranks tokens by logit, descending,
//! ties to the lower id (the CPU sampler's order), as unique 64-bit (logit, id) keys. Each
//! filter's cut, and the drawn token, is found without a sort: a histogram over 2048 bins
//! linear in the logit picks the bin where the running count (top-k) or mass (top-p, the
//! draw) passes its target, then that bin's few tokens are ranked exactly in shared memory
//! (a radix select over their keys when the bin holds over 1024). Probability mass is
//! summed as fixed-point integers (`exp((logit - max) / T) * 2^40`), so the token is a
//! deterministic function of the logits, the parameters and the uniform. The draw walks
//! the kept tokens most likely first, as the CPU does, so the same uniform gives the CPU's
//! token unless it falls within rounding (about 1e-6) of a boundary of the cumulative
//! distribution. See `cuda/sampling.cu` for the details.

use super::{grid, CudaKernels};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr, DriverError};
use peregrine_runtime::cuda::MappedHost;
use std::sync::Arc;

/// Threads per row of the sampling kernel (`SAMPLE_THREADS`).
const THREADS: u32 = 1024;
/// Threads of the argmax's partial kernel (`ARGMAX_THREADS`), and the logits each block
/// reduces (`ARGMAX_CHUNK`).
const ARGMAX_THREADS: u32 = 256;
const ARGMAX_CHUNK: usize = 256 * 16;
/// Threads per row of the penalty kernel (`SAMPLE_PENALTY_THREADS`).
const PENALTY_THREADS: u32 = 256;
/// Threads of the mask kernel (`SAMPLE_MASK_THREADS`), and the tokens each block covers
/// (`SAMPLE_MASK_CHUNK`).
const MASK_THREADS: u32 = 256;
const MASK_CHUNK: usize = 256 * 8;
/// The largest vocabulary the kernels take: fixed-point masses of up to `2^40` a token
/// must sum below `2^64`.
pub const MAX_VOCAB: usize = 1 << 24;

/// One row's sampling parameters, laid out as `struct SampleRow` in `cuda/sampling.cu`.
/// Build it from a request's parameters (`peregrine_ops::cuda::sampler::sample_row`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SampleRow {
    /// The uniform in `[0, 1)` the draw inverts (ignored when greedy).
    pub uniform: f64,
    /// Divides the logits; must be > 0 unless `greedy`.
    pub temperature: f32,
    /// Keep the smallest most-likely set reaching this mass; 1.0 is off.
    pub top_p: f32,
    /// Drop tokens less likely than this times the most likely; 0.0 is off.
    pub min_p: f32,
    /// Keep the `top_k` most likely tokens; `<= 0` or `>= vocab` is off.
    pub top_k: i32,
    /// Divides positive (multiplies negative) logits of seen tokens; 1.0 is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every output token; 0.0 is off.
    pub presence_penalty: f32,
    /// Subtracted once per occurrence in the output; 0.0 is off.
    pub frequency_penalty: f32,
    /// Nonzero: the argmax, nothing drawn.
    pub greedy: i32,
}

// SAFETY: `repr(C)` plain numbers with no padding (8 + 8 * 4 bytes), the layout of the
// kernel's `struct SampleRow`.
unsafe impl DeviceRepr for SampleRow {}

/// Checks the shapes shared by every launcher and returns `vocab` as the kernels' `int`.
fn vocab_arg(what: &str, vocab: usize, rows: usize, logits: usize) -> i32 {
    assert!(
        (1..=MAX_VOCAB).contains(&vocab),
        "{what}: vocab {vocab} outside 1..={MAX_VOCAB}"
    );
    assert!(
        rows <= i32::MAX as usize,
        "{what}: {rows} rows exceed the grid"
    );
    assert!(
        logits >= rows * vocab,
        "{what}: {logits} logits for {rows} rows of {vocab}"
    );
    vocab as i32
}

/// Greedy decoding: `tokens[r]` = the argmax of row `r` of `logits` (ties: lowest id; NaN
/// never wins unless the whole row is NaN or -inf, then 0), for `tokens.len()` rows. Each
/// row is cut into chunks reduced by separate blocks, then one warp per row reduces those.
pub fn sample_argmax(
    k: &CudaKernels,
    stream: &Arc<CudaStream>,
    logits: &CudaView<f32>,
    vocab: usize,
    tokens: &mut CudaViewMut<u32>,
) -> Result<(), DriverError> {
    let rows = tokens.len();
    if rows == 0 {
        return Ok(());
    }
    // SAFETY: every element is written by sample_argmax_partial before the finish kernel,
    // queued after it on the same stream, reads it.
    let mut partial = unsafe { stream.alloc::<u64>(argmax_partials(rows, vocab)) }?;
    sample_argmax_into(
        k,
        stream,
        logits,
        vocab,
        &mut partial,
        tokens,
        ArgmaxCopies::default(),
    )
}

/// The `u64` scratch [`sample_argmax_into`] needs for `rows` rows of `vocab` logits.
pub fn argmax_partials(rows: usize, vocab: usize) -> usize {
    rows * vocab.div_ceil(ARGMAX_CHUNK)
}

/// Where the argmax also writes each row's token, besides its `tokens`: a decode graph's
/// hand-over to the step after it and to the host.
#[derive(Default)]
pub struct ArgmaxCopies<'a> {
    /// The token ids of the step after (one per row, as `i32`).
    pub fed: Option<CudaViewMut<'a, i32>>,
    /// Page-locked host memory the host reads once the argmax has run (one per row).
    pub published: Option<&'a MappedHost<u32>>,
}

/// [`sample_argmax`] with its scratch given (at least [`argmax_partials`] elements), also
/// writing each token where `copies` says: it allocates nothing, so a graph can capture it.
pub fn sample_argmax_into(
    k: &CudaKernels,
    stream: &Arc<CudaStream>,
    logits: &CudaView<f32>,
    vocab: usize,
    partial: &mut CudaSlice<u64>,
    tokens: &mut CudaViewMut<u32>,
    copies: ArgmaxCopies,
) -> Result<(), DriverError> {
    let rows = tokens.len();
    let vocab_i = vocab_arg("sample_argmax", vocab, rows, logits.len());
    if rows == 0 {
        return Ok(());
    }
    let chunks = vocab.div_ceil(ARGMAX_CHUNK);
    assert!(
        partial.len() >= argmax_partials(rows, vocab),
        "sample_argmax: scratch too small"
    );
    if let Some(fed) = &copies.fed {
        assert!(
            fed.len() >= rows,
            "sample_argmax: {} fed ids for {rows} rows",
            fed.len()
        );
    }
    let published = copies.published.map_or(0, |p| {
        assert!(
            p.len() >= rows,
            "sample_argmax: {} published ids for {rows} rows",
            p.len()
        );
        p.device_address()
    });
    let blocks = u32::try_from(rows * chunks).expect("sample_argmax: grid too large");
    let chunks_i = chunks as i32;
    let mut launch = k.launch(stream, "sample_argmax_partial");
    launch
        .arg(logits)
        .arg(&vocab_i)
        .arg(&chunks_i)
        .arg(&mut *partial);
    // SAFETY: `logits` holds `rows * vocab` elements (checked above) and every block reads
    // only indices below `vocab` of its row; block b writes `partial[b]`, and `partial`
    // holds one element per block.
    unsafe { launch.launch(grid(blocks, ARGMAX_THREADS, 0)) }?;
    let null: u64 = 0;
    let mut launch = k.launch(stream, "sample_argmax_finish");
    launch.arg(&*partial).arg(&chunks_i).arg(tokens);
    let mut fed = copies.fed;
    match &mut fed {
        Some(fed) => launch.arg(fed),
        None => launch.arg(&null),
    };
    launch.arg(&published);
    // SAFETY: one warp per row reads that row's `chunks` partial keys and writes its token
    // to `tokens`, and to `fed` and `published` where given (null otherwise); each of them
    // holds at least `rows` elements (checked above), and `published` is mapped page-locked
    // memory that outlives the launch (a `MappedHost` waits for the stream when dropped).
    unsafe { launch.launch(grid(rows as u32, 32, 0)) }?;
    Ok(())
}

/// Applies grammar masks in place, as `peregrine_ops::sampling::TokenMask::apply` does:
/// masked row `m` is row `rows[m]` of `logits` (`[logits.len() / vocab, vocab]`), and every
/// token whose bit is clear in `words[m * w .. (m + 1) * w]`, `w = vocab.div_ceil(32)`, gets
/// −∞ (bit `id % 32` of word `id / 32` allows token `id`, `TokenMask`'s layout). Allowed
/// logits and rows not listed are neither read nor written. A mask over a smaller
/// vocabulary than the row's (a padded LM head) must be padded with zero words, which
/// forbid the tail. Rows past the logits are skipped by the kernel; a row listed twice is
/// only forbidden twice.
pub fn sample_mask(
    k: &CudaKernels,
    stream: &CudaStream,
    logits: &mut CudaViewMut<f32>,
    vocab: usize,
    rows: &CudaView<u32>,
    words: &CudaView<u32>,
) -> Result<(), DriverError> {
    let total_rows = logits.len() / vocab.max(1);
    let vocab_i = vocab_arg("sample_mask", vocab, total_rows, logits.len());
    let masked = rows.len();
    let width = vocab.div_ceil(32);
    assert!(
        words.len() >= masked * width,
        "sample_mask: {} mask words for {masked} rows of {width}",
        words.len()
    );
    if masked == 0 {
        return Ok(());
    }
    let chunks = vocab.div_ceil(MASK_CHUNK);
    let blocks = u32::try_from(masked * chunks).expect("sample_mask: grid too large");
    let (total_rows_i, chunks_i) = (total_rows as i32, chunks as i32);
    let mut launch = k.launch(stream, "sample_mask");
    launch
        .arg(logits)
        .arg(&vocab_i)
        .arg(&total_rows_i)
        .arg(&chunks_i)
        .arg(rows)
        .arg(words);
    // SAFETY: block b reads `rows[b / chunks]` (`rows` holds `masked` elements) and words of
    // that masked row below `masked * width` (checked above), and writes only tokens below
    // `vocab` of a row below `total_rows`, which `logits` holds (`vocab_arg`).
    unsafe { launch.launch(grid(blocks, MASK_THREADS, 0)) }?;
    Ok(())
}

/// Queues the greedy verdicts of a verification step of `rows` rows: for each of the `n`
/// sequences, whose rows are `starts[s]..starts[s + 1]` (`n + 1` increasing offsets ending at
/// `rows`: its last token, then its drafts), `out[s]` = the drafts it accepts (each while the
/// argmax `ids` of the row before equals the draft in `tokens`, the step's token ids), and
/// `out[n + r] = ids[r]`. The offsets' order and range are the caller's check.
pub fn greedy_verdicts(
    k: &CudaKernels,
    stream: &CudaStream,
    (ids, tokens): (&CudaView<u32>, &CudaView<i32>),
    starts: &CudaView<i32>,
    out: &mut CudaViewMut<i32>,
    n: usize,
) -> Result<(), DriverError> {
    let rows = ids.len();
    assert!(
        tokens.len() >= rows && starts.len() > n && out.len() >= n + rows,
        "greedy_verdicts: {rows} rows, {n} sequences: short buffers"
    );
    let threads = n.max(rows);
    if threads == 0 {
        return Ok(());
    }
    let i32_of = |v: usize| i32::try_from(v).expect("greedy_verdicts: a size past i32");
    let (n_i, rows_i) = (i32_of(n), i32_of(rows));
    let blocks = u32::try_from(threads.div_ceil(256)).expect("greedy_verdicts: grid too large");
    let mut launch = k.launch(stream, "greedy_verdicts");
    launch
        .arg(ids)
        .arg(tokens)
        .arg(starts)
        .arg(out)
        .arg(&n_i)
        .arg(&rows_i);
    // SAFETY: thread i reads ids[i] and writes out[n + i] below `rows`, and for i < n reads
    // starts[i..=i + 1] (`starts` holds n + 1) and ids and tokens within them (the caller's
    // offsets end at `rows`, which both hold); `out` holds n + rows (checked above).
    unsafe { launch.launch(grid(blocks, 256, 0)) }?;
    Ok(())
}

/// Adds each entry of `adds` to one logit of `logits` (`[rows, vocab]`) in place: entries
/// are three u32s, `(row, token, f32::to_bits(value))`, at most one per row and token
/// (`peregrine_ops::sampling::logit_adjustments`' order); a value of −∞ bans the token.
/// Entries past the logits' rows or the vocabulary are skipped by the kernel.
pub fn sample_bias(
    k: &CudaKernels,
    stream: &CudaStream,
    logits: &mut CudaViewMut<f32>,
    vocab: usize,
    adds: &CudaView<u32>,
) -> Result<(), DriverError> {
    let total_rows = logits.len() / vocab.max(1);
    let vocab_i = vocab_arg("sample_bias", vocab, total_rows, logits.len());
    assert!(
        adds.len() % 3 == 0,
        "sample_bias: {} words are not whole entries of three",
        adds.len()
    );
    let entries = adds.len() / 3;
    if entries == 0 {
        return Ok(());
    }
    let entries_i = i32::try_from(entries).expect("sample_bias: too many entries");
    let total_rows_i = total_rows as i32;
    let blocks = u32::try_from(entries.div_ceil(256)).expect("sample_bias: grid too large");
    let mut launch = k.launch(stream, "sample_bias");
    launch
        .arg(logits)
        .arg(&vocab_i)
        .arg(&total_rows_i)
        .arg(&entries_i)
        .arg(adds);
    // SAFETY: thread e < entries reads words 3e..3e+3 of `adds` (which holds 3 * entries)
    // and writes one logit of a row below `total_rows` at a token below `vocab`, which
    // `logits` holds (`vocab_arg`).
    unsafe { launch.launch(grid(blocks, 256, 0)) }?;
    Ok(())
}

/// Applies each row's penalties (`params[r]`'s repetition, presence and frequency
/// penalties) to `logits` in place, as `peregrine_ops::sampling::apply_penalties` does,
/// for `params.len()` rows.
///
/// History layout: row `r` owns entries `offsets[r] .. offsets[r + 1]` of `history`, an
/// entry being two `u32`s, `(token, count)`: every distinct token of the row's prompt and
/// output once, `count` = its occurrences in the output (0 for prompt-only tokens). The
/// repetition penalty applies to every entry, frequency and presence to entries with
/// `count > 0`. `offsets` has `rows + 1` elements. Entries outside `history` and tokens
/// outside the vocabulary are ignored by the kernel; a token listed twice in one row would
/// race, so the host must not do that.
pub fn sample_penalties(
    k: &CudaKernels,
    stream: &CudaStream,
    logits: &mut CudaViewMut<f32>,
    vocab: usize,
    params: &CudaView<SampleRow>,
    offsets: &CudaView<i64>,
    history: &CudaView<u32>,
) -> Result<(), DriverError> {
    let rows = params.len();
    let vocab_i = vocab_arg("sample_penalties", vocab, rows, logits.len());
    assert_eq!(
        offsets.len(),
        rows + 1,
        "sample_penalties: offsets need rows + 1 elements"
    );
    assert!(
        history.len() % 2 == 0,
        "sample_penalties: history holds (token, count) pairs"
    );
    if rows == 0 || history.is_empty() {
        return Ok(());
    }
    let entries = (history.len() / 2) as i64;
    let mut launch = k.launch(stream, "sample_penalties");
    launch
        .arg(logits)
        .arg(&vocab_i)
        .arg(params)
        .arg(offsets)
        .arg(history)
        .arg(&entries);
    // SAFETY: `logits` holds `rows * vocab` elements, `params` `rows` and `offsets`
    // `rows + 1` (checked above); the kernel clamps entry ranges to `entries` (the pairs in
    // `history`) and skips tokens >= vocab, so every access stays inside the buffers.
    unsafe { launch.launch(grid(rows as u32, PENALTY_THREADS, 0)) }?;
    Ok(())
}

/// Samples one token per row for `params.len()` rows of (already penalised) `logits`:
/// greedy rows take the argmax; the others apply temperature, top-k, top-p and min-p as
/// the CPU sampler's distribution and draw with `params[r].uniform` by inverse CDF over
/// the kept tokens, most likely first (ties: lower id). `tokens[r]` gets the token
/// (`u32::MAX` only if the kernel failed, a bug) and `kept[r]` the number of tokens the
/// filters kept (1 when greedy).
pub fn sample_rows(
    k: &CudaKernels,
    stream: &CudaStream,
    logits: &CudaView<f32>,
    vocab: usize,
    params: &CudaView<SampleRow>,
    tokens: &mut CudaViewMut<u32>,
    kept: &mut CudaViewMut<u32>,
) -> Result<(), DriverError> {
    let rows = params.len();
    let vocab_i = vocab_arg("sample_rows", vocab, rows, logits.len());
    assert!(
        tokens.len() >= rows && kept.len() >= rows,
        "sample_rows: short output buffers"
    );
    if rows == 0 {
        return Ok(());
    }
    let mut launch = k.launch(stream, "sample_rows");
    launch
        .arg(logits)
        .arg(&vocab_i)
        .arg(params)
        .arg(tokens)
        .arg(kept);
    // SAFETY: `logits` holds `rows * vocab` elements, `params`, `tokens` and `kept` at
    // least `rows` (checked above); one block per row, each reading its own row and
    // parameters and writing its own outputs.
    unsafe { launch.launch(grid(rows as u32, THREADS, 0)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_row_has_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<SampleRow>(), 40);
        assert_eq!(std::mem::align_of::<SampleRow>(), 8);
        assert_eq!(std::mem::offset_of!(SampleRow, temperature), 8);
        assert_eq!(std::mem::offset_of!(SampleRow, top_k), 20);
        assert_eq!(std::mem::offset_of!(SampleRow, greedy), 36);
    }

    #[test]
    fn the_source_agrees_with_the_launcher_constants() {
        let source = include_str!("../../cuda/sampling.cu");
        for line in [
            format!("#define SAMPLE_THREADS {THREADS}\n"),
            format!("#define SAMPLE_PENALTY_THREADS {PENALTY_THREADS}\n"),
            format!("#define SAMPLE_MASK_THREADS {MASK_THREADS}\n"),
            format!(
                "#define SAMPLE_MASK_PER_THREAD {}\n",
                MASK_CHUNK / MASK_THREADS as usize
            ),
            format!("#define ARGMAX_THREADS {ARGMAX_THREADS}\n"),
            format!(
                "#define ARGMAX_PER_THREAD {}\n",
                ARGMAX_CHUNK / ARGMAX_THREADS as usize
            ),
        ] {
            assert!(source.contains(&line), "sampling.cu lacks `{line}`");
        }
    }
}
