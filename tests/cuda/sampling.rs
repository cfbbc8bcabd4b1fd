//! GPU sampling against the CPU sampler, on fresh random logits of real vocabulary sizes:
//! greedy argmax, penalties, grammar masks, the kept set of every filter, the inverse-CDF
//! draw, draw frequencies, determinism, and seeded requests end to end, masked or not,
//! biased (`logit_bias`, `min_tokens`) or not; a verification's greedy verdicts.

use crate::{random_f32, rng, setup, Setup};
use cudarc::driver::CudaSlice;
use peregrine_kernels::cuda::sampling::{
    argmax_partials, greedy_verdicts, sample_argmax_into, sample_mask, ArgmaxCopies, SampleRow,
};
use peregrine_ops::cuda::sampler::{mask_layout, sample_row, GpuSampler, SampleRequest};
use peregrine_ops::sampling::{apply_biases, apply_penalties, Sampler, SamplingParams, TokenMask};
use peregrine_runtime::cuda::MappedHost;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// SmolLM2's and Qwen's vocabulary sizes.
const VOCABS: [usize; 2] = [49_152, 151_936];

/// How far (in cumulative probability) the GPU's inverse CDF may stray from the CPU's:
/// f32 probabilities against f64 ones.
const CDF_EPS: f64 = 1e-5;

/// Relative slack on top-p and min-p when bounding the GPU's kept count by the CPU's.
const FILTER_EPS: f32 = 1e-5;

/// The largest f64 below 1, the largest uniform the RNG can give.
const ALMOST_ONE: f64 = 1.0 - f64::EPSILON / 2.0;

/// Upper 0.001 quantiles of the chi-square distribution for 1..=19 degrees of freedom
/// (standard tables, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4), as in the CPU sampler tests.
const CHI2_CRITICAL_0_001: [f64; 19] = [
    10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264, 32.909,
    34.528, 36.123, 37.697, 39.252, 40.790, 42.312, 43.820,
];

/// The CPU's distribution for `params` over `logits` (no penalties), most likely first.
fn cpu_distribution(params: &SamplingParams, logits: &[f32]) -> Vec<(u32, f64)> {
    Sampler::new(params)
        .expect("valid test params")
        .probabilities(logits, &[], &[])
}

/// The CPU's greedy token.
fn cpu_argmax(logits: &[f32]) -> u32 {
    Sampler::new(&SamplingParams::greedy())
        .unwrap()
        .sample(logits, &[], &[])
}

/// `params` with top-p and min-p moved by `FILTER_EPS` so that they keep fewer tokens
/// (`looser = false`) or more (`true`).
fn nudged(params: &SamplingParams, looser: bool) -> SamplingParams {
    let sign = if looser { 1.0 } else { -1.0 };
    let mut nudged = params.clone();
    if params.top_p < 1.0 {
        nudged.top_p = (params.top_p + sign * FILTER_EPS).clamp(FILTER_EPS, 1.0);
    }
    if params.min_p > 0.0 {
        nudged.min_p = (params.min_p * (1.0 - sign * FILTER_EPS)).min(1.0);
    }
    nudged
}

/// Asserts that `token` is where the CPU's inverse CDF over `dist` puts `u`, up to
/// `CDF_EPS` of a boundary between two tokens.
fn assert_inverse_cdf(what: &str, dist: &[(u32, f64)], u: f64, token: u32) {
    let rank = dist
        .iter()
        .position(|&(t, _)| t == token)
        .unwrap_or_else(|| {
            panic!(
                "{what}: u = {u} drew token {token}, not in the CPU's kept set of {}",
                dist.len()
            )
        });
    let before: f64 = dist[..rank].iter().map(|&(_, p)| p).sum();
    let through = before + dist[rank].1;
    assert!(
        before - CDF_EPS <= u && u < through + CDF_EPS,
        "{what}: u = {u} drew token {token} (rank {rank}), whose CPU interval is \
         [{before}, {through})"
    );
}

/// Asserts two logit rows are bit for bit the same, naming the first difference.
fn assert_same_logits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: logit {i}: GPU {} vs CPU {}", got[i], want[i]);
    }
}

/// `copies` copies of `row` on the device, back to back.
fn replicate(s: &Setup, row: &[f32], copies: usize) -> CudaSlice<f32> {
    let vocab = row.len();
    let src = s.gpu.upload(row).unwrap();
    let mut out = s.gpu.zeros::<f32>(vocab * copies).unwrap();
    for copy in 0..copies {
        let mut dst = out.slice_mut(copy * vocab..(copy + 1) * vocab);
        s.gpu.stream().memcpy_dtod(&src, &mut dst).unwrap();
    }
    out
}

/// Background logits in [-8, -2) with `boosted` distinct random tokens in [lo, hi): a
/// peaked distribution whose mass sits on a few tokens.
fn peaked(rng: &mut ChaCha8Rng, vocab: usize, boosted: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut logits: Vec<f32> = random_f32(rng, vocab, 3.0)
        .into_iter()
        .map(|x| x - 5.0)
        .collect();
    let mut chosen = std::collections::BTreeSet::new();
    while chosen.len() < boosted {
        chosen.insert(rng.random_range(0..vocab));
    }
    for id in chosen {
        logits[id] = rng.random_range(lo..hi);
    }
    logits
}

#[test]
fn greedy_is_the_cpu_argmax() {
    let Some(s) = setup() else { return };
    let mut rng = rng("greedy_is_the_cpu_argmax");
    let sampler = GpuSampler::new(&s.kernels, &s.gpu);
    for vocab in VOCABS {
        let mut rows: Vec<Vec<f32>> = (0..7).map(|_| random_f32(&mut rng, vocab, 8.0)).collect();
        // Two ids share the maximum: the lower wins.
        let a = rng.random_range(0..vocab / 2);
        let b = rng.random_range(vocab / 2..vocab);
        rows[1][b] = 9.0;
        rows[1][a] = 9.0;
        // The maximum at the last id.
        rows[2][vocab - 1] = 9.5;
        // NaNs (never the argmax), the first id included.
        for _ in 0..1000 {
            let i = rng.random_range(0..vocab);
            rows[3][i] = f32::NAN;
        }
        rows[3][0] = f32::NAN;
        // Nothing but NaN and -inf: id 0.
        rows[4] = (0..vocab)
            .map(|i| {
                if i % 3 == 0 {
                    f32::NEG_INFINITY
                } else {
                    f32::NAN
                }
            })
            .collect();
        // -0 and +0 tie at the maximum (IEEE equal): the lower id wins.
        let (c, d) = (
            rng.random_range(0..vocab / 2),
            rng.random_range(vocab / 2..vocab),
        );
        rows[5] = rows[5].iter().map(|x| -x.abs() - 0.1).collect();
        rows[5][c] = -0.0;
        rows[5][d] = 0.0;
        // +inf beats everything.
        rows[6][rng.random_range(0..vocab)] = f32::INFINITY;
        let want: Vec<u32> = rows.iter().map(|row| cpu_argmax(row)).collect();
        assert_eq!(want[1], a as u32, "test setup: tie");
        assert_eq!(want[2], vocab as u32 - 1, "test setup: last id");
        assert_eq!(want[4], 0, "test setup: no finite logit");
        assert_eq!(want[5], c as u32, "test setup: signed zeros");

        let mut logits = s.gpu.upload(&rows.concat()).unwrap();
        // All rows greedy: the argmax kernel.
        let mut samplers: Vec<Sampler> = rows
            .iter()
            .map(|_| Sampler::new(&SamplingParams::greedy()).unwrap())
            .collect();
        let mut requests: Vec<SampleRequest> = samplers
            .iter_mut()
            .map(|sampler| SampleRequest {
                sampler,
                prompt_tokens: &[],
                output_tokens: &[],
                mask: None,
            })
            .collect();
        let got = sampler
            .sample(&mut logits.as_view_mut(), vocab, &mut requests)
            .unwrap();
        assert_eq!(got, want, "vocab {vocab}: sample_argmax");

        // A decode graph's hand-over: the same tokens also written as i32 token ids and
        // into mapped page-locked memory, both poisoned first.
        let n = rows.len();
        let mut ids = s.gpu.upload(&vec![u32::MAX; n]).unwrap();
        let mut fed = s.gpu.upload(&vec![-7i32; n + 1]).unwrap();
        let published = MappedHost::<u32>::new(s.gpu.stream(), n + 1).unwrap();
        let mut partial = s.gpu.zeros::<u64>(argmax_partials(n, vocab)).unwrap();
        let copies = ArgmaxCopies {
            fed: Some(fed.slice_mut(0..n)),
            published: Some(&published),
        };
        let (view, mut out) = (logits.as_view(), ids.as_view_mut());
        sample_argmax_into(
            &s.kernels,
            s.gpu.stream(),
            &view,
            vocab,
            &mut partial,
            &mut out,
            copies,
        )
        .unwrap();
        s.gpu.synchronize().unwrap();
        assert_eq!(s.gpu.download(&ids).unwrap(), want, "vocab {vocab}: ids");
        let fed = s.gpu.download(&fed).unwrap();
        let fed_want: Vec<i32> = want.iter().map(|&t| t as i32).chain([-7]).collect();
        assert_eq!(fed, fed_want, "vocab {vocab}: fed ids, and no more");
        let mut published_want = want.clone();
        published_want.push(0);
        assert_eq!(
            published.read(n + 1),
            published_want,
            "vocab {vocab}: published"
        );

        // The greedy path of the sampling kernel, next to a sampled row.
        let mut params: Vec<SampleRow> = rows
            .iter()
            .map(|_| sample_row(&SamplingParams::greedy(), None))
            .collect();
        params[0] = sample_row(&SamplingParams::default(), Some(0.5));
        let (tokens, kept) = sampler
            .sample_with_params(&logits.as_view(), vocab, &params)
            .unwrap();
        assert_eq!(
            tokens[1..],
            want[1..],
            "vocab {vocab}: sample_rows, greedy rows"
        );
        assert!(
            kept[1..].iter().all(|&k| k == 1),
            "greedy rows keep one token"
        );
        assert_ne!(tokens[0], u32::MAX, "the sampled row was written");
        eprintln!("greedy, vocab {vocab}: {} rows match", rows.len());
    }
}

#[test]
fn penalties_match_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("penalties_match_the_cpu");
    let sampler = GpuSampler::new(&s.kernels, &s.gpu);
    // (repetition, presence, frequency)
    let configs = [
        (1.3, 0.4, 0.25),
        (0.7, 0.0, 0.0),
        (1.0, -1.5, 0.75),
        (1.0, 0.0, 0.0),
        (1.1, 2.0, -2.0),
        (1.0, 0.0, 1.0),
        (2.5, -0.3, 0.0),
    ];
    for vocab in VOCABS {
        let vocab_u = vocab as u32;
        let mut params = Vec::new();
        let mut prompts = Vec::new();
        let mut outputs = Vec::new();
        let mut rows = Vec::new();
        for &(repetition_penalty, presence_penalty, frequency_penalty) in &configs {
            params.push(SamplingParams {
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
                ..Default::default()
            });
            // Prompt: spread over the vocabulary, a few ids past it.
            prompts.push(
                (0..2000)
                    .map(|_| rng.random_range(0..vocab_u + 50))
                    .collect::<Vec<u32>>(),
            );
            // Output: from a small pool so tokens repeat, some shared with the prompt.
            let pool: Vec<u32> = (0..40).map(|_| rng.random_range(0..vocab_u + 3)).collect();
            outputs.push(
                (0..300)
                    .map(|_| pool[rng.random_range(0..pool.len())])
                    .collect::<Vec<u32>>(),
            );
            rows.push(random_f32(&mut rng, vocab, 10.0));
        }
        let mut samplers: Vec<Sampler> = params.iter().map(|p| Sampler::new(p).unwrap()).collect();
        let requests: Vec<SampleRequest> = samplers
            .iter_mut()
            .zip(prompts.iter().zip(&outputs))
            .map(|(sampler, (prompt, output))| SampleRequest {
                sampler,
                prompt_tokens: prompt,
                output_tokens: output,
                mask: None,
            })
            .collect();
        let mut logits = s.gpu.upload(&rows.concat()).unwrap();
        sampler
            .apply_penalties(&mut logits.as_view_mut(), vocab, &requests)
            .unwrap();
        let got = s.gpu.download(&logits).unwrap();
        for (r, row) in rows.iter().enumerate() {
            let mut want = row.clone();
            apply_penalties(&params[r], &mut want, &prompts[r], &outputs[r]);
            let changed = want.iter().zip(row).filter(|(a, b)| a != b).count();
            assert!(
                changed > 0 || configs[r] == (1.0, 0.0, 0.0),
                "test setup: row {r} unchanged"
            );
            assert_same_logits(
                &format!("vocab {vocab}, row {r} {:?}", configs[r]),
                &got[r * vocab..(r + 1) * vocab],
                &want,
            );
        }
        eprintln!("penalties, vocab {vocab}: {} rows bit-exact", rows.len());
    }
}

/// A mask over `vocab` tokens allowing each with probability `density`, never `except`.
fn random_mask(rng: &mut ChaCha8Rng, vocab: usize, density: f64, except: &[u32]) -> TokenMask {
    let allowed: Vec<u32> = (0..vocab as u32)
        .filter(|id| rng.random_bool(density) && !except.contains(id))
        .collect();
    TokenMask::allowing(allowed, vocab)
}

#[test]
fn the_mask_kernel_is_token_mask_apply() {
    let Some(s) = setup() else { return };
    let mut rng = rng("the_mask_kernel_is_token_mask_apply");
    // A NaN with a payload no kernel writes: rows past the batch must keep it.
    let poison = f32::from_bits(0x7fc0_dead);
    let spare = 2;
    // GPT-2's vocabulary (not a multiple of 32) and Llama 3's.
    for vocab in [50_257, 128_256] {
        let sparse: Vec<u32> = (0..5).map(|_| rng.random_range(0..vocab as u32)).collect();
        let masks = [
            None,
            Some(random_mask(&mut rng, vocab, 0.5, &[])),
            Some(TokenMask::allowing(sparse, vocab)),
            None,
            Some(random_mask(&mut rng, vocab, 0.97, &[])),
            // A padded row: the mask's vocabulary is smaller, its tail forbidden.
            Some(random_mask(&mut rng, vocab - 45, 0.5, &[])),
            Some(TokenMask::allowing([], vocab)),
            None,
        ];
        let rows = masks.len();
        let logits = random_f32(&mut rng, rows * vocab, 8.0);
        let mut buffer = s.gpu.upload(&vec![poison; (rows + spare) * vocab]).unwrap();
        s.gpu
            .stream()
            .memcpy_htod(&logits, &mut buffer.slice_mut(..rows * vocab))
            .unwrap();
        // The sampler's layout, plus a row past the batch that forbids everything: the
        // kernel must skip it.
        let (masked, staged) = mask_layout(vocab, masks.iter().map(Option::as_ref));
        let mut row_ids = staged[..masked].to_vec();
        row_ids.push(rows as u32);
        let mut words = staged[masked..].to_vec();
        words.resize(words.len() + TokenMask::words_for(vocab), 0);
        let (row_ids, words) = (
            s.gpu.upload(&row_ids).unwrap(),
            s.gpu.upload(&words).unwrap(),
        );
        sample_mask(
            &s.kernels,
            s.gpu.stream(),
            &mut buffer.slice_mut(..rows * vocab),
            vocab,
            &row_ids.as_view(),
            &words.as_view(),
        )
        .unwrap();
        let got = s.gpu.download(&buffer).unwrap();
        for (r, mask) in masks.iter().enumerate() {
            let before = &logits[r * vocab..(r + 1) * vocab];
            let want = mask
                .as_ref()
                .map_or_else(|| before.to_vec(), |m| m.applied(before));
            if mask.is_some() {
                assert!(
                    want.contains(&f32::NEG_INFINITY),
                    "test setup: row {r} forbids nothing"
                );
            }
            assert_same_logits(
                &format!("vocab {vocab}, row {r}"),
                &got[r * vocab..(r + 1) * vocab],
                &want,
            );
        }
        assert!(
            got[rows * vocab..]
                .iter()
                .all(|l| l.to_bits() == poison.to_bits()),
            "vocab {vocab}: the kernel wrote past the batch"
        );
        eprintln!("mask kernel, vocab {vocab}: {rows} rows ({masked} masked) bit-exact");
    }
}

/// One row of the filter tests.
struct Case {
    name: &'static str,
    params: SamplingParams,
    logits: Vec<f32>,
}

/// Rows covering every filter alone and together, ties, and non-finite logits.
fn filter_cases(rng: &mut ChaCha8Rng, vocab: usize) -> Vec<Case> {
    let with = |temperature: f32, top_k: i32, top_p: f32, min_p: f32| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..Default::default()
    };
    let mut cases = vec![
        Case {
            name: "temperature 0.8",
            params: with(0.8, 0, 1.0, 0.0),
            logits: random_f32(rng, vocab, 8.0),
        },
        Case {
            name: "top-k 1",
            params: with(1.0, 1, 1.0, 0.0),
            logits: random_f32(rng, vocab, 8.0),
        },
        Case {
            name: "top-k 20",
            params: with(0.7, 20, 1.0, 0.0),
            logits: random_f32(rng, vocab, 8.0),
        },
        Case {
            name: "top-k 20 among thousands of tied logits",
            params: with(1.0, 20, 1.0, 0.0),
            logits: random_f32(rng, vocab, 8.0)
                .into_iter()
                .map(|x| (x * 2.0).round() / 2.0)
                .collect(),
        },
        Case {
            name: "top-p 0.5 among thousands of tied logits",
            params: with(1.0, 0, 0.5, 0.0),
            logits: random_f32(rng, vocab, 8.0)
                .into_iter()
                .map(|x| (x * 2.0).round() / 2.0)
                .collect(),
        },
        Case {
            name: "top-k 5000",
            params: with(1.3, 5000, 1.0, 0.0),
            logits: random_f32(rng, vocab, 8.0),
        },
        Case {
            name: "top-k past the vocabulary (off)",
            params: with(1.0, vocab as i32 + 5, 1.0, 0.0),
            logits: random_f32(rng, vocab, 4.0),
        },
        Case {
            name: "top-p 0.5, flat",
            params: with(1.0, 0, 0.5, 0.0),
            logits: random_f32(rng, vocab, 8.0),
        },
        Case {
            name: "top-p 0.9, peaked",
            params: with(0.9, 0, 0.9, 0.0),
            logits: peaked(rng, vocab, 50, 6.0, 10.0),
        },
        Case {
            name: "top-p 0.999",
            params: with(1.0, 0, 0.999, 0.0),
            logits: random_f32(rng, vocab, 8.0),
        },
        Case {
            name: "min-p 0.1",
            params: with(1.0, 0, 1.0, 0.1),
            logits: random_f32(rng, vocab, 8.0),
        },
        Case {
            name: "min-p 0.02, hot",
            params: with(1.5, 0, 1.0, 0.02),
            logits: random_f32(rng, vocab, 4.0),
        },
        Case {
            name: "top-k 200, top-p 0.85, min-p 0.05",
            params: with(0.8, 200, 0.85, 0.05),
            logits: peaked(rng, vocab, 300, 4.0, 8.0),
        },
        Case {
            name: "greedy among sampled rows",
            params: SamplingParams::greedy(),
            logits: random_f32(rng, vocab, 8.0),
        },
    ];
    let mut non_finite = random_f32(rng, vocab, 8.0);
    for _ in 0..1000 {
        let i = rng.random_range(0..vocab);
        non_finite[i] = f32::NAN;
        let j = rng.random_range(0..vocab);
        non_finite[j] = f32::NEG_INFINITY;
    }
    non_finite[0] = f32::NAN;
    cases.push(Case {
        name: "NaN and -inf logits, top-p 0.95",
        params: with(1.0, 0, 0.95, 0.0),
        logits: non_finite,
    });
    let mut two_inf = random_f32(rng, vocab, 8.0);
    two_inf[rng.random_range(0..vocab / 2)] = f32::INFINITY;
    two_inf[rng.random_range(vocab / 2..vocab)] = f32::INFINITY;
    cases.push(Case {
        name: "two +inf logits share the mass",
        params: with(1.0, 0, 1.0, 0.0),
        logits: two_inf,
    });
    cases.push(Case {
        name: "only NaN and -inf",
        params: with(1.0, 10, 0.9, 0.0),
        logits: (0..vocab)
            .map(|i| {
                if i % 2 == 0 {
                    f32::NAN
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect(),
    });
    cases
}

/// The uniforms a case is drawn with: the midpoints of the CPU intervals of its first 20
/// tokens likely enough to be told apart, a few random ones, and both ends.
fn case_uniforms(rng: &mut ChaCha8Rng, dist: &[(u32, f64)]) -> Vec<f64> {
    let mut uniforms = vec![0.0, ALMOST_ONE];
    let mut before = 0.0;
    for &(_, p) in dist.iter().take(20) {
        if p > 4.0 * CDF_EPS {
            uniforms.push(before + p / 2.0);
        }
        before += p;
    }
    uniforms.extend((0..6).map(|_| rng.random::<f64>()));
    uniforms
}

#[test]
fn filters_keep_the_cpu_set_and_the_draw_inverts_the_cpu_cdf() {
    let Some(s) = setup() else { return };
    let mut rng = rng("filters_keep_the_cpu_set_and_the_draw_inverts_the_cpu_cdf");
    let sampler = GpuSampler::new(&s.kernels, &s.gpu);
    for vocab in VOCABS {
        let cases = filter_cases(&mut rng, vocab);
        let mut flat = Vec::new();
        let mut params = Vec::new();
        // Per row: (case index, uniform).
        let mut rows = Vec::new();
        let mut expected = Vec::new();
        for (c, case) in cases.iter().enumerate() {
            let dist = cpu_distribution(&case.params, &case.logits);
            let fewest = cpu_distribution(&nudged(&case.params, false), &case.logits).len();
            let most = cpu_distribution(&nudged(&case.params, true), &case.logits).len();
            for u in case_uniforms(&mut rng, &dist) {
                flat.extend_from_slice(&case.logits);
                params.push(sample_row(&case.params, Some(u)));
                rows.push((c, u));
            }
            expected.push((dist, fewest, most));
        }
        let logits = s.gpu.upload(&flat).unwrap();
        drop(flat);
        let (tokens, kept) = sampler
            .sample_with_params(&logits.as_view(), vocab, &params)
            .unwrap();
        let mut exact = 0;
        for (row, &(c, u)) in rows.iter().enumerate() {
            let case = &cases[c];
            let (dist, fewest, most) = &expected[c];
            let what = format!("vocab {vocab}, {}, u = {u}", case.name);
            assert_ne!(tokens[row], u32::MAX, "{what}: row left unwritten");
            let n = kept[row] as usize;
            assert!(
                (*fewest..=*most).contains(&n),
                "{what}: GPU kept {n} tokens, CPU {} (between {fewest} and {most} with the \
                 filters nudged by {FILTER_EPS})",
                dist.len()
            );
            if fewest == most {
                assert_eq!(n, dist.len(), "{what}: kept set size");
                assert_inverse_cdf(&what, dist, u, tokens[row]);
                exact += 1;
            } else {
                let loose = cpu_distribution(&nudged(&case.params, true), &case.logits);
                assert!(
                    loose.iter().any(|&(t, _)| t == tokens[row]),
                    "{what}: token {} outside the loosest kept set",
                    tokens[row]
                );
            }
        }
        for (case, (dist, ..)) in cases.iter().zip(&expected) {
            eprintln!("vocab {vocab}, {}: CPU keeps {}", case.name, dist.len());
        }
        eprintln!(
            "vocab {vocab}: {} rows, {exact} checked exactly against the CPU's CDF",
            rows.len()
        );

        // The same (logits, params, uniform) gives the same token, whatever else is in the
        // batch and wherever the row sits: run the batch again backwards.
        let order: Vec<usize> = (0..rows.len()).rev().collect();
        let mut reversed_logits = s.gpu.zeros::<f32>(rows.len() * vocab).unwrap();
        for (to, &from) in order.iter().enumerate() {
            let src = logits.slice(from * vocab..(from + 1) * vocab);
            let mut dst = reversed_logits.slice_mut(to * vocab..(to + 1) * vocab);
            s.gpu.stream().memcpy_dtod(&src, &mut dst).unwrap();
        }
        let reversed_params: Vec<SampleRow> = order.iter().map(|&r| params[r]).collect();
        let (again, kept_again) = sampler
            .sample_with_params(&reversed_logits.as_view(), vocab, &reversed_params)
            .unwrap();
        for (to, &from) in order.iter().enumerate() {
            assert_eq!(
                again[to], tokens[from],
                "vocab {vocab}: row {from} moved to {to}"
            );
            assert_eq!(
                kept_again[to], kept[from],
                "vocab {vocab}: row {from} moved to {to}"
            );
        }
    }
}

#[test]
fn draw_frequencies_fit_the_cpu_probabilities() {
    const DRAWS: usize = 4000;
    let Some(s) = setup() else { return };
    let mut rng = rng("draw_frequencies_fit_the_cpu_probabilities");
    let sampler = GpuSampler::new(&s.kernels, &s.gpu);
    let vocab = 49_152;
    let configs = [
        (
            "top-k 20",
            SamplingParams {
                top_k: 20,
                ..Default::default()
            },
            (24, 5.0, 6.0),
        ),
        (
            "top-p 0.8",
            SamplingParams {
                temperature: 0.9,
                top_p: 0.8,
                ..Default::default()
            },
            (16, 4.0, 6.5),
        ),
        (
            "min-p 0.1",
            SamplingParams {
                temperature: 1.2,
                min_p: 0.1,
                ..Default::default()
            },
            (16, 3.0, 6.0),
        ),
        (
            "top-k 20, top-p 0.9, min-p 0.05",
            SamplingParams {
                temperature: 0.7,
                top_k: 20,
                top_p: 0.9,
                min_p: 0.05,
                ..Default::default()
            },
            (30, 4.0, 6.0),
        ),
    ];
    for (name, params, (boosted, lo, hi)) in configs {
        let row = peaked(&mut rng, vocab, boosted, lo, hi);
        let dist = cpu_distribution(&params, &row);
        assert!(
            (2..=20).contains(&dist.len()),
            "{name}: test setup: {} tokens kept",
            dist.len()
        );
        let uniforms: Vec<f64> = (0..DRAWS).map(|_| rng.random()).collect();
        let params_rows: Vec<SampleRow> = uniforms
            .iter()
            .map(|&u| sample_row(&params, Some(u)))
            .collect();
        let logits = replicate(s, &row, DRAWS);
        let (tokens, kept) = sampler
            .sample_with_params(&logits.as_view(), vocab, &params_rows)
            .unwrap();
        drop(logits);
        assert!(
            kept.iter().all(|&n| n as usize == dist.len()),
            "{name}: kept sizes differ from the CPU's {}",
            dist.len()
        );
        let mut chi2 = 0.0;
        for &(token, p) in &dist {
            let expected = DRAWS as f64 * p;
            assert!(
                expected >= 5.0,
                "{name}: test setup: expected count {expected} < 5"
            );
            let seen = tokens.iter().filter(|&&t| t == token).count() as f64;
            chi2 += (seen - expected).powi(2) / expected;
        }
        let outside = tokens
            .iter()
            .filter(|&&t| !dist.iter().any(|&(k, _)| k == t))
            .count();
        assert_eq!(outside, 0, "{name}: drew tokens the filters remove");
        let critical = CHI2_CRITICAL_0_001[dist.len() - 2];
        assert!(
            chi2 < critical,
            "{name}: chi-square {chi2} >= {critical} with {} degrees of freedom",
            dist.len() - 1
        );
        eprintln!(
            "{name}: {} tokens kept, chi-square {chi2:.2} (critical {critical})",
            dist.len()
        );
        // Every draw is also the CPU's inverse-CDF pick for its uniform.
        for (&u, &token) in uniforms.iter().zip(&tokens) {
            assert_inverse_cdf(name, &dist, u, token);
        }
    }
}

/// One run of seeded requests through `GpuSampler`, step by step, each step checked
/// against the CPU sampler on the same history (and the row masked by `masks[step][r]`, as
/// `sample_on_host` does); returns every request's output. Masks, biases and penalises the
/// logits in place (`GpuSampler::sample`) or a copy (`sample_view`, `in_place` false).
fn run_seeded(
    s: &Setup,
    configs: &[SamplingParams],
    prompts: &[Vec<u32>],
    steps: &[Vec<f32>],
    masks: &[Vec<Option<TokenMask>>],
    vocab: usize,
    in_place: bool,
) -> Vec<Vec<u32>> {
    let gpu_sampler = GpuSampler::new(&s.kernels, &s.gpu);
    let mut samplers: Vec<Sampler> = configs.iter().map(|p| Sampler::new(p).unwrap()).collect();
    let mut cpu = samplers.clone();
    let mut outputs: Vec<Vec<u32>> = vec![Vec::new(); configs.len()];
    for ((step, flat), step_masks) in steps.iter().enumerate().zip(masks) {
        let uniforms: Vec<Option<f64>> = samplers
            .iter()
            .map(|sampler| sampler.clone().next_uniform())
            .collect();
        let mut logits = s.gpu.upload(flat).unwrap();
        let tokens = {
            let mut requests: Vec<SampleRequest> = samplers
                .iter_mut()
                .zip(prompts.iter().zip(&outputs))
                .zip(step_masks)
                .map(|((sampler, (prompt, output)), mask)| SampleRequest {
                    sampler,
                    prompt_tokens: prompt,
                    output_tokens: output,
                    mask: mask.as_ref(),
                })
                .collect();
            if in_place {
                gpu_sampler.sample(&mut logits.as_view_mut(), vocab, &mut requests)
            } else {
                gpu_sampler.sample_view(&logits.as_view(), vocab, &mut requests)
            }
            .unwrap()
        };
        let after = s.gpu.download(&logits).unwrap();
        for r in 0..configs.len() {
            let what = format!("step {step}, request {r}");
            let unmasked = &flat[r * vocab..(r + 1) * vocab];
            let mask = step_masks[r].as_ref();
            let row = mask.map_or_else(|| unmasked.to_vec(), |m| m.applied(unmasked));
            let mut want = unmasked.to_vec();
            if in_place {
                want.clone_from(&row);
                apply_biases(&configs[r], &mut want, outputs[r].len());
                apply_penalties(&configs[r], &mut want, &prompts[r], &outputs[r]);
            }
            assert_same_logits(&what, &after[r * vocab..(r + 1) * vocab], &want);
            let cpu_token = cpu[r].sample(&row, &prompts[r], &outputs[r]);
            match uniforms[r] {
                None => assert_eq!(tokens[r], cpu_token, "{what}: greedy"),
                Some(u) if tokens[r] != cpu_token => {
                    let dist = cpu[r].probabilities(&row, &prompts[r], &outputs[r]);
                    assert_inverse_cdf(&what, &dist, u, tokens[r]);
                }
                Some(_) => {}
            }
            if let Some(mask) = mask {
                assert!(
                    mask.allows(tokens[r]),
                    "{what}: forbidden token {}",
                    tokens[r]
                );
            }
            outputs[r].push(tokens[r]);
        }
    }
    // Both backends consumed their RNGs alike.
    for (r, (gpu, cpu)) in samplers.iter().zip(&cpu).enumerate() {
        assert_eq!(
            gpu.clone().next_uniform(),
            cpu.clone().next_uniform(),
            "request {r}: RNG state"
        );
    }
    outputs
}

#[test]
fn seeded_requests_are_reproducible_and_follow_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("seeded_requests_are_reproducible_and_follow_the_cpu");
    let vocab = 151_936;
    let configs = [
        SamplingParams {
            temperature: 0.8,
            top_k: 50,
            seed: Some(11),
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 1.2,
            seed: Some(12),
            ..SamplingParams::greedy()
        },
        SamplingParams {
            top_p: 0.9,
            presence_penalty: 0.5,
            frequency_penalty: 0.3,
            seed: Some(13),
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.6,
            min_p: 0.05,
            repetition_penalty: 1.1,
            seed: Some(14),
            ..Default::default()
        },
        SamplingParams {
            seed: Some(15),
            ..Default::default()
        },
    ];
    let prompts: Vec<Vec<u32>> = configs
        .iter()
        .map(|_| (0..64).map(|_| rng.random_range(0..vocab as u32)).collect())
        .collect();
    // Peaked rows so that tokens repeat and the penalties matter.
    let steps: Vec<Vec<f32>> = (0..8)
        .map(|_| {
            (0..configs.len())
                .flat_map(|_| peaked(&mut rng, vocab, 40, 2.0, 5.0))
                .collect()
        })
        .collect();
    let masks = vec![vec![None; configs.len()]; steps.len()];
    let first = run_seeded(s, &configs, &prompts, &steps, &masks, vocab, true);
    let second = run_seeded(s, &configs, &prompts, &steps, &masks, vocab, false);
    assert_eq!(first, second, "a seeded request gave different tokens");
    eprintln!("seeded outputs: {first:?}");
}

#[test]
fn masked_requests_follow_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("masked_requests_follow_the_cpu");
    let vocab = 128_256;
    // The padded row's mask covers this many tokens fewer than the row.
    let padding = 300;
    let configs = [
        // Greedy, its unmasked argmax forbidden.
        SamplingParams::greedy(),
        SamplingParams {
            repetition_penalty: 1.2,
            seed: Some(21),
            ..SamplingParams::greedy()
        },
        // Greedy, unmasked.
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.8,
            top_k: 50,
            repetition_penalty: 1.1,
            seed: Some(22),
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.9,
            presence_penalty: 0.5,
            frequency_penalty: 0.3,
            seed: Some(23),
            ..Default::default()
        },
        // The padded row.
        SamplingParams {
            temperature: 1.2,
            top_k: 20,
            top_p: 0.8,
            seed: Some(24),
            ..Default::default()
        },
        // Unmasked.
        SamplingParams {
            min_p: 0.05,
            seed: Some(25),
            ..Default::default()
        },
        // Three tokens allowed.
        SamplingParams {
            seed: Some(26),
            ..Default::default()
        },
    ];
    let prompts: Vec<Vec<u32>> = configs
        .iter()
        .map(|_| (0..64).map(|_| rng.random_range(0..vocab as u32)).collect())
        .collect();
    let mut steps = Vec::new();
    let mut masks = Vec::new();
    for _ in 0..6 {
        let mut rows: Vec<Vec<f32>> = (0..configs.len())
            .map(|_| peaked(&mut rng, vocab, 40, 2.0, 5.0))
            .collect();
        // The padded row's most likely tokens lie in its forbidden tail.
        for logit in &mut rows[5][vocab - padding..vocab - padding + 10] {
            *logit = 9.0;
        }
        let argmax = cpu_argmax(&rows[0]);
        let few: Vec<u32> = (0..3).map(|_| rng.random_range(0..vocab as u32)).collect();
        let step_masks = vec![
            Some(random_mask(&mut rng, vocab, 0.3, &[argmax])),
            Some(random_mask(&mut rng, vocab, 0.3, &[])),
            None,
            Some(random_mask(&mut rng, vocab, 0.3, &[])),
            Some(random_mask(&mut rng, vocab, 0.3, &[])),
            Some(random_mask(&mut rng, vocab - padding, 0.3, &[])),
            None,
            Some(TokenMask::allowing(few, vocab)),
        ];
        steps.push(rows.concat());
        masks.push(step_masks);
    }
    let first = run_seeded(s, &configs, &prompts, &steps, &masks, vocab, true);
    let second = run_seeded(s, &configs, &prompts, &steps, &masks, vocab, false);
    assert_eq!(
        first, second,
        "a seeded masked request gave different tokens"
    );
    eprintln!("masked seeded outputs: {first:?}");
}

#[test]
fn biased_requests_follow_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("biased_requests_follow_the_cpu");
    let vocab = 49_152;
    let steps_n = 6;
    let rows: Vec<Vec<Vec<f32>>> = (0..steps_n)
        .map(|_| {
            (0..6)
                .map(|_| peaked(&mut rng, vocab, 40, 2.0, 5.0))
                .collect()
        })
        .collect();
    // Each row's biases: the argmax of every step pushed down hard, eight random tokens
    // pulled up (the first of them is also a stop id, so that `min_tokens` changes the
    // token), one id past the vocabulary (ignored); its stop ids: that token and another.
    let argmaxes =
        |r: usize| -> Vec<u32> { rows.iter().map(|step| cpu_argmax(&step[r])).collect() };
    let configs: Vec<SamplingParams> = (0..6)
        .map(|r| {
            let pulled: Vec<u32> = (0..8).map(|_| rng.random_range(0..vocab as u32)).collect();
            let mut logit_bias: Vec<(u32, f32)> =
                argmaxes(r).iter().map(|&id| (id, -100.0)).collect();
            logit_bias.extend(pulled.iter().map(|&id| (id, 4.5)));
            logit_bias.push((vocab as u32 + 3, 50.0));
            let stops = vec![pulled[0], rng.random_range(0..vocab as u32)];
            let base = match r % 2 {
                0 => SamplingParams::greedy(),
                _ => SamplingParams {
                    temperature: 0.9,
                    top_k: 60,
                    frequency_penalty: 0.4,
                    seed: Some(40 + r as u64),
                    ..Default::default()
                },
            };
            SamplingParams {
                // Row 4: biases only; row 5: `min_tokens` only.
                logit_bias: if r == 5 { Vec::new() } else { logit_bias },
                min_tokens: if r == 4 { 0 } else { 3 },
                min_tokens_stop_ids: stops,
                ..base
            }
        })
        .collect();
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|_| (0..32).map(|_| rng.random_range(0..vocab as u32)).collect())
        .collect();
    // Row 1's mask allows only its stop ids at first: the ban must give way there.
    let masks: Vec<Vec<Option<TokenMask>>> = (0..steps_n)
        .map(|step| {
            (0..6)
                .map(|r| match (r, step) {
                    (1, 0) => Some(TokenMask::allowing(
                        configs[1].min_tokens_stop_ids.clone(),
                        vocab,
                    )),
                    (2, _) => Some(random_mask(&mut rng, vocab, 0.4, &[])),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let steps: Vec<Vec<f32>> = rows.iter().map(|step| step.concat()).collect();
    let first = run_seeded(s, &configs, &prompts, &steps, &masks, vocab, true);
    let second = run_seeded(s, &configs, &prompts, &steps, &masks, vocab, false);
    assert_eq!(
        first, second,
        "a seeded biased request gave different tokens"
    );
    for (r, output) in first.iter().enumerate() {
        let stops = &configs[r].min_tokens_stop_ids;
        if configs[r].min_tokens > 0 && r != 1 {
            assert!(
                !output[..3].iter().any(|id| stops.contains(id)),
                "row {r}: {output:?}"
            );
        }
    }
    assert!(
        configs[1].min_tokens_stop_ids.contains(&first[1][0]),
        "row 1 took its only token"
    );
    eprintln!("biased seeded outputs: {first:?}");
}

#[test]
fn masked_draws_never_pick_a_forbidden_token() {
    const DRAWS: usize = 2048;
    let Some(s) = setup() else { return };
    let mut rng = rng("masked_draws_never_pick_a_forbidden_token");
    let sampler = GpuSampler::new(&s.kernels, &s.gpu);
    let vocab = 50_257;
    let row = peaked(&mut rng, vocab, 60, 4.0, 8.0);
    let mask = random_mask(&mut rng, vocab, 0.25, &[]);
    let configs = [
        SamplingParams {
            temperature: 1.5,
            ..Default::default()
        },
        SamplingParams {
            top_k: 8,
            top_p: 0.95,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.7,
            min_p: 0.01,
            ..Default::default()
        },
    ];
    // Every third row unmasked, so that a mask landing on the wrong row shows.
    let masked = |r: usize| r % 3 != 2;
    let params: Vec<SamplingParams> = (0..DRAWS)
        .map(|r| SamplingParams {
            seed: Some(rng.random()),
            ..configs[r % configs.len()].clone()
        })
        .collect();
    let masked_row = mask.applied(&row);
    let dists: Vec<[Vec<(u32, f64)>; 2]> = configs
        .iter()
        .map(|p| [cpu_distribution(p, &row), cpu_distribution(p, &masked_row)])
        .collect();
    for (c, [unmasked, _]) in dists.iter().enumerate() {
        let forbidden: f64 = unmasked
            .iter()
            .filter(|&&(t, _)| !mask.allows(t))
            .map(|&(_, p)| p)
            .sum();
        assert!(
            forbidden > 0.3,
            "test setup: config {c}: forbidden mass {forbidden}"
        );
    }
    let mut samplers: Vec<Sampler> = params.iter().map(|p| Sampler::new(p).unwrap()).collect();
    let uniforms: Vec<f64> = samplers
        .iter()
        .map(|sampler| sampler.clone().next_uniform().unwrap())
        .collect();
    let mut logits = replicate(s, &row, DRAWS);
    let mut requests: Vec<SampleRequest> = samplers
        .iter_mut()
        .enumerate()
        .map(|(r, sampler)| SampleRequest {
            sampler,
            prompt_tokens: &[],
            output_tokens: &[],
            mask: Some(&mask).filter(|_| masked(r)),
        })
        .collect();
    let tokens = sampler
        .sample(&mut logits.as_view_mut(), vocab, &mut requests)
        .unwrap();
    drop(logits);
    let mut unmasked_forbidden = 0;
    for (r, (&token, &u)) in tokens.iter().zip(&uniforms).enumerate() {
        let what = format!("row {r}, config {}", r % configs.len());
        let dist = &dists[r % configs.len()][usize::from(masked(r))];
        assert_inverse_cdf(&what, dist, u, token);
        if masked(r) {
            assert!(mask.allows(token), "{what}: forbidden token {token}");
        } else if !mask.allows(token) {
            unmasked_forbidden += 1;
        }
    }
    assert!(
        unmasked_forbidden > 0,
        "unmasked rows never drew a token the mask forbids"
    );
    eprintln!(
        "masked draws: {DRAWS} rows, {} masked, none forbidden; unmasked rows drew {unmasked_forbidden} \
         forbidden tokens",
        (0..DRAWS).filter(|&r| masked(r)).count()
    );
}

/// Times the sampling kernel on a [rows, 151,936] batch for a few parameter sets, on flat
/// random logits and on peaked ones (most of the mass on 40 tokens, like a model's), and
/// the mask kernel on the same batch.
/// Prints; asserts nothing. Run with `--ignored`.
#[test]
#[ignore = "timing, not a check"]
fn sampling_speed() {
    let Some(s) = setup() else { return };
    let mut rng = rng("sampling_speed");
    let sampler = GpuSampler::new(&s.kernels, &s.gpu);
    let vocab = 151_936;
    let configs = [
        ("greedy", SamplingParams::greedy()),
        ("temperature 1", SamplingParams::default()),
        (
            "top-k 50",
            SamplingParams {
                top_k: 50,
                ..Default::default()
            },
        ),
        (
            "top-p 0.9",
            SamplingParams {
                top_p: 0.9,
                ..Default::default()
            },
        ),
        (
            "top-k 50, top-p 0.9, min-p 0.05",
            SamplingParams {
                top_k: 50,
                top_p: 0.9,
                min_p: 0.05,
                ..Default::default()
            },
        ),
    ];
    for (shape, row) in [
        ("flat", random_f32(&mut rng, vocab, 8.0)),
        ("peaked", peaked(&mut rng, vocab, 40, 2.0, 8.0)),
    ] {
        for rows in [1, 64, 256] {
            let logits = replicate(s, &row, rows);
            for (name, params) in &configs {
                let params: Vec<SampleRow> = (0..rows)
                    .map(|_| sample_row(params, Some(rng.random())))
                    .collect();
                sampler
                    .sample_with_params(&logits.as_view(), vocab, &params)
                    .unwrap();
                let rounds = 10;
                let start = std::time::Instant::now();
                for _ in 0..rounds {
                    sampler
                        .sample_with_params(&logits.as_view(), vocab, &params)
                        .unwrap();
                }
                let ms = start.elapsed().as_secs_f64() * 1e3 / rounds as f64;
                eprintln!("speed: {shape}, {rows} rows, {name}: {ms:.3} ms");
            }
            // The mask kernel alone, every row masked (the words staged once).
            let mask = random_mask(&mut rng, vocab, 0.3, &[]);
            let (masked, staged) = mask_layout(vocab, (0..rows).map(|_| Some(&mask)));
            let staged = s.gpu.upload(&staged).unwrap();
            let mut copy = s.gpu.stream().clone_dtod(&logits).unwrap();
            let rounds = 10;
            let mut elapsed = std::time::Duration::ZERO;
            for round in 0..=rounds {
                let start = std::time::Instant::now();
                sample_mask(
                    &s.kernels,
                    s.gpu.stream(),
                    &mut copy.as_view_mut(),
                    vocab,
                    &staged.slice(..masked),
                    &staged.slice(masked..),
                )
                .unwrap();
                s.gpu.synchronize().unwrap();
                if round > 0 {
                    elapsed += start.elapsed();
                }
            }
            let ms = elapsed.as_secs_f64() * 1e3 / rounds as f64;
            eprintln!("speed: {shape}, {rows} rows, mask kernel: {ms:.3} ms");
        }
    }
}

/// A verification's greedy verdicts on the device against the host's `accept_greedy`:
/// sequences of 1 to 5 rows (the last token and up to 4 drafts), each draft made the argmax
/// of the row before it with probability 0.7 (so chains of every length occur), random
/// otherwise; the output poisoned first, one entry past it left so.
#[test]
fn greedy_verdicts_count_the_drafts_each_sequence_accepts_as_the_host_does() {
    let Some(s) = setup() else {
        return;
    };
    let mut rng = rng("greedy_verdicts_count_the_drafts_each_sequence_accepts_as_the_host_does");
    let g = &s.gpu;
    let mut seen = [0usize; 5];
    for round in 0..20 {
        let n = rng.random_range(1..=40usize);
        let mut starts = vec![0usize];
        for _ in 0..n {
            starts.push(starts.last().unwrap() + rng.random_range(1..=5usize));
        }
        let rows = *starts.last().unwrap();
        let ids: Vec<u32> = (0..rows).map(|_| rng.random_range(0..50_000)).collect();
        let mut tokens: Vec<u32> = (0..rows).map(|_| rng.random_range(0..50_000)).collect();
        for w in starts.windows(2) {
            for r in w[0] + 1..w[1] {
                if rng.random_bool(0.7) {
                    tokens[r] = ids[r - 1];
                }
            }
        }
        let want: Vec<usize> = starts
            .windows(2)
            .map(|w| {
                peregrine_ops::sampling::accept_greedy(&ids[w[0]..w[1]], &tokens[w[0] + 1..w[1]])
                    .accepted
            })
            .collect();
        let d_ids = g.upload(&ids).unwrap();
        let d_tokens = g
            .upload(&tokens.iter().map(|&t| t as i32).collect::<Vec<_>>())
            .unwrap();
        let d_starts = g
            .upload(&starts.iter().map(|&r| r as i32).collect::<Vec<_>>())
            .unwrap();
        let mut out = g.upload(&vec![-5i32; n + rows + 1]).unwrap();
        greedy_verdicts(
            &s.kernels,
            g.stream(),
            (&d_ids.as_view(), &d_tokens.as_view()),
            &d_starts.as_view(),
            &mut out.slice_mut(0..n + rows),
            n,
        )
        .unwrap();
        let got = g.download(&out).unwrap();
        let accepted: Vec<usize> = got[..n].iter().map(|&a| a as usize).collect();
        assert_eq!(accepted, want, "round {round}: accepted drafts");
        let back: Vec<u32> = got[n..n + rows].iter().map(|&id| id as u32).collect();
        assert_eq!(back, ids, "round {round}: the ids");
        assert_eq!(got[n + rows], -5, "round {round}: past the output");
        for a in want {
            seen[a] += 1;
        }
    }
    assert!(
        seen.iter().all(|&c| c > 0),
        "accepted counts seen: {seen:?}"
    );
}
