//! A tensor-parallel forward simulated on the CPU: every rank runs the layer on its own
//! shards, cut from the weights as `LlamaModel` holds them (q/k/v and gate/up stacked),
//! and the ranks meet only where NCCL would join them: the all-reduce (a sum of the
//! ranks' partials in rank order) after the embedding, o_proj and down_proj, and the
//! gather (a concatenation) of the LM head's logits. It must equal the unsharded forward.

use super::math::{add, attention, linear, rms_norm, rope, swiglu};
use super::reference::{TinyModel, EPS, THETA};
use crate::tensor_parallel::{cut, LlamaWeight, RankShard, TpShape};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One rank's shards of the tiny model.
struct RankWeights {
    shard: RankShard,
    embed: Vec<f64>,
    qkv: Vec<f64>,
    qkv_bias: Vec<f64>,
    o: Vec<f64>,
    gate_up: Vec<f64>,
    down: Vec<f64>,
    lm_head: Vec<f64>,
}

impl RankWeights {
    /// `shard`'s part of `m`.
    fn cut(m: &TinyModel, shard: RankShard) -> RankWeights {
        let part = |w: LlamaWeight, full: &[f64]| {
            let [rows, cols] = w.shape(&m.shape);
            cut(full, rows, cols, &shard.cut_of(w))
        };
        let [qkv_rows, _] = LlamaWeight::Qkv.shape(&m.shape);
        RankWeights {
            embed: part(LlamaWeight::EmbedTokens, &m.embed),
            qkv: part(LlamaWeight::Qkv, &m.qkv()),
            qkv_bias: cut(&m.qkv_bias(), qkv_rows, 1, &shard.cut_of(LlamaWeight::Qkv)),
            o: part(LlamaWeight::OProj, &m.o),
            gate_up: part(LlamaWeight::GateUp, &m.gate_up()),
            down: part(LlamaWeight::DownProj, &m.down),
            lm_head: part(LlamaWeight::LmHead, &m.lm_head),
            shard,
        }
    }

    /// vLLM's `VocabParallelEmbedding` on this rank: the rows of the tokens in its range,
    /// zeros for the others.
    fn embed(&self, tokens: &[usize]) -> Vec<Vec<f64>> {
        let (h, vocab) = (self.shard.shape.hidden_size, self.shard.vocab());
        tokens
            .iter()
            .map(|&t| match vocab.contains(&t) {
                true => self.embed[(t - vocab.start) * h..(t - vocab.start + 1) * h].to_vec(),
                false => vec![0.0; h],
            })
            .collect()
    }

    /// This rank's part of the attention output: its heads through its o_proj columns.
    fn attention(&self, n: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let d = self.shard.shape.head_dim;
        let (heads, kv_heads) = (self.shard.q_heads().len(), self.shard.kv_heads().len());
        let qkv = linear(n, &self.qkv, Some(&self.qkv_bias));
        let split = |from: usize, len: usize| -> Vec<Vec<f64>> {
            qkv.iter().map(|r| r[from..from + len].to_vec()).collect()
        };
        let (mut q, mut k) = (split(0, heads * d), split(heads * d, kv_heads * d));
        let v = split((heads + kv_heads) * d, kv_heads * d);
        rope(&mut q, d, THETA);
        rope(&mut k, d, THETA);
        linear(&attention(&q, &k, &v, heads, kv_heads, d), &self.o, None)
    }

    /// This rank's part of the MLP output: its inner columns through its down_proj columns.
    fn mlp(&self, n: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let inter = self.shard.inter().len();
        let gate_up = linear(n, &self.gate_up, None);
        let gate: Vec<Vec<f64>> = gate_up.iter().map(|r| r[..inter].to_vec()).collect();
        let up: Vec<Vec<f64>> = gate_up.iter().map(|r| r[inter..].to_vec()).collect();
        linear(&swiglu(&gate, &up), &self.down, None)
    }
}

/// The all-reduce: the ranks' partials summed in rank order.
fn all_reduce(partials: Vec<Vec<Vec<f64>>>) -> Vec<Vec<f64>> {
    let mut parts = partials.into_iter();
    let first = parts.next().expect("at least one rank");
    parts.fold(first, |sum, p| add(&sum, &p))
}

/// The forward of `m` over `size` ranks.
fn tp_forward(m: &TinyModel, size: usize, tokens: &[usize]) -> Vec<Vec<f64>> {
    let ranks: Vec<RankWeights> = RankShard::all(m.shape, size)
        .unwrap()
        .into_iter()
        .map(|shard| RankWeights::cut(m, shard))
        .collect();
    let x = all_reduce(ranks.iter().map(|r| r.embed(tokens)).collect());
    // The norms are replicated: every rank computes them on the same reduced rows.
    let n = rms_norm(&x, &m.input_norm, EPS);
    let x = add(
        &x,
        &all_reduce(ranks.iter().map(|r| r.attention(&n)).collect()),
    );
    let n = rms_norm(&x, &m.post_norm, EPS);
    let x = add(&x, &all_reduce(ranks.iter().map(|r| r.mlp(&n)).collect()));
    let n = rms_norm(&x, &m.norm, EPS);
    // The gather: each rank's padded vocabulary slice of the logits, concatenated.
    let local: Vec<Vec<Vec<f64>>> = ranks.iter().map(|r| linear(&n, &r.lm_head, None)).collect();
    (0..tokens.len())
        .map(|t| {
            let mut row: Vec<f64> = local.iter().flat_map(|l| l[t].clone()).collect();
            row.truncate(m.shape.vocab_size);
            row
        })
        .collect()
}

/// The largest difference over the largest magnitude of `want`.
fn relative_error(got: &[Vec<f64>], want: &[Vec<f64>]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut diff, mut scale) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            diff = diff.max((a - b).abs());
            scale = scale.max(b.abs());
        }
    }
    diff / scale
}

fn tiny(heads: usize, kv_heads: usize, head_dim: usize, vocab: usize) -> TpShape {
    TpShape {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        hidden_size: 12,
        intermediate_size: 24,
        vocab_size: vocab,
    }
}

#[test]
fn a_tensor_parallel_forward_equals_the_unsharded_one() {
    // (shape, sizes): 2 KV heads over 1, 2, 4 ranks (replicated twice at 4); one KV head
    // replicated over 2 and 4; 4 KV heads over 8 ranks. Vocabularies that 2, 4 and 8 do
    // not divide put padding on the last ranks.
    let cases = [
        (tiny(4, 2, 4, 37), vec![1, 2, 4]),
        (tiny(4, 1, 6, 41), vec![2, 4]),
        (tiny(8, 4, 2, 50), vec![2, 4, 8]),
    ];
    for (seed, (shape, sizes)) in cases.into_iter().enumerate() {
        let model = TinyModel::new(shape, seed as u64 + 1);
        let mut rng = ChaCha8Rng::seed_from_u64(seed as u64 + 7);
        let mut tokens: Vec<usize> = (0..5)
            .map(|_| rng.random_range(0..shape.vocab_size))
            .collect();
        // The last token id lies on the last rank, next to its padding.
        tokens.push(shape.vocab_size - 1);
        let want = model.forward(&tokens);
        for size in sizes {
            let got = tp_forward(&model, size, &tokens);
            let err = relative_error(&got, &want);
            assert!(
                err < 1e-9,
                "{shape:?} over {size} ranks: relative error {err:e}"
            );
        }
    }
}
