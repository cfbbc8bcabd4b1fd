//! Paged latent attention (DeepSeek's multi-head latent attention with absorbed weights):
//! every head of a query row scores the one cache row each token keeps, `[latent | rotary
//! key]`, and sums the latent parts of those rows as its values. It is multi-query
//! attention whose value is the first `latent` elements of the key.

use super::attention::check_rows;
use super::linear::SendPtr;
use super::softmax::exp_row;
use super::{AttentionSeq, KvLayout};
use rayon::prelude::*;

/// Query rows of one sequence a task takes at a time.
const ROW_TILE: usize = 4;
/// Heads a task takes at a time.
const HEAD_TILE: usize = 8;

/// Computes `o` (`[rows, num_heads, latent]`) for every query row the sequences of `seqs`
/// cover; rows no sequence covers (padding) are left untouched. `q` is
/// `[rows, num_heads, width]` with `width` the cache row (`layout.head_dim`, one KV head):
/// each head's absorbed query over the latent, then its rotary query. The query at row
/// `q_start + i` sits at position `context_len - q_len + i` and sees the rows of tokens
/// `0..=` that position. A row's result does not depend on the other rows or sequences.
#[allow(clippy::too_many_arguments)]
pub fn mla_attention(
    q: &[f32],
    num_heads: usize,
    cache: &[f32],
    layout: &KvLayout,
    latent: usize,
    seqs: &[AttentionSeq],
    scale: f32,
    o: &mut [f32],
) {
    let width = layout.head_dim as usize;
    assert_eq!(
        layout.num_kv_heads, 1,
        "mla_attention: one latent row a token"
    );
    assert!(
        latent <= width,
        "mla_attention: the latent is wider than the row"
    );
    let rows = q.len() / (num_heads * width);
    assert_eq!(
        q.len(),
        rows * num_heads * width,
        "mla_attention: q is not whole rows"
    );
    assert_eq!(
        o.len(),
        rows * num_heads * latent,
        "mla_attention: o differs from q in rows"
    );
    check_rows(seqs, rows);
    let mut tasks = Vec::new();
    for (s, seq) in seqs.iter().enumerate() {
        for first in (0..seq.q_len).step_by(ROW_TILE) {
            for head in (0..num_heads).step_by(HEAD_TILE) {
                let tile = (
                    ROW_TILE.min(seq.q_len - first),
                    HEAD_TILE.min(num_heads - head),
                );
                tasks.push((s, first, head, tile));
            }
        }
    }
    let dst = SendPtr(o.as_mut_ptr());
    tasks
        .into_par_iter()
        .for_each(|(s, first, head, (tile, heads))| {
            let seq = &seqs[s];
            let row = |r: usize| seq.q_start + first + r;
            let task = Task {
                q: (0..tile)
                    .map(|r| &q[(row(r) * num_heads + head) * width..][..heads * width])
                    .collect(),
                cache,
                layout,
                table: seq.block_table,
                first_pos: seq.context_len - seq.q_len + first,
                latent,
                scale,
            };
            // SAFETY: row `row(r)`'s heads `head..head + heads` lie in `o` (checked above)
            // and belong to this task alone: sequences do not share rows (checked above)
            // and each (row, head) is in one task.
            let mut out: Vec<&mut [f32]> = (0..tile)
                .map(|r| unsafe {
                    let at = (row(r) * num_heads + head) * latent;
                    std::slice::from_raw_parts_mut(dst.at(at), heads * latent)
                })
                .collect();
            task.run(&mut out);
        });
}

/// Consecutive query rows of one sequence, some of their heads, against the sequence's
/// cache rows.
struct Task<'a> {
    /// Each row's heads, `[heads, width]`.
    q: Vec<&'a [f32]>,
    cache: &'a [f32],
    layout: &'a KvLayout,
    table: &'a [u32],
    /// The first row's position: row `r` sees tokens `0..=first_pos + r`.
    first_pos: usize,
    latent: usize,
    scale: f32,
}

impl Task<'_> {
    /// Writes each row's heads' outputs (`[heads, latent]`) into `out[r]`.
    fn run(&self, out: &mut [&mut [f32]]) {
        let width = self.layout.head_dim as usize;
        let heads = self.q[0].len() / width;
        let keys = |r: usize| self.first_pos + r + 1;
        let n = keys(self.q.len() - 1);
        let offsets: Vec<usize> = (self.layout)
            .token_offsets(self.table, n as u64, 0)
            .map(|at| at as usize)
            .collect();
        assert!(
            offsets.iter().all(|&at| at + width <= self.cache.len()),
            "mla_attention: a token's row lies past the cache"
        );
        // Row r's head h scores at `(r * heads + h) * n`, its first `keys(r)` used.
        let mut scores = vec![0f32; self.q.len() * heads * n];
        for (j, &at) in offsets.iter().enumerate() {
            let row = &self.cache[at..at + width];
            for (r, q) in self.q.iter().enumerate().filter(|&(r, _)| j < keys(r)) {
                for (h, q) in q.chunks_exact(width).enumerate() {
                    scores[(r * heads + h) * n + j] = dot(q, row) * self.scale;
                }
            }
        }
        let mut inv = Vec::with_capacity(self.q.len() * heads);
        for (i, scores) in scores.chunks_mut(n).enumerate() {
            let scores = &mut scores[..keys(i / heads)];
            inv.push(1.0 / exp_row(scores));
        }
        out.iter_mut().for_each(|o| o.fill(0.0));
        let l = self.latent;
        for (j, &at) in offsets.iter().enumerate() {
            let values = &self.cache[at..at + l];
            for (r, out) in out.iter_mut().enumerate().filter(|&(r, _)| j < keys(r)) {
                for (h, oh) in out.chunks_exact_mut(l).enumerate() {
                    let p = scores[(r * heads + h) * n + j];
                    oh.iter_mut().zip(values).for_each(|(o, &v)| *o += p * v);
                }
            }
        }
        for (r, out) in out.iter_mut().enumerate() {
            for (h, oh) in out.chunks_exact_mut(l).enumerate() {
                let inv = inv[r * heads + h];
                oh.iter_mut().for_each(|o| *o *= inv);
            }
        }
    }
}

/// `a · b` in sixteen lanes summed in a fixed order, whatever the CPU.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let whole = a.len() / 16 * 16;
    for (a, b) in a[..whole].chunks_exact(16).zip(b[..whole].chunks_exact(16)) {
        for l in 0..16 {
            lanes[l] += a[l] * b[l];
        }
    }
    let mut sum = 0f32;
    for (&a, &b) in a[whole..].iter().zip(&b[whole..]) {
        sum += a * b;
    }
    let mut width = 16;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
    }
    lanes[0] + sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The attention of one query row's head in float64, from the same cache.
    fn reference(q: &[f32], rows: &[&[f32]], latent: usize, scale: f64) -> Vec<f64> {
        let scores: Vec<f64> = rows
            .iter()
            .map(|k| {
                q.iter()
                    .zip(*k)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = e.iter().sum();
        (0..latent)
            .map(|i| {
                rows.iter()
                    .zip(&e)
                    .map(|(k, p)| k[i] as f64 * p)
                    .sum::<f64>()
                    / total
            })
            .collect()
    }

    #[test]
    fn matches_float64_over_scattered_blocks_and_leaves_padding_alone() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (heads, latent, rope, block) = (11, 40, 8, 4u64);
        let width = latent + rope;
        let layout = KvLayout {
            num_blocks: 64,
            block_size: block,
            num_kv_heads: 1,
            head_dim: width as u64,
        };
        let cache: Vec<f32> = (0..layout.layer_elems())
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        // Two sequences: a prefill of 9 rows after 3 cached tokens, and one decode row.
        let tables: [Vec<u32>; 2] = [vec![40, 3, 17, 60], vec![9, 63, 1, 22, 5]];
        let seqs = [
            AttentionSeq {
                q_start: 0,
                q_len: 9,
                context_len: 12,
                block_table: &tables[0],
            },
            AttentionSeq {
                q_start: 9,
                q_len: 1,
                context_len: 19,
                block_table: &tables[1],
            },
        ];
        let rows = 12; // two padded rows at the end
        let q: Vec<f32> = (0..rows * heads * width)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let sentinel = -1234.5f32;
        let mut o = vec![sentinel; rows * heads * latent];
        let scale = 0.3;
        mla_attention(&q, heads, &cache, &layout, latent, &seqs, scale, &mut o);
        for seq in &seqs {
            for i in 0..seq.q_len {
                let row = seq.q_start + i;
                let pos = seq.context_len - seq.q_len + i;
                let keys: Vec<&[f32]> = layout
                    .token_offsets(seq.block_table, pos as u64 + 1, 0)
                    .map(|at| &cache[at as usize..at as usize + width])
                    .collect();
                for h in 0..heads {
                    let qh = &q[(row * heads + h) * width..][..width];
                    let want = reference(qh, &keys, latent, scale as f64);
                    let got = &o[(row * heads + h) * latent..][..latent];
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (*g as f64 - w).abs() < 1e-5,
                            "row {row} head {h}: {g} vs {w}"
                        );
                    }
                }
            }
        }
        assert!(o[10 * heads * latent..].iter().all(|&v| v == sentinel));
    }

    #[test]
    fn a_row_does_not_depend_on_its_batch() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let (heads, latent, width) = (3, 16, 20);
        let layout = KvLayout {
            num_blocks: 8,
            block_size: 16,
            num_kv_heads: 1,
            head_dim: width as u64,
        };
        let cache: Vec<f32> = (0..layout.layer_elems())
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let table = [5u32, 2];
        let q: Vec<f32> = (0..7 * heads * width)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let whole = AttentionSeq {
            q_start: 0,
            q_len: 7,
            context_len: 20,
            block_table: &table,
        };
        let mut all = vec![0f32; 7 * heads * latent];
        mla_attention(&q, heads, &cache, &layout, latent, &[whole], 0.5, &mut all);
        // The last row alone, as a decode step at the same position.
        let last = AttentionSeq {
            q_start: 0,
            q_len: 1,
            context_len: 20,
            block_table: &table,
        };
        let mut one = vec![0f32; heads * latent];
        let q_last = &q[6 * heads * width..];
        mla_attention(
            q_last,
            heads,
            &cache,
            &layout,
            latent,
            &[last],
            0.5,
            &mut one,
        );
        assert_eq!(one, all[6 * heads * latent..]);
    }
}
