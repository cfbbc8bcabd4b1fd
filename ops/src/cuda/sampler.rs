//! Token sampling on the GPU, over f32 logits `[rows, vocab]` already on the device: each
//! row's grammar mask, then its penalties, are applied in place, then every row is sampled
//! in one launch (greedy argmax, or temperature / top-k / top-p / min-p and one inverse-CDF
//! draw), and the chosen ids come back in one download.
//!
//! The semantics are the CPU sampler's (`crate::sampling`): the kept set of every filter and
//! its probabilities are those of `Sampler::probabilities` up to f32 rounding, and the draw
//! walks the kept tokens in the same order (most likely first, ties to the lower id). The
//! uniform of a non-greedy row comes from the request's own [`Sampler`] through
//! [`Sampler::next_uniform`], the draw `Sampler::sample` makes, so a seeded request is
//! reproducible and consumes its RNG as on the CPU. Greedy rows draw nothing.
//!
//! Penalty history: for each row with a penalty on, the host lists every distinct token of
//! the output (with its count) and, when the repetition penalty is on, of the prompt (count
//! 0 if not in the output); see [`penalty_history`] and
//! `peregrine_kernels::cuda::sampling::sample_penalties`.
//!
//! Grammar masks: the words of every masked row go up in one upload per batch (see
//! [`mask_layout`]) and one launch sets each forbidden logit to −∞, as
//! [`TokenMask::apply`] does on the CPU before the penalties; a batch without masks
//! uploads and launches nothing for them.
//!
//! Biases (`logit_bias`, and `min_tokens`' bans): after the masks, before the penalties,
//! the entries of every row ([`bias_layout`]) go up in one upload and one launch adds them,
//! as `apply_biases` does on the CPU.

use crate::sampling::{bans_apply, logit_adjustments, Sampler, SamplingParams, TokenMask};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use peregrine_kernels::cuda::sampling::{self, SampleRow};
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::{Gpu, GpuError};

/// One row of a batch to sample: the request's sampler (parameters and RNG), the tokens
/// its penalties look at, and its grammar mask.
pub struct SampleRequest<'a> {
    /// The request's sampler; non-greedy rows take one uniform from its RNG.
    pub sampler: &'a mut Sampler,
    /// The request's prompt tokens (only the repetition penalty reads them).
    pub prompt_tokens: &'a [u32],
    /// The tokens generated so far.
    pub output_tokens: &'a [u32],
    /// The tokens the row may sample (a grammar's mask); `None` allows every token.
    pub mask: Option<&'a TokenMask>,
}

/// The kernels' parameters for one row: `params`, with `uniform` as the draw (`None` or
/// ignored when greedy).
pub fn sample_row(params: &SamplingParams, uniform: Option<f64>) -> SampleRow {
    SampleRow {
        uniform: uniform.unwrap_or(0.0),
        temperature: params.temperature,
        top_p: params.top_p,
        min_p: params.min_p,
        top_k: params.top_k,
        repetition_penalty: params.repetition_penalty,
        presence_penalty: params.presence_penalty,
        frequency_penalty: params.frequency_penalty,
        greedy: i32::from(params.is_greedy()),
    }
}

/// The penalty history of a batch, in the layout `sample_penalties` reads: `offsets`
/// (`rows + 1` entries) and `history`, flattened `(token, count)` pairs. Row `r` owns pairs
/// `offsets[r] .. offsets[r + 1]`: each distinct token of its output with its number of
/// occurrences and, when the repetition penalty is on, each other distinct token of its
/// prompt with count 0; ascending token ids; tokens outside `vocab` left out; nothing for
/// a row without penalties.
pub fn penalty_history<'a>(
    vocab: usize,
    rows: impl IntoIterator<Item = (&'a SamplingParams, &'a [u32], &'a [u32])>,
) -> (Vec<i64>, Vec<u32>) {
    let mut offsets = vec![0i64];
    let mut history = Vec::new();
    let mut seen: Vec<(u32, u32)> = Vec::new();
    for (params, prompt, output) in rows {
        if params.has_penalties() {
            seen.clear();
            let in_vocab = |token: &&u32| (**token as usize) < vocab;
            seen.extend(output.iter().filter(in_vocab).map(|&token| (token, 1)));
            if params.repetition_penalty != 1.0 {
                seen.extend(prompt.iter().filter(in_vocab).map(|&token| (token, 0)));
            }
            seen.sort_unstable();
            for group in seen.chunk_by(|a, b| a.0 == b.0) {
                let count: u32 = group.iter().map(|&(_, in_output)| in_output).sum();
                history.extend([group[0].0, count]);
            }
        }
        offsets.push((history.len() / 2) as i64);
    }
    (offsets, history)
}

/// The masks of a batch in the layout `sample_mask` reads, as one buffer (one upload): the
/// indices of the rows with a mask, then each such row's words, cut or padded with zeros
/// (forbidden) to `vocab.div_ceil(32)`; also the number of masked rows, where the words
/// start. Nothing for a batch without masks.
pub fn mask_layout<'m>(
    vocab: usize,
    masks: impl IntoIterator<Item = Option<&'m TokenMask>>,
) -> (usize, Vec<u32>) {
    let width = TokenMask::words_for(vocab);
    let mut rows = Vec::new();
    let mut words = Vec::new();
    for (row, mask) in masks.into_iter().enumerate() {
        let Some(mask) = mask else { continue };
        rows.push(u32::try_from(row).expect("GPU sampler: row index past u32"));
        let given = &mask.words()[..mask.words().len().min(width)];
        words.extend_from_slice(given);
        words.resize(words.len() + width - given.len(), 0);
    }
    let masked = rows.len();
    rows.append(&mut words);
    (masked, rows)
}

/// The biases of a batch in the layout `sample_bias` reads: `(row, token, bits of the
/// addition)` for each row's [`logit_adjustments`] after the tokens it has generated, its
/// stop ids banned where [`bans_apply`] to its mask. Empty for a batch without biases.
pub fn bias_layout(vocab: usize, rows: &[SampleRequest<'_>]) -> Vec<u32> {
    let mut adds = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let (params, generated) = (row.sampler.params(), row.output_tokens.len());
        if !params.biases_after(generated) {
            continue;
        }
        let r = u32::try_from(r).expect("GPU sampler: row index past u32");
        let ban = params.holds_back_stops(generated) && bans_apply(params, row.mask, vocab);
        for (token, add) in logit_adjustments(params, generated, vocab, ban) {
            adds.extend([r, token, add.to_bits()]);
        }
    }
    adds
}

/// The argmax of each of the first `rows` rows of `logits` (`[rows, vocab]`): greedy
/// decoding without penalties, one launch and one download. Ties go to the lowest id; NaN
/// never wins unless a row holds nothing else (then id 0), as on the CPU.
///
/// # Panics
/// If `vocab` is 0 or above 2^24, if `logits` holds fewer than `rows * vocab` values, or if
/// the kernel leaves a row without a token (a bug).
pub fn greedy_tokens(
    kernels: &CudaKernels,
    gpu: &Gpu,
    logits: &CudaView<'_, f32>,
    rows: usize,
    vocab: usize,
) -> Result<Vec<u32>, GpuError> {
    if rows == 0 {
        return Ok(Vec::new());
    }
    let mut tokens = poisoned(gpu, rows)?;
    sampling::sample_argmax(
        kernels,
        gpu.stream(),
        logits,
        vocab,
        &mut tokens.as_view_mut(),
    )?;
    let tokens = gpu.download(&tokens)?;
    check_tokens(&tokens, vocab);
    Ok(tokens)
}

/// Samples the next token of every row of a batch on the GPU (see the module docs).
pub struct GpuSampler<'a> {
    kernels: &'a CudaKernels,
    gpu: &'a Gpu,
}

/// A batch's kernel parameters, uniforms drawn.
struct Prepared {
    params: Vec<SampleRow>,
    /// The parameters on the device, when a kernel other than the argmax needs them.
    params_dev: Option<CudaSlice<SampleRow>>,
    all_greedy: bool,
    any_penalty: bool,
    any_mask: bool,
    any_bias: bool,
}

impl<'a> GpuSampler<'a> {
    /// A sampler that launches `kernels` on `gpu`'s stream.
    pub fn new(kernels: &'a CudaKernels, gpu: &'a Gpu) -> GpuSampler<'a> {
        GpuSampler { kernels, gpu }
    }

    /// The next token of each row: row `r` of `logits` (`[rows.len(), vocab]`) belongs to
    /// `rows[r]`. Masks, then penalties, are applied to `logits` in place first (so they hold
    /// the masked, penalised logits afterwards); every non-greedy row takes one uniform from
    /// its sampler's RNG. One upload of the parameters (plus the masks when a row has one,
    /// and the penalty history when a row has penalties), one launch each, one download of
    /// the ids.
    ///
    /// # Panics
    /// If `vocab` is 0 or above 2^24, if `logits` holds fewer than `rows.len() * vocab`
    /// values, or if a kernel leaves a row without a token (a bug).
    pub fn sample(
        &self,
        logits: &mut CudaViewMut<'_, f32>,
        vocab: usize,
        rows: &mut [SampleRequest<'_>],
    ) -> Result<Vec<u32>, GpuError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let prepared = self.prepare(rows)?;
        self.constrain(logits, vocab, rows, &prepared)?;
        self.finish(&logits.as_view(), vocab, &prepared)
    }

    /// As [`GpuSampler::sample`], for logits that must stay unchanged (such as a model's
    /// output view): when a row has a mask or penalties, the batch's logits are copied on
    /// the device and the copy is masked and penalised.
    pub fn sample_view(
        &self,
        logits: &CudaView<'_, f32>,
        vocab: usize,
        rows: &mut [SampleRequest<'_>],
    ) -> Result<Vec<u32>, GpuError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let prepared = self.prepare(rows)?;
        if !prepared.any_mask && !prepared.any_penalty && !prepared.any_bias {
            return self.finish(logits, vocab, &prepared);
        }
        let n = rows.len() * vocab;
        assert!(
            logits.len() >= n,
            "GPU sampler: {} logits for {n}",
            logits.len()
        );
        let mut copy = self.gpu.stream().clone_dtod(&logits.slice(..n))?;
        self.constrain(&mut copy.as_view_mut(), vocab, rows, &prepared)?;
        self.finish(&copy.as_view(), vocab, &prepared)
    }

    /// Applies each row's penalties to its row of `logits` in place, as the CPU's
    /// `apply_penalties`; row `r` of `logits` belongs to `rows[r]`. Draws nothing.
    pub fn apply_penalties(
        &self,
        logits: &mut CudaViewMut<'_, f32>,
        vocab: usize,
        rows: &[SampleRequest<'_>],
    ) -> Result<(), GpuError> {
        if !rows.iter().any(|row| row.sampler.params().has_penalties()) {
            return Ok(());
        }
        let params: Vec<SampleRow> = rows
            .iter()
            .map(|row| sample_row(row.sampler.params(), None))
            .collect();
        let params_dev = self.gpu.upload(&params)?;
        self.penalise(logits, vocab, &params_dev, history_rows(rows))
    }

    /// Samples `params.len()` rows of `logits` with explicit kernel parameters (uniforms
    /// included) and no penalties; returns each row's token and the number of tokens its
    /// filters kept (1 when greedy). Two downloads: meant for tests and diagnostics.
    pub fn sample_with_params(
        &self,
        logits: &CudaView<'_, f32>,
        vocab: usize,
        params: &[SampleRow],
    ) -> Result<(Vec<u32>, Vec<u32>), GpuError> {
        if params.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let params_dev = self.gpu.upload(params)?;
        let mut tokens = poisoned(self.gpu, params.len())?;
        let mut kept = poisoned(self.gpu, params.len())?;
        sampling::sample_rows(
            self.kernels,
            self.gpu.stream(),
            logits,
            vocab,
            &params_dev.as_view(),
            &mut tokens.as_view_mut(),
            &mut kept.as_view_mut(),
        )?;
        Ok((self.gpu.download(&tokens)?, self.gpu.download(&kept)?))
    }

    /// Draws the uniforms of the non-greedy rows and uploads the parameters if a kernel
    /// other than the argmax will read them.
    fn prepare(&self, rows: &mut [SampleRequest<'_>]) -> Result<Prepared, GpuError> {
        let params: Vec<SampleRow> = rows
            .iter_mut()
            .map(|row| {
                let uniform = row.sampler.next_uniform();
                sample_row(row.sampler.params(), uniform)
            })
            .collect();
        let all_greedy = params.iter().all(|p| p.greedy != 0);
        let any_penalty = rows.iter().any(|row| row.sampler.params().has_penalties());
        let any_mask = rows.iter().any(|row| row.mask.is_some());
        let any_bias = rows.iter().any(|row| {
            let generated = row.output_tokens.len();
            row.sampler.params().biases_after(generated)
        });
        let params_dev = if any_penalty || !all_greedy {
            Some(self.gpu.upload(&params)?)
        } else {
            None
        };
        Ok(Prepared {
            params,
            params_dev,
            all_greedy,
            any_penalty,
            any_mask,
            any_bias,
        })
    }

    /// Masks, biases, then penalises, the batch's `logits` in place, as the CPU does before
    /// its distribution; nothing for a batch without masks, biases or penalties.
    fn constrain(
        &self,
        logits: &mut CudaViewMut<'_, f32>,
        vocab: usize,
        rows: &[SampleRequest<'_>],
        prepared: &Prepared,
    ) -> Result<(), GpuError> {
        if prepared.any_mask {
            let (masked, staged) = mask_layout(vocab, rows.iter().map(|row| row.mask));
            let staged = self.gpu.upload(&staged)?;
            sampling::sample_mask(
                self.kernels,
                self.gpu.stream(),
                logits,
                vocab,
                &staged.slice(..masked),
                &staged.slice(masked..),
            )?;
        }
        let adds = match prepared.any_bias {
            true => bias_layout(vocab, rows),
            false => Vec::new(),
        };
        if !adds.is_empty() {
            let adds = self.gpu.upload(&adds)?;
            sampling::sample_bias(
                self.kernels,
                self.gpu.stream(),
                logits,
                vocab,
                &adds.as_view(),
            )?;
        }
        if let Some(params_dev) = prepared
            .params_dev
            .as_ref()
            .filter(|_| prepared.any_penalty)
        {
            self.penalise(logits, vocab, params_dev, history_rows(rows))?;
        }
        Ok(())
    }

    /// Samples the (penalised) `logits` with the prepared parameters and downloads the ids.
    fn finish(
        &self,
        logits: &CudaView<'_, f32>,
        vocab: usize,
        prepared: &Prepared,
    ) -> Result<Vec<u32>, GpuError> {
        let rows = prepared.params.len();
        match prepared
            .params_dev
            .as_ref()
            .filter(|_| !prepared.all_greedy)
        {
            None => greedy_tokens(self.kernels, self.gpu, logits, rows, vocab),
            Some(params_dev) => {
                let mut tokens = poisoned(self.gpu, rows)?;
                let mut kept = self.gpu.zeros::<u32>(rows)?;
                sampling::sample_rows(
                    self.kernels,
                    self.gpu.stream(),
                    logits,
                    vocab,
                    &params_dev.as_view(),
                    &mut tokens.as_view_mut(),
                    &mut kept.as_view_mut(),
                )?;
                let tokens = self.gpu.download(&tokens)?;
                check_tokens(&tokens, vocab);
                Ok(tokens)
            }
        }
    }

    /// Uploads the history of `batch` and launches the penalty kernel (nothing when no row
    /// lists a token).
    fn penalise<'t>(
        &self,
        logits: &mut CudaViewMut<'_, f32>,
        vocab: usize,
        params: &CudaSlice<SampleRow>,
        batch: impl IntoIterator<Item = (&'t SamplingParams, &'t [u32], &'t [u32])>,
    ) -> Result<(), GpuError> {
        let (offsets, history) = penalty_history(vocab, batch);
        if history.is_empty() {
            return Ok(());
        }
        let offsets = self.gpu.upload(&offsets)?;
        let history = self.gpu.upload(&history)?;
        sampling::sample_penalties(
            self.kernels,
            self.gpu.stream(),
            logits,
            vocab,
            &params.as_view(),
            &offsets.as_view(),
            &history.as_view(),
        )?;
        Ok(())
    }
}

/// Each row's parameters and tokens, as `penalty_history` takes them.
fn history_rows<'t>(
    rows: &'t [SampleRequest<'_>],
) -> impl Iterator<Item = (&'t SamplingParams, &'t [u32], &'t [u32])> {
    rows.iter()
        .map(|row| (row.sampler.params(), row.prompt_tokens, row.output_tokens))
}

/// `n` ids set to `u32::MAX`, so that a row a kernel leaves unwritten is caught.
fn poisoned(gpu: &Gpu, n: usize) -> Result<CudaSlice<u32>, GpuError> {
    gpu.upload(&vec![u32::MAX; n])
}

/// Panics if a kernel left a row without a valid token (a bug, never user input).
fn check_tokens(tokens: &[u32], vocab: usize) {
    for (row, &token) in tokens.iter().enumerate() {
        assert!(
            (token as usize) < vocab,
            "GPU sampler: row {row} got token {token} (vocabulary {vocab}): a kernel bug"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::apply_penalties;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The kernel's arithmetic on the host, over the history layout.
    fn penalise_on_host(params: &SamplingParams, logits: &mut [f32], entries: &[u32]) {
        for pair in entries.chunks_exact(2) {
            let (token, count) = (pair[0] as usize, pair[1]);
            let mut l = logits[token];
            if params.repetition_penalty != 1.0 {
                l = if l > 0.0 {
                    l / params.repetition_penalty
                } else {
                    l * params.repetition_penalty
                };
            }
            if count > 0 && (params.frequency_penalty != 0.0 || params.presence_penalty != 0.0) {
                l -= params.frequency_penalty * count as f32;
                l -= params.presence_penalty;
            }
            logits[token] = l;
        }
    }

    #[test]
    fn the_history_reproduces_the_cpu_penalties() {
        let mut rng = ChaCha8Rng::seed_from_u64(41);
        let vocab = 300;
        let cases = [
            (1.3, 0.4, 0.25),
            (1.0, -1.5, 0.75),
            (0.8, 0.0, 0.0),
            (1.0, 0.0, 0.0),
            (1.0, 0.0, -2.0),
        ];
        let mut rows = Vec::new();
        for &(repetition_penalty, presence_penalty, frequency_penalty) in &cases {
            let params = SamplingParams {
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
                ..Default::default()
            };
            // Ids past the vocabulary and repeats on purpose.
            let prompt: Vec<u32> = (0..80)
                .map(|_| rng.random_range(0..vocab as u32 + 20))
                .collect();
            let output: Vec<u32> = (0..60)
                .map(|_| rng.random_range(0..vocab as u32 / 3))
                .collect();
            let logits: Vec<f32> = (0..vocab).map(|_| rng.random_range(-4.0..4.0)).collect();
            rows.push((params, prompt, output, logits));
        }
        let (offsets, history) = penalty_history(
            vocab,
            rows.iter()
                .map(|(p, prompt, output, _)| (p, prompt.as_slice(), output.as_slice())),
        );
        assert_eq!(offsets.len(), rows.len() + 1);
        assert_eq!(offsets[0], 0);
        assert_eq!(*offsets.last().unwrap() as usize, history.len() / 2);
        for (r, (params, prompt, output, logits)) in rows.iter().enumerate() {
            let entries = &history[2 * offsets[r] as usize..2 * offsets[r + 1] as usize];
            let ids: Vec<u32> = entries.chunks_exact(2).map(|p| p[0]).collect();
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "row {r}: ids unique, ascending"
            );
            assert!(
                ids.iter().all(|&t| (t as usize) < vocab),
                "row {r}: ids in vocab"
            );
            if !params.has_penalties() {
                assert!(entries.is_empty(), "row {r}: no penalties, no history");
            }
            let mut want = logits.clone();
            apply_penalties(params, &mut want, prompt, output);
            let mut got = logits.clone();
            penalise_on_host(params, &mut got, entries);
            assert_eq!(got, want, "row {r}");
        }
    }

    #[test]
    fn the_mask_layout_reproduces_the_cpu_mask() {
        let mut rng = ChaCha8Rng::seed_from_u64(43);
        let vocab = 100;
        let width = TokenMask::words_for(vocab);
        let masks = [
            None,
            Some(TokenMask::from_words(
                (0..width).map(|_| rng.random()).collect(),
                vocab,
            )),
            Some(TokenMask::allowing([0, 31, 32, 99], vocab)),
            None,
            // A smaller vocabulary (a padded row): its tail is forbidden.
            Some(TokenMask::allowing([3, 60, 69], 70)),
            // A larger one: cut to the row.
            Some(TokenMask::from_words(vec![u32::MAX; 5], 150)),
        ];
        let (masked, staged) = mask_layout(vocab, masks.iter().map(Option::as_ref));
        let (rows, words) = staged.split_at(masked);
        assert_eq!(rows, [1, 2, 4, 5]);
        assert_eq!(words.len(), masked * width);
        for (r, mask) in masks.iter().enumerate() {
            let logits: Vec<f32> = (0..vocab).map(|_| rng.random_range(-4.0..4.0)).collect();
            // The kernel's arithmetic on the host, over the staged layout.
            let mut got = logits.clone();
            if let Some(m) = rows.iter().position(|&row| row as usize == r) {
                for (id, logit) in got.iter_mut().enumerate() {
                    if (words[m * width + id / 32] >> (id % 32)) & 1 == 0 {
                        *logit = f32::NEG_INFINITY;
                    }
                }
            }
            let want = mask.as_ref().map_or(logits.clone(), |m| m.applied(&logits));
            assert_eq!(got, want, "row {r}");
        }
        assert_eq!(mask_layout(vocab, [None, None]), (0, Vec::new()));
    }

    #[test]
    fn bias_layout_lists_each_biased_row_s_entries() {
        let biased = SamplingParams {
            logit_bias: vec![(9, 1.5), (2, -3.0), (70, 4.0)],
            min_tokens: 2,
            min_tokens_stop_ids: vec![4],
            ..SamplingParams::greedy()
        };
        let mut samplers: Vec<Sampler> = [SamplingParams::greedy(), biased.clone(), biased]
            .iter()
            .map(|p| Sampler::new(p).unwrap())
            .collect();
        // Row 2's mask allows only its stop id: its ban gives way.
        let only_stop = TokenMask::allowing([4], 64);
        let outputs: [&[u32]; 3] = [&[], &[1], &[]];
        let masks = [None, None, Some(&only_stop)];
        let rows: Vec<SampleRequest> = samplers
            .iter_mut()
            .zip(outputs)
            .zip(masks)
            .map(|((sampler, output), mask)| SampleRequest {
                sampler,
                prompt_tokens: &[],
                output_tokens: output,
                mask,
            })
            .collect();
        let bits = |x: f32| x.to_bits();
        assert_eq!(
            bias_layout(64, &rows),
            vec![
                1,
                2,
                bits(-3.0),
                1,
                4,
                bits(f32::NEG_INFINITY),
                1,
                9,
                bits(1.5),
                2,
                2,
                bits(-3.0),
                2,
                9,
                bits(1.5),
            ]
        );
    }

    #[test]
    fn rows_carry_the_params_and_the_uniform() {
        let params = SamplingParams {
            temperature: 0.7,
            top_k: 12,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.1,
            presence_penalty: 0.5,
            frequency_penalty: -0.5,
            seed: Some(3),
            ..SamplingParams::default()
        };
        let row = sample_row(&params, Some(0.25));
        assert_eq!(
            row,
            SampleRow {
                uniform: 0.25,
                temperature: 0.7,
                top_p: 0.9,
                min_p: 0.05,
                top_k: 12,
                repetition_penalty: 1.1,
                presence_penalty: 0.5,
                frequency_penalty: -0.5,
                greedy: 0,
            }
        );
        assert_eq!(sample_row(&SamplingParams::greedy(), None).greedy, 1);
    }

    #[test]
    #[should_panic(expected = "row 1 got token 4294967295")]
    fn an_unwritten_row_is_caught() {
        check_tokens(&[3, u32::MAX], 10);
    }
}
