//! EAGLE-3 heads on the CPU: random heads written in the published format (config.json
//! with a reduced draft vocabulary, safetensors with `midlayer.` or `layers.0.` names and an
//! int64 `d2t`) next to a tiny random target, loaded and run through step 0 (two prompt
//! chunks, so the second reads the first from the paged KV cache) and two more steps, and
//! compared with a dense float64 reference written here (full-history causal attention,
//! its own RoPE and RMSNorm, no paging). The target's auxiliary hidden states are compared
//! with the float64 reference target's layer inputs, and bad checkpoints are refused with
//! errors that name the field or tensor. The head drafting through the engine: the
//! workspace's `tests/eagle3.rs`.

use peregrine_models::eagle3::{Eagle3Head, HeadInput};
use peregrine_models::{ForwardError, LlamaModel};
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use peregrine_testkit::eagle3_head::{HeadSpec, RandomHead};
use peregrine_testkit::reference::argmax;
use peregrine_testkit::reference::RefModel;
use peregrine_testkit::tiny_model::{TinyModel, TinySpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::BTreeMap;

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
