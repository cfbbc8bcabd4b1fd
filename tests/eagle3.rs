//! EAGLE-3 heads on the CPU: random heads written in the published format (config.json
//! with a reduced draft vocabulary, safetensors with `midlayer.` or `layers.0.` names and an
//! int64 `d2t`) next to a tiny random target, loaded and run through step 0 (two prompt
//! chunks, so the second reads the first from the paged KV cache) and two more steps, and
//! compared with a dense float64 reference written here (full-history causal attention,
//! its own RoPE and RMSNorm, no paging). The target's auxiliary hidden states are compared
//! with the float64 reference target's layer inputs, and bad checkpoints are refused with
//! errors that name the field or tensor. Through the serving engine, greedy outputs with
//! EAGLE-3 drafts equal those without speculation, token for token.

mod common;

use common::eagle3_head::{HeadSpec, RandomHead};
use common::engine::{collect, submit};
use common::first_two::{
    assert_first_two_follow, assert_uniform_drafts_accepted, cpu_distribution,
    first_two_distributions,
};
use common::reference::RefModel;
use common::tiny_model::{TinyModel, TinySpec};
use peregrine_actors::backend::{cpu_backend, PoolInfo};
use peregrine_actors::draft::{DraftMethod, Eagle3, LAZY_ROWS};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::messages::{
    HiddenData, HiddenRows, ProposeSeq, RequestId, SchedulerLimits, Usage,
};
use peregrine_models::eagle3::{Eagle3Config, Eagle3Head, HeadInput};
use peregrine_models::{ForwardError, LlamaModel, Weights};
use peregrine_ops::sampling::SamplingParams;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;

const BLOCK: usize = 4;
const NUM_BLOCKS: u64 = 64;
const TARGET_LAYERS: usize = 4;

// ---------------------------------------------------------------------------------------
// The float64 reference head: dense causal attention over one sequence's whole history.

struct RefHead {
    w: BTreeMap<String, Vec<f64>>,
    prefix: &'static str,
    embed: Vec<f64>,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    draft_vocab: usize,
    eps: f64,
    inv_freq: Vec<f64>,
    norm_before_residual: bool,
    d2t: Vec<i64>,
}

/// One sequence's keys and values so far, every row kept.
#[derive(Default)]
struct RefHistory {
    k: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
}

impl RefHead {
    fn new(s: &HeadSpec, head: &RandomHead, target: &TinyModel) -> RefHead {
        let widen = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let w = head
            .tensors
            .iter()
            .map(|(n, (_, v))| (n.clone(), widen(v)))
            .collect::<BTreeMap<_, _>>();
        let embed = if s.own_embed {
            w["embed_tokens.weight"].clone()
        } else {
            widen(&target.tensors["model.embed_tokens.weight"].1)
        };
        let d = s.head_dim();
        let linear = s.rope_linear.unwrap_or(1.0);
        let inv_freq = (0..d / 2)
            .map(|i| 1.0 / s.rope_theta.powf(2.0 * i as f64 / d as f64) / linear)
            .collect();
        RefHead {
            w,
            prefix: s.prefix,
            embed,
            hidden: s.hidden,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: d,
            intermediate: s.intermediate,
            draft_vocab: s.draft_vocab,
            eps: 1e-5,
            inv_freq,
            norm_before_residual: s.norm_before_residual,
            d2t: head.d2t.clone(),
        }
    }

    fn t(&self, name: &str) -> &[f64] {
        &self.w[&format!("{}.{name}", self.prefix)]
    }

    /// `fc` of one row of auxiliary hidden states.
    fn fc(&self, aux: &[f64]) -> Vec<f64> {
        mat_vec(&self.w["fc.weight"], aux)
    }

    /// One row at `pos` after every row already in `history`: its draft logits and `pre`.
    fn step(
        &self,
        history: &mut RefHistory,
        token: u32,
        g: &[f64],
        pos: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let (h, d) = (self.hidden, self.head_dim);
        let t = token as usize;
        let e = &self.embed[t * h..(t + 1) * h];
        let gn = rms_norm(g, self.t("hidden_norm.weight"), self.eps);
        let mut u = rms_norm(e, self.t("input_layernorm.weight"), self.eps);
        u.extend_from_slice(&gn);
        let mut q = mat_vec(self.t("self_attn.q_proj.weight"), &u);
        let mut k = mat_vec(self.t("self_attn.k_proj.weight"), &u);
        let v = mat_vec(self.t("self_attn.v_proj.weight"), &u);
        for head in q.chunks_mut(d).chain(k.chunks_mut(d)) {
            rope(head, pos, &self.inv_freq);
        }
        history.k.push(k);
        history.v.push(v);
        let group = self.heads / self.kv_heads;
        let mut attn = vec![0.0; self.heads * d];
        for hh in 0..self.heads {
            let kv = hh / group;
            let qh = &q[hh * d..(hh + 1) * d];
            let scores: Vec<f64> = history
                .k
                .iter()
                .map(|k| dot(qh, &k[kv * d..(kv + 1) * d]) / (d as f64).sqrt())
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for (j, ej) in e.iter().enumerate() {
                for c in 0..d {
                    attn[hh * d + c] += ej / z * history.v[j][kv * d + c];
                }
            }
        }
        let o = mat_vec(self.t("self_attn.o_proj.weight"), &attn);
        let r = if self.norm_before_residual {
            gn
        } else {
            g.to_vec()
        };
        let h1: Vec<f64> = r.iter().zip(&o).map(|(r, o)| r + o).collect();
        let n = rms_norm(&h1, self.t("post_attention_layernorm.weight"), self.eps);
        let gate = mat_vec(self.t("mlp.gate_proj.weight"), &n);
        let up = mat_vec(self.t("mlp.up_proj.weight"), &n);
        assert_eq!(gate.len(), self.intermediate);
        let act: Vec<f64> = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let down = mat_vec(self.t("mlp.down_proj.weight"), &act);
        let h2: Vec<f64> = h1.iter().zip(&down).map(|(a, b)| a + b).collect();
        let logits = mat_vec(
            &self.w["lm_head.weight"],
            &rms_norm(&h2, &self.w["norm.weight"], self.eps),
        );
        assert_eq!(logits.len(), self.draft_vocab);
        (logits, h2)
    }

    /// The target id of the largest draft logit, and the gap to the runner-up.
    fn greedy(&self, logits: &[f64]) -> (u32, f64) {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let best = order[0];
        (
            (best as i64 + self.d2t[best]) as u32,
            logits[best] - logits[order[1]],
        )
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `w` is `[rows, x.len()]` row-major.
fn mat_vec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len()).map(|row| dot(row, x)).collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let mean_sq = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let scale = 1.0 / (mean_sq + eps).sqrt();
    x.iter().zip(w).map(|(x, w)| x * scale * w).collect()
}

/// Rotary embedding with Hugging Face's rotate_half pairing (i, i + d/2).
fn rope(x: &mut [f64], pos: usize, inv_freq: &[f64]) {
    let half = x.len() / 2;
    for (i, f) in inv_freq.iter().enumerate() {
        let (s, c) = (pos as f64 * f).sin_cos();
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/// The largest difference between `got` and `want`, relative to `want`'s largest magnitude
/// (at least 1), must stay under `tol`.
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(0.0, f64::max);
    assert!(err / scale < tol, "{what}: error {err} at scale {scale}");
}

// ---------------------------------------------------------------------------------------
// The scenario: two sequences, each prompt in two chunks, then two more draft steps.

fn target_spec() -> TinySpec {
    TinySpec {
        num_layers: TARGET_LAYERS,
        ..TinySpec::llama_tiny()
    }
}

struct Seq {
    prompt: Vec<u32>,
    /// Tokens of the first chunk; the rest of the prompt is the second.
    split: usize,
    blocks: Vec<u32>,
}

fn sequences(rng: &mut ChaCha8Rng, vocab: usize) -> Vec<Seq> {
    let mut prompt = |n: usize| (0..n).map(|_| rng.random_range(0..vocab as u32)).collect();
    vec![
        Seq {
            prompt: prompt(19),
            split: 10,
            blocks: vec![9, 3, 17, 0, 12, 6],
        },
        Seq {
            prompt: prompt(11),
            split: 6,
            blocks: vec![5, 20, 1, 14],
        },
    ]
}

fn slice_rows(values: &[f32], width: usize, rows: std::ops::Range<usize>) -> &[f32] {
    &values[rows.start * width..rows.end * width]
}

/// Every step-0 row of each sequence, gathered per sequence.
struct Step0 {
    /// The target's auxiliary hidden states, `[rows, aux width]`.
    aux_rows: Vec<Vec<f32>>,
    /// The head's `pre`, `[rows, H]`.
    pre_rows: Vec<Vec<f32>>,
    /// The head's draft logits at the prompt's last row.
    last_logits: Vec<Vec<f32>>,
    /// The target's greedy token after the prompt.
    next_token: Vec<u32>,
}

/// Runs every prompt through the target (recording the head's aux layers) and the head's
/// step 0 on the same plans, in two chunks split at `Seq::split` (a sequence whose second
/// chunk is empty sits that one out).
fn step0(
    model: &LlamaModel,
    head: &Eagle3Head,
    seqs: &[Seq],
    target_cache: &mut KvCache,
    head_cache: &mut KvCache,
) -> Step0 {
    let c = model.config();
    let (h, vd) = (head.config().hidden_size, head.vocab().len());
    let aux_width = head.aux_layers().len() * c.hidden_size;
    let mut out = Step0 {
        aux_rows: vec![Vec::new(); seqs.len()],
        pre_rows: vec![Vec::new(); seqs.len()],
        last_logits: vec![Vec::new(); seqs.len()],
        next_token: vec![0; seqs.len()],
    };
    for chunk in 0..2 {
        let ranges: Vec<(usize, std::ops::Range<usize>)> = seqs
            .iter()
            .map(|s| {
                if chunk == 0 {
                    0..s.split
                } else {
                    s.split..s.prompt.len()
                }
            })
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .collect();
        if ranges.is_empty() {
            continue;
        }
        let specs: Vec<SeqSpec> = ranges
            .iter()
            .map(|(i, r)| SeqSpec {
                num_cached: r.start,
                num_new: r.len(),
                block_table: &seqs[*i].blocks,
            })
            .collect();
        let plan = AttentionPlan::new(&specs, BLOCK, NUM_BLOCKS).unwrap();
        let tokens: Vec<u32> = ranges
            .iter()
            .flat_map(|(i, r)| seqs[*i].prompt[r.clone()].to_vec())
            .collect();
        let last_rows: Vec<usize> = plan
            .seqs()
            .iter()
            .map(|p| p.q_start + p.q_len - 1)
            .collect();
        let (target_logits, aux) = model
            .forward_with_aux(&tokens, &plan, target_cache, &last_rows, head.aux_layers())
            .unwrap();
        // The head's step-0 rows pair the feature at position j with token j + 1; the
        // last row of the prompt gets the target's next token.
        let vocab = c.vocab_size;
        let mut head_tokens = Vec::new();
        for (k, (i, r)) in ranges.iter().enumerate() {
            for j in r.clone() {
                head_tokens.push(match seqs[*i].prompt.get(j + 1) {
                    Some(&t) => t,
                    None => {
                        out.next_token[*i] = argmax(&target_logits[k * vocab..(k + 1) * vocab]);
                        out.next_token[*i]
                    }
                });
            }
        }
        let result = head
            .forward(
                &head_tokens,
                HeadInput::Aux(&aux),
                &plan,
                head_cache,
                &last_rows,
            )
            .unwrap();
        assert_eq!(result.pre.len(), tokens.len() * h);
        for (k, ((i, _), p)) in ranges.iter().zip(plan.seqs()).enumerate() {
            let rows = p.q_start..p.q_start + p.q_len;
            out.aux_rows[*i].extend_from_slice(slice_rows(&aux, aux_width, rows.clone()));
            out.pre_rows[*i].extend_from_slice(slice_rows(&result.pre, h, rows));
            out.last_logits[*i] = result.logits[k * vd..(k + 1) * vd].to_vec();
        }
    }
    out
}

/// How the head under test stores its products' weights.
#[derive(Clone, Copy, PartialEq)]
enum Precision {
    /// float32, as in the checkpoint.
    Float,
    /// Quantized to Q8_0 at load, as the CPU serves it.
    Q8_0,
}

/// Loads the head written from `spec` (quantized to Q8_0 when `precision` says so), runs
/// the scenario, and compares every output with the float64 reference of the float
/// weights: within float32 rounding for the float head; for the quantized one, within
/// what quantizing weights and activations to 8 bits per 32 values moves them; the drafts
/// are the reference's wherever its best logit leads the next by more than twice that.
/// Returns how many drafts were compared (those whose lead was clear).
fn check_head_against_reference(spec: HeadSpec, seed: u64, precision: Precision) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), seed);
    target.write_hf(&dir.path().join("target"));
    let random_head = RandomHead::new(&spec, &target.spec, seed + 1);
    random_head.write(&dir.path().join("head"));
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let mut head = Eagle3Head::load(&dir.path().join("head"), &model).unwrap();
    if precision == Precision::Q8_0 {
        // Every product's weight is converted: 34 bytes for each 32 float32 values.
        let float_bytes = head.product_weight_bytes();
        head = head.quantized_q8_0();
        assert_eq!(head.product_weight_bytes(), float_bytes / 4 / 32 * 34);
    }
    assert_eq!(head.aux_layers(), spec.aux_layers(TARGET_LAYERS).as_slice());
    assert_eq!(head.vocab().len(), spec.draft_vocab);
    let reference = RefHead::new(&spec, &random_head, &target);

    let mut rng = ChaCha8Rng::seed_from_u64(seed + 2);
    let seqs = sequences(&mut rng, target.spec.vocab_size);
    let mut target_cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let mut head_cache = KvCache::new(1, head.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let aux_width = head.aux_layers().len() * target.spec.hidden_size;
    let h = spec.hidden;
    let vd = spec.draft_vocab;

    let Step0 {
        aux_rows,
        pre_rows,
        last_logits,
        next_token,
    } = step0(&model, &head, &seqs, &mut target_cache, &mut head_cache);

    // Steps 1 and 2: one row per sequence, fed its own previous pre.
    let mut drafts: Vec<Vec<u32>> = last_logits.iter().map(|l| head.vocab().greedy(l)).collect();
    let mut step_logits: Vec<Vec<Vec<f32>>> = vec![Vec::new(); seqs.len()];
    let mut step_pre: Vec<Vec<Vec<f32>>> = vec![Vec::new(); seqs.len()];
    let mut pre: Vec<f32> = pre_rows
        .iter()
        .flat_map(|p| p[p.len() - h..].to_vec())
        .collect();
    for step in 1..3 {
        let specs: Vec<SeqSpec> = seqs
            .iter()
            .map(|s| SeqSpec {
                num_cached: s.prompt.len() + step - 1,
                num_new: 1,
                block_table: &s.blocks,
            })
            .collect();
        let plan = AttentionPlan::new(&specs, BLOCK, NUM_BLOCKS).unwrap();
        let tokens: Vec<u32> = drafts.iter().map(|d| *d.last().unwrap()).collect();
        let out = head
            .forward(
                &tokens,
                HeadInput::Pre(&pre),
                &plan,
                &mut head_cache,
                &[0, 1],
            )
            .unwrap();
        let ids = head.vocab().greedy(&out.logits);
        for i in 0..seqs.len() {
            drafts[i].push(ids[i]);
            step_logits[i].push(out.logits[i * vd..(i + 1) * vd].to_vec());
            step_pre[i].push(out.pre[i * h..(i + 1) * h].to_vec());
        }
        pre = out.pre;
    }

    // The reference, one sequence at a time over its whole history.
    let mut drafts_checked = 0;
    let (tol, clear_lead) = match precision {
        Precision::Float => (2e-4, 1e-3),
        Precision::Q8_0 => (Q8_TOL, 2.0 * Q8_TOL),
    };
    for (i, s) in seqs.iter().enumerate() {
        let n = s.prompt.len();
        let mut history = RefHistory::default();
        let mut ref_pre = Vec::new();
        let mut ref_logits = Vec::new();
        for j in 0..n {
            let token = s.prompt.get(j + 1).copied().unwrap_or(next_token[i]);
            let aux: Vec<f64> = aux_rows[i][j * aux_width..(j + 1) * aux_width]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let (logits, pre) = reference.step(&mut history, token, &reference.fc(&aux), j);
            assert_close(
                &format!("seq {i} step 0 row {j}: pre"),
                &pre_rows[i][j * h..(j + 1) * h],
                &pre,
                tol,
            );
            ref_pre = pre;
            ref_logits = logits;
        }
        for step in 0..3 {
            let what = format!("seq {i} step {step}");
            let got = if step == 0 {
                &last_logits[i]
            } else {
                &step_logits[i][step - 1]
            };
            assert_close(&format!("{what}: logits"), got, &ref_logits, tol);
            let (want, gap) = reference.greedy(&ref_logits);
            let scale = ref_logits.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            if gap > clear_lead * scale {
                assert_eq!(drafts[i][step], want, "{what}: draft id");
                drafts_checked += 1;
            }
            assert!(
                reference.d2t[..]
                    .iter()
                    .enumerate()
                    .any(|(k, o)| k as i64 + o == drafts[i][step] as i64),
                "{what}: the draft is not in the draft vocabulary"
            );
            if step == 2 {
                break;
            }
            let (logits, pre) = reference.step(&mut history, drafts[i][step], &ref_pre, n + step);
            assert_close(
                &format!("seq {i} step {}: pre", step + 1),
                &step_pre[i][step],
                &pre,
                tol,
            );
            ref_pre = pre;
            ref_logits = logits;
        }
    }
    drafts_checked
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn midlayer_head_matches_the_float64_reference() {
    check_head_against_reference(HeadSpec::midlayer(), 11, Precision::Float);
}

#[test]
fn layers0_head_sharing_the_target_embedding_matches_the_float64_reference() {
    check_head_against_reference(HeadSpec::layers0(), 23, Precision::Float);
}

/// How far the head's outputs with Q8_0 weights may be from the float64 reference,
/// relative to their scale (see `assert_close`; about 0.014 measured).
const Q8_TOL: f64 = 0.03;

#[test]
fn a_head_quantized_to_q8_0_stays_near_the_float64_reference_and_drafts_alike() {
    let compared: usize = (23..31)
        .map(|seed| check_head_against_reference(HeadSpec::layers0(), seed, Precision::Q8_0))
        .sum();
    // 48 drafts in all; random logits often lead by less than the bound.
    assert!(compared >= 12, "only {compared} drafts led clearly");
}

/// A sequence's aux hidden states, head `pre` and draft logits are the same bits whether
/// its prompt runs in two chunks batched with another sequence or alone in one chunk on
/// other blocks (docs/architecture.md, rule 6).
#[test]
fn step0_is_bit_exact_across_batching_chunking_and_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 41);
    target.write_hf(&dir.path().join("target"));
    let spec = HeadSpec::midlayer();
    RandomHead::new(&spec, &target.spec, 42).write(&dir.path().join("head"));
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let head = Eagle3Head::load(&dir.path().join("head"), &model).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    let seqs = sequences(&mut rng, target.spec.vocab_size);
    let run = |seqs: &[Seq]| {
        let mut target_cache =
            KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
        let mut head_cache = KvCache::new(1, head.kv_layout(NUM_BLOCKS, BLOCK as u64));
        step0(&model, &head, seqs, &mut target_cache, &mut head_cache)
    };
    let batched = run(&seqs);
    let alone = Seq {
        prompt: seqs[0].prompt.clone(),
        split: seqs[0].prompt.len(),
        blocks: vec![23, 22, 2, 4, 8, 10],
    };
    let alone = run(&[alone]);
    assert!(batched.aux_rows[0] == alone.aux_rows[0], "aux");
    assert!(batched.pre_rows[0] == alone.pre_rows[0], "pre");
    assert!(batched.last_logits[0] == alone.last_logits[0], "logits");
    assert_eq!(batched.next_token[0], alone.next_token[0]);
}

/// The inputs of the aux layers, recorded during the target's normal forward (in two
/// chunks over a paged cache), equal the float64 reference target's layer inputs; layer
/// 0's is the embedding itself; the logits are those of the plain forward, bit for bit.
#[test]
fn aux_hidden_states_are_the_target_layer_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 5);
    target.write_hf(dir.path());
    let model = LlamaModel::load(dir.path()).unwrap();
    let reference = RefModel::load(dir.path());
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let seqs = sequences(&mut rng, target.spec.vocab_size);
    let layers = [3, 0, 2, 1, 2];
    let h = target.spec.hidden_size;
    let width = layers.len() * h;
    let layout = model.kv_layout(NUM_BLOCKS, BLOCK as u64);
    let mut with_aux = KvCache::new(TARGET_LAYERS, layout);
    let mut plain = KvCache::new(TARGET_LAYERS, layout);
    let mut aux_rows: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
    for chunk in 0..2 {
        let ranges: Vec<std::ops::Range<usize>> = seqs
            .iter()
            .map(|s| {
                if chunk == 0 {
                    0..s.split
                } else {
                    s.split..s.prompt.len()
                }
            })
            .collect();
        let specs: Vec<SeqSpec> = seqs
            .iter()
            .zip(&ranges)
            .map(|(s, r)| SeqSpec {
                num_cached: r.start,
                num_new: r.len(),
                block_table: &s.blocks,
            })
            .collect();
        let plan = AttentionPlan::new(&specs, BLOCK, NUM_BLOCKS).unwrap();
        let tokens: Vec<u32> = seqs
            .iter()
            .zip(&ranges)
            .flat_map(|(s, r)| s.prompt[r.clone()].to_vec())
            .collect();
        let rows: Vec<usize> = (0..tokens.len()).collect();
        let (logits, aux) = model
            .forward_with_aux(&tokens, &plan, &mut with_aux, &rows, &layers)
            .unwrap();
        let want = model.forward(&tokens, &plan, &mut plain, &rows).unwrap();
        assert!(logits == want, "forward_with_aux changed the logits");
        assert_eq!(aux.len(), tokens.len() * width);
        for (i, p) in plan.seqs().iter().enumerate() {
            let rows = p.q_start..p.q_start + p.q_len;
            aux_rows[i].extend_from_slice(slice_rows(&aux, width, rows));
        }
    }
    let embed = &target.tensors["model.embed_tokens.weight"].1;
    for (i, s) in seqs.iter().enumerate() {
        let (_, inputs) = reference.forward_recording(&s.prompt);
        for (j, &t) in s.prompt.iter().enumerate() {
            let row = &aux_rows[i][j * width..(j + 1) * width];
            for (slot, &l) in layers.iter().enumerate() {
                let got = &row[slot * h..(slot + 1) * h];
                assert_close(
                    &format!("seq {i} row {j} layer {l}"),
                    got,
                    &inputs[l][j],
                    1e-4,
                );
                if l == 0 {
                    let t = t as usize;
                    assert_eq!(got, &embed[t * h..(t + 1) * h], "layer 0 is the embedding");
                }
            }
        }
    }
    let plan = AttentionPlan::new(
        &[SeqSpec {
            num_cached: 0,
            num_new: 1,
            block_table: &[0],
        }],
        BLOCK,
        NUM_BLOCKS,
    )
    .unwrap();
    let e = model
        .forward_with_aux(&[1], &plan, &mut plain, &[0], &[1, TARGET_LAYERS + 1])
        .unwrap_err();
    assert!(
        matches!(
            e,
            ForwardError::AuxLayer {
                layer: 5,
                layers: 4
            }
        ),
        "{e}"
    );
}

/// A change to a random head's checkpoint.
type Edit = dyn Fn(&mut RandomHead);

/// Bad checkpoints are refused with an error naming the field or tensor at fault.
#[test]
fn bad_checkpoints_are_refused_naming_the_field_or_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 31);
    target.write_hf(&dir.path().join("target"));
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let spec = HeadSpec::midlayer();
    let load_error = |edit: &Edit, name: &str| -> String {
        let mut head = RandomHead::new(&spec, &target.spec, 32);
        edit(&mut head);
        let path = dir.path().join(name);
        head.write(&path);
        match Eagle3Head::load(&path, &model) {
            Ok(_) => panic!("{name}: loaded"),
            Err(e) => e.to_string(),
        }
    };
    let cases: [(&str, &Edit, &str); 7] = [
        (
            "two_layers",
            &|h| h.config["num_hidden_layers"] = json!(2),
            "`num_hidden_layers` is 2",
        ),
        ("no_d2t", &|h| h.d2t.clear(), "tensor `d2t` is missing"),
        (
            "d2t_out_of_vocab",
            &|h| *h.d2t.last_mut().unwrap() += 1000,
            "d2t[119]",
        ),
        (
            "fc_two_layers_wide",
            &|h| {
                let fc = h.tensors.get_mut("fc.weight").unwrap();
                *fc = (vec![48, 128], fc.1[..48 * 128].to_vec());
            },
            "tensor `fc.weight` has shape [48, 128], expected [48, 192]",
        ),
        (
            "aux_layer_past_the_target",
            &|h| h.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = json!([1, 2, 4]),
            "eagle_aux_hidden_state_layer_ids` names layer 4",
        ),
        (
            "target_hidden_mismatch",
            &|h| h.config["target_hidden_size"] = json!(32),
            "target_hidden_size",
        ),
        (
            "no_embedding_to_share",
            &|h| {
                h.tensors.remove("embed_tokens.weight");
            },
            "no `embed_tokens.weight`",
        ),
    ];
    for (name, edit, want) in cases {
        let e = load_error(edit, name);
        assert!(e.contains(want), "{name}: {e}");
    }
}

// ---------------------------------------------------------------------------------------
// Through the serving engine.

const ENGINE_BLOCK: usize = 16;

/// Every prompt at once through the engine of the target in `target_dir`, greedy, drafting
/// with the head in `head_dir` (none: no speculation); each one's tokens and usage.
async fn served(
    target_dir: &Path,
    head_dir: Option<&Path>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<(Vec<u32>, Usage)> {
    let greedy = |_| SamplingParams::greedy();
    served_sampling(target_dir, head_dir, prompts, &greedy, max_tokens).await
}

/// [`served`] with request `i` sampled as `params(i)` says.
async fn served_sampling(
    target_dir: &Path,
    head_dir: Option<&Path>,
    prompts: &[Vec<u32>],
    params: &dyn Fn(usize) -> SamplingParams,
    max_tokens: usize,
) -> Vec<(Vec<u32>, Usage)> {
    let model = LlamaModel::load(target_dir).unwrap();
    let memory = 64 * ENGINE_BLOCK as u64 * model.kv_bytes_per_token();
    let target = cpu_backend(model, memory, ENGINE_BLOCK).unwrap();
    let drafter = head_dir.map(|dir| {
        let head = Eagle3Head::from_weights(
            Eagle3Config::from_dir(dir).unwrap(),
            &Weights::open(dir).unwrap(),
            target.config(),
            target.embedding_table().unwrap(),
        )
        .unwrap();
        Box::new(Eagle3::new(head, target.config(), target.pool()).unwrap()) as Box<dyn DraftMethod>
    });
    let settings = EngineSettings {
        block_size: ENGINE_BLOCK,
        prefix_caching: false,
        limits: SchedulerLimits {
            max_num_seqs: 8,
            max_num_batched_tokens: 48,
            max_waiting: prompts.len().max(1000),
            num_speculative_tokens: 3,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let engine = start_engine(target, &settings, drafter).unwrap();
    let mut streams = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let params = params(i);
        streams.push(submit(&engine.scheduler, i as u64, prompt, &params, max_tokens).await);
    }
    let mut out = Vec::new();
    for rx in streams {
        let (tokens, _, usage) = collect(rx).await;
        out.push((tokens, usage));
    }
    out
}

/// Random prompts of 3 to 60 tokens (longer ones are prefilled in chunks).
fn engine_prompts(vocab: usize, n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let len = rng.random_range(3..60);
            (0..len)
                .map(|_| rng.random_range(0..vocab as u32))
                .collect()
        })
        .collect()
}

/// Greedy outputs with a random head's drafts (nearly all rejected) equal the outputs
/// without speculation, token for token, in a batch with chunked prefills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_outputs_with_eagle3_equal_those_without() {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 51);
    target.write_hf(&dir.path().join("target"));
    for (spec, name) in [
        (HeadSpec::midlayer(), "midlayer"),
        (HeadSpec::layers0(), "layers0"),
    ] {
        RandomHead::new(&spec, &target.spec, 52).write(&dir.path().join(name));
    }
    let prompts = engine_prompts(target.spec.vocab_size, 10, 53);
    let plain = served(&dir.path().join("target"), None, &prompts, 24).await;
    for name in ["midlayer", "layers0"] {
        let head = dir.path().join(name);
        let eagle = served(&dir.path().join("target"), Some(&head), &prompts, 24).await;
        for (i, (want, got)) in plain.iter().zip(&eagle).enumerate() {
            assert_eq!(got.0, want.0, "{name}: request {i}");
        }
        let drafted: usize = eagle.iter().map(|(_, u)| u.num_draft_tokens).sum();
        assert!(drafted > 0, "{name}: no drafts were proposed");
    }
}

/// A target whose logits are all equal (final norm zeroed) always picks token 0, and a
/// head whose draft logits are all equal always drafts draft id 0, mapped to token 0:
/// every draft is accepted, and the outputs still equal those without speculation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_eagle3_drafts_keep_greedy_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = TinyModel::random(target_spec(), 61);
    let norm = target.tensors.get_mut("model.norm.weight").unwrap();
    norm.1.iter_mut().for_each(|w| *w = 0.0);
    target.write_hf(&dir.path().join("target"));
    let mut head = RandomHead::new(&HeadSpec::layers0(), &target.spec, 62);
    let lm_head = head.tensors.get_mut("lm_head.weight").unwrap();
    lm_head.1.iter_mut().for_each(|w| *w = 0.0);
    head.d2t[0] = 0;
    head.write(&dir.path().join("head"));
    let prompts = engine_prompts(target.spec.vocab_size, 6, 63);
    let plain = served(&dir.path().join("target"), None, &prompts, 16).await;
    let eagle = served(
        &dir.path().join("target"),
        Some(&dir.path().join("head")),
        &prompts,
        16,
    )
    .await;
    for (i, (want, got)) in plain.iter().zip(&eagle).enumerate() {
        assert_eq!(got.0, want.0, "request {i}");
        assert!(got.0.iter().all(|&t| t == 0), "request {i}: {:?}", got.0);
        assert!(got.1.num_draft_tokens > 0, "request {i}: no drafts");
        assert_eq!(
            got.1.num_accepted_tokens, got.1.num_draft_tokens,
            "request {i}"
        );
    }
}

/// Sampled requests draft from the head's distribution at their temperature and verify
/// against it: the first two tokens (the second one verified, its draft accepted or
/// rejected) keep the target's own distribution, by Pearson's chi-square over the 3 x 3
/// cells that top-k 3 leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_eagle3_drafts_keep_the_target_distribution() {
    const DRAWS: usize = 3000;
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 71);
    target.write_hf(&dir.path().join("target"));
    let prompt: Vec<u32> = vec![11, 12, 13, 11, 12, 13, 11, 12];
    let params = |seed: usize| SamplingParams {
        temperature: 0.7,
        top_k: 3,
        seed: Some(seed as u64),
        ..SamplingParams::default()
    };
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let sampler = peregrine_ops::sampling::Sampler::new(&params(0)).unwrap();
    let dist = |tokens: &[u32]| cpu_distribution(&model, &sampler, &prompt, tokens);
    let (first, second) = first_two_distributions(&prompt, dist);
    // A head whose draft logits are all equal: each draft is drawn uniformly from draft
    // ids 0..32 (its top 32, the first among equal logits), mapped first to the tokens
    // the target keeps for the first two positions, then to the other ids in order.
    let mut likely: Vec<u32> = first.iter().map(|&(t, _)| t).collect();
    likely.extend(second.iter().flatten().map(|&(t, _)| t));
    likely.sort_unstable();
    likely.dedup();
    let mut head = RandomHead::new(&HeadSpec::layers0(), &target.spec, 72);
    let lm_head = head.tensors.get_mut("lm_head.weight").unwrap();
    lm_head.1.iter_mut().for_each(|w| *w = 0.0);
    let rest = (0..target.spec.vocab_size as u32).filter(|t| !likely.contains(t));
    let order: Vec<u32> = likely.iter().copied().chain(rest).collect();
    for (draft, offset) in head.d2t.iter_mut().enumerate() {
        *offset = i64::from(order[draft]) - draft as i64;
    }
    head.write(&dir.path().join("head"));
    let prompts = vec![prompt.clone(); DRAWS];
    let (target_dir, head_dir) = (dir.path().join("target"), dir.path().join("head"));
    let outs = served_sampling(&target_dir, Some(&head_dir), &prompts, &params, 3).await;
    let (accepted, drafts) = assert_uniform_drafts_accepted(&outs, &first, &second, &order[..32]);
    let note = format!(", {accepted} of {drafts} drafts accepted");
    assert_first_two_follow(&outs, &first, &second, &note);
}

/// The CPU target pool of the model in `dir`: `NUM_BLOCKS` blocks of `BLOCK` tokens, the
/// last of them its scratch block.
fn target_pool(dir: &Path) -> PoolInfo {
    let model = LlamaModel::load(dir).unwrap();
    let memory = (NUM_BLOCKS - 1) * BLOCK as u64 * model.kv_bytes_per_token();
    let pool = cpu_backend(model, memory, BLOCK).unwrap().pool().clone();
    assert_eq!(pool.layout.num_blocks, NUM_BLOCKS);
    pool
}

/// The drafts the head gives after `tokens` (the target has run all but the last), from
/// fresh caches in one step-0 chunk: what the proposer must reproduce bit for bit.
fn expected_drafts(model: &LlamaModel, head: &Eagle3Head, tokens: &[u32], k: usize) -> Vec<u32> {
    let blocks: Vec<u32> = (0..NUM_BLOCKS as u32).rev().collect();
    let mut target_cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let mut head_cache = KvCache::new(1, head.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let n = tokens.len() - 1;
    let plan = |num_cached, num_new| {
        let spec = SeqSpec {
            num_cached,
            num_new,
            block_table: &blocks,
        };
        AttentionPlan::new(&[spec], BLOCK, NUM_BLOCKS).unwrap()
    };
    let p = plan(0, n);
    let (_, aux) = model
        .forward_with_aux(&tokens[..n], &p, &mut target_cache, &[], head.aux_layers())
        .unwrap();
    let out = head
        .forward(
            &tokens[1..],
            HeadInput::Aux(&aux),
            &p,
            &mut head_cache,
            &[n - 1],
        )
        .unwrap();
    let h = head.config().hidden_size;
    let mut drafts = head.vocab().greedy(&out.logits);
    let mut pre = out.pre[(n - 1) * h..].to_vec();
    while drafts.len() < k {
        let p = plan(n - 1 + drafts.len(), 1);
        let token = [*drafts.last().unwrap()];
        let out = head
            .forward(&token, HeadInput::Pre(&pre), &p, &mut head_cache, &[0])
            .unwrap();
        drafts.extend(head.vocab().greedy(&out.logits));
        pre = out.pre;
    }
    drafts
}

/// The proposer pairs each target feature with the next token, at the target's positions,
/// drops the rows of rejected drafts and overwrites their head KV: after a prompt in two
/// chunks, and after a verify step that accepted one draft, its drafts are those of the
/// head run afresh over the whole history. (The head's q and k are scaled up so that its
/// attention is sharp and a wrong position or row changes the drafts.)
#[test]
fn the_proposer_drafts_what_the_head_gives_over_the_verified_history() {
    const K: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 71);
    target.write_hf(&dir.path().join("target"));
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let pool = target_pool(&dir.path().join("target"));
    for seed in 0..6 {
        let head_dir = dir.path().join(format!("head{seed}"));
        RandomHead::new(&HeadSpec::midlayer(), &target.spec, 72 + seed)
            .sharpened()
            .write(&head_dir);
        let load = || Eagle3Head::load(&head_dir, &model).unwrap();
        let (head, reference) = (load(), load());
        let mut method = Eagle3::new(head, model.config(), &pool).unwrap();
        assert_eq!(method.hidden_layers(), Some(vec![0, 2, 3]));
        let mut rng = ChaCha8Rng::seed_from_u64(73 + seed);
        let mut tokens: Vec<u32> = (0..19).map(|_| rng.random_range(0..300)).collect();
        let blocks = vec![9, 3, 17, 0, 12, 6, 21, 2];
        let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
        let id = RequestId(7);
        // The target runs `fed` from position `start`; its rows go to the proposer.
        let mut target_step = |fed: &[u32], start: usize, method: &mut Eagle3| -> Vec<f32> {
            target_chunk(&model, &mut cache, method, id, (fed, start), &blocks)
        };
        target_step(&tokens[..10], 0, &mut method);
        let logits = target_step(&tokens[10..], 10, &mut method);
        tokens.push(argmax(&logits));
        let propose = |tokens: &[u32], method: &mut Eagle3| {
            let seq = ProposeSeq {
                id,
                tokens: tokens.into(),
                block_table: blocks.clone(),
                max_drafts: K,
                sampling: None,
                drafts_paused: false,
            };
            method.propose(&[seq]).unwrap().remove(0).tokens
        };
        let drafts = propose(&tokens, &mut method);
        assert_eq!(
            drafts,
            expected_drafts(&model, &reference, &tokens, K),
            "seed {seed}"
        );
        // Verify [last, d1..dK]: d1 accepted, then a correction that is not d2.
        let mut fed = vec![*tokens.last().unwrap()];
        fed.extend(&drafts);
        target_step(&fed, tokens.len() - 1, &mut method);
        tokens.push(drafts[0]);
        tokens.push((drafts[1] + 1) % 300);
        let drafts = propose(&tokens, &mut method);
        assert_eq!(
            drafts,
            expected_drafts(&model, &reference, &tokens, K),
            "seed {seed}"
        );
    }
}

/// A random target (seed `seed`) and a sharpened random head over it (seed `seed + 1`),
/// loaded twice: as the proposer's method and as the reference `expected_drafts` runs.
struct Drafting {
    model: LlamaModel,
    method: Eagle3,
    reference: Eagle3Head,
    /// Holds the checkpoints.
    _dir: tempfile::TempDir,
}

fn drafting(seed: u64) -> Drafting {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), seed);
    target.write_hf(&dir.path().join("target"));
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let pool = target_pool(&dir.path().join("target"));
    let head_dir = dir.path().join("head");
    RandomHead::new(&HeadSpec::midlayer(), &target.spec, seed + 1)
        .sharpened()
        .write(&head_dir);
    let load = || Eagle3Head::load(&head_dir, &model).unwrap();
    let (head, reference) = (load(), load());
    let method = Eagle3::new(head, model.config(), &pool).unwrap();
    Drafting {
        model,
        method,
        reference,
        _dir: dir,
    }
}

/// The target runs `fed` from position `start` of request `id` over `table` (its KV in
/// `cache`) and hands its features to `method`; returns the logits of the last row.
fn target_chunk(
    model: &LlamaModel,
    cache: &mut KvCache,
    method: &mut Eagle3,
    id: RequestId,
    (fed, start): (&[u32], usize),
    table: &[u32],
) -> Vec<f32> {
    let spec = SeqSpec {
        num_cached: start,
        num_new: fed.len(),
        block_table: table,
    };
    let plan = AttentionPlan::new(&[spec], BLOCK, NUM_BLOCKS).unwrap();
    let (logits, aux) = model
        .forward_with_aux(fed, &plan, cache, &[fed.len() - 1], &[0, 2, 3])
        .unwrap();
    method.receive_hidden(vec![HiddenRows {
        id,
        first_pos: start,
        data: HiddenData::Host(aux),
    }]);
    logits
}

/// The head's K at position `pos` of a sequence over `table`, in its one-layer cache.
fn head_kv(method: &Eagle3, table: &[u32], pos: usize) -> Vec<f32> {
    let per_slot = method.cache().layout().slot_elems() as usize;
    let slot = table[pos / BLOCK] as usize * BLOCK + pos % BLOCK;
    method.cache().layer(0).0[slot * per_slot..(slot + 1) * per_slot].to_vec()
}

/// The fault hook (the soak's fault run) zeroes the head's KV in the blocks above its
/// block id after each forward, and only there: the draft steps then read zeros past it.
#[test]
fn the_fault_hook_zeroes_the_heads_kv_above_its_block_id_only() {
    let Drafting { model, method, .. } = drafting(91);
    let mut method = method.with_kv_fault_above(10);
    let mut rng = ChaCha8Rng::seed_from_u64(93);
    let mut tokens: Vec<u32> = (0..13).map(|_| rng.random_range(0..300)).collect();
    // Positions 0..4 in block 5, 4..8 in 11, 8..12 in 2, 12..16 in 19.
    let blocks = vec![5, 11, 2, 19, 7, 14];
    let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let id = RequestId(4);
    let logits = target_chunk(&model, &mut cache, &mut method, id, (&tokens, 0), &blocks);
    tokens.push(argmax(&logits));
    let seq = ProposeSeq {
        id,
        tokens: tokens.clone(),
        block_table: blocks.clone(),
        max_drafts: 3,
        sampling: None,
        drafts_paused: false,
    };
    let drafts = method.propose(&[seq]).unwrap().remove(0).tokens;
    assert_eq!(drafts.len(), 3);
    for pos in 0..16 {
        let zero = head_kv(&method, &blocks, pos).iter().all(|&v| v == 0.0);
        assert_eq!(zero, blocks[pos / BLOCK] > 10, "position {pos}");
    }
}

/// A request planned without drafts runs the head's step 0 over the target's rows where
/// its last token is due (`drafts_paused` false), so that the head's KV holds its answer;
/// where drafting is paused (it does not pay at the batch size) its rows wait, and run
/// in the step that drafts again, whose drafts are those of the head run afresh, or once
/// `LAZY_ROWS` of them wait.
#[test]
fn a_request_planned_without_drafts_runs_step_0_now_or_when_it_drafts_again() {
    const K: usize = 3;
    let Drafting {
        model,
        mut method,
        reference,
        ..
    } = drafting(81);
    let mut rng = ChaCha8Rng::seed_from_u64(83);
    let mut tokens: Vec<u32> = (0..13).map(|_| rng.random_range(0..300)).collect();
    let blocks: Vec<u32> = (0..48).map(|b| (b * 7 + 3) % NUM_BLOCKS as u32).collect();
    let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let id = RequestId(3);
    let mut start = 0;
    let zero = vec![0.0; head_kv(&method, &blocks, 0).len()];
    // (max_drafts, drafts_paused) per step: due, paused twice, drafting, paused.
    let plan = [(0, false), (0, true), (0, true), (K, false), (0, true)];
    for (step, &(max_drafts, drafts_paused)) in plan.iter().enumerate() {
        // The target runs what is not in its cache yet and samples the next token.
        let fed = (&tokens[start..], start);
        let logits = target_chunk(&model, &mut cache, &mut method, id, fed, &blocks);
        start = tokens.len();
        tokens.push(argmax(&logits));
        let last_row = tokens.len() - 2;
        let before = head_kv(&method, &blocks, last_row);
        let seq = ProposeSeq {
            id,
            tokens: tokens.clone(),
            block_table: blocks.clone(),
            max_drafts,
            sampling: None,
            drafts_paused,
        };
        let drafts = method.propose(&[seq]).unwrap().remove(0).tokens;
        let written = head_kv(&method, &blocks, last_row) != before;
        assert_eq!(
            written, !drafts_paused,
            "step {step}: the last row's head KV"
        );
        if max_drafts == 0 {
            assert!(drafts.is_empty(), "step {step}: {drafts:?}");
        } else {
            assert_eq!(drafts, expected_drafts(&model, &reference, &tokens, K));
            for pos in 0..tokens.len() - 1 {
                assert_ne!(head_kv(&method, &blocks, pos), zero, "position {pos}");
            }
        }
    }
    // LAZY_ROWS rows waiting run at once, paused or not.
    let more: Vec<u32> = (0..LAZY_ROWS).map(|_| rng.random_range(0..300)).collect();
    tokens.extend(&more);
    let fed = (&tokens[start..], start);
    let logits = target_chunk(&model, &mut cache, &mut method, id, fed, &blocks);
    tokens.push(argmax(&logits));
    let seq = ProposeSeq {
        id,
        tokens: tokens.clone(),
        block_table: blocks.clone(),
        max_drafts: 0,
        sampling: None,
        drafts_paused: true,
    };
    assert!(method.propose(&[seq]).unwrap().remove(0).tokens.is_empty());
    assert_ne!(head_kv(&method, &blocks, tokens.len() - 2), zero);
}

/// A prompt computed in chunks runs the head's step 0 over each chunk in the proposal
/// after it (the scheduler proposes prompt chunks with no room for drafts), so that the
/// target's features wait one step at most; once the prompt is done the drafts are those
/// of the head run afresh.
#[test]
fn each_prompt_chunk_runs_step_0_in_the_next_proposal() {
    const K: usize = 3;
    let Drafting {
        model,
        mut method,
        reference,
        ..
    } = drafting(85);
    let mut rng = ChaCha8Rng::seed_from_u64(87);
    let mut tokens: Vec<u32> = (0..19).map(|_| rng.random_range(0..300)).collect();
    let blocks = vec![3, 17, 8, 12, 1, 20];
    let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let id = RequestId(4);
    for (start, end) in [(0, 7), (7, 14), (14, 19)] {
        let fed = (&tokens[start..end], start);
        let logits = target_chunk(&model, &mut cache, &mut method, id, fed, &blocks);
        let last_chunk = end == 19;
        if last_chunk {
            tokens.push(argmax(&logits));
        }
        let before = head_kv(&method, &blocks, end - 1);
        let seq = ProposeSeq {
            id,
            tokens: tokens.clone(),
            block_table: blocks.clone(),
            max_drafts: if last_chunk { K } else { 0 },
            sampling: None,
            drafts_paused: false,
        };
        let drafts = method.propose(&[seq]).unwrap().remove(0).tokens;
        assert_ne!(
            head_kv(&method, &blocks, end - 1),
            before,
            "chunk {start}..{end}: the head's KV of its last position was not written"
        );
        if last_chunk {
            assert_eq!(drafts, expected_drafts(&model, &reference, &tokens, K));
        } else {
            assert!(drafts.is_empty(), "chunk {start}..{end}: {drafts:?}");
        }
    }
}

/// A sequence served from the prefix cache drafts from the head KV its shared blocks hold:
/// its drafts are those of the head run afresh over its whole history. A shared block
/// whose last position the head paired with another next token, or that another sequence
/// has taken since, gives no drafts (its output would be unchanged, its acceptance lost).
#[test]
fn a_prefix_hit_drafts_from_the_head_kv_its_shared_blocks_hold() {
    const K: usize = 4;
    let Drafting {
        model,
        mut method,
        reference,
        ..
    } = drafting(81);
    let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    // The target runs `tokens[start..]` of request `id` over `table`, hands its features to
    // the proposer and samples the next token greedily; then the proposer drafts.
    let mut serve = |id: u64, tokens: &mut Vec<u32>, table: &[u32], start: usize| {
        let (id, fed) = (RequestId(id), (&tokens[start..], start));
        let logits = target_chunk(&model, &mut cache, &mut method, id, fed, table);
        tokens.push(argmax(&logits));
        let seq = ProposeSeq {
            id,
            tokens: tokens.clone(),
            block_table: table.to_vec(),
            max_drafts: K,
            sampling: None,
            drafts_paused: false,
        };
        method.propose(&[seq]).unwrap().remove(0).tokens
    };
    let mut rng = ChaCha8Rng::seed_from_u64(83);
    let mut random = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..300)).collect() };
    // A computes 14 tokens: the head's step 0 covers its first three blocks.
    let mut a = random(14);
    let drafts = serve(1, &mut a, &[9, 3, 17, 0, 12], 0);
    assert_eq!(drafts, expected_drafts(&model, &reference, &a, K));
    // B shares A's first two blocks and the token after them: it drafts as if it had run
    // from the start.
    let mut b = a[..9].to_vec();
    b.extend(random(6));
    let drafts = serve(2, &mut b, &[9, 3, 5, 14, 8], 8);
    assert_eq!(drafts.len(), K);
    assert_eq!(drafts, expected_drafts(&model, &reference, &b, K));
    // C shares the two blocks but not the token after them: the head paired their last
    // position with A's.
    let mut c = a[..8].to_vec();
    c.push((a[8] + 1) % 300);
    c.extend(random(5));
    assert_eq!(serve(3, &mut c, &[9, 3, 6, 20, 1], 8), Vec::<u32>::new());
    // D takes block 3 for other tokens; then a hit on A's prefix finds it changed.
    let mut d = random(6);
    assert_eq!(serve(4, &mut d, &[3, 10, 13], 0).len(), K);
    let mut e = a[..9].to_vec();
    e.extend(random(4));
    assert_eq!(serve(5, &mut e, &[9, 3, 7, 11], 8), Vec::<u32>::new());
}

/// The head states the bytes one block takes in its one layer's K (or V) tensor, for the
/// acceptance alarm's byte-offset bands.
#[test]
fn the_head_states_its_kv_bytes_per_block() {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 81);
    target.write_hf(&dir.path().join("target"));
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let pool = target_pool(&dir.path().join("target"));
    let head_dir = dir.path().join("head");
    RandomHead::new(&HeadSpec::midlayer(), &target.spec, 84).write(&head_dir);
    let head = Eagle3Head::load(&head_dir, &model).unwrap();
    let method = Eagle3::new(head, model.config(), &pool).unwrap();
    let cache = method.cache();
    let per_tensor = cache.bytes_per_layer() / 2;
    assert_eq!(
        method.kv_bytes_per_block(),
        Some(per_tensor / cache.layout().num_blocks)
    );
}
