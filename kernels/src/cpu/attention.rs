//! Paged attention over a block table, for prefill and decode alike: every query row of a
//! sequence attends causally to the sequence's cached keys, grouped-query heads sharing
//! their KV head.

use super::linear::SendPtr;
use super::quant::Simd;
use super::KvLayout;
use rayon::prelude::*;

/// One sequence's share of a batch: its query rows and its cache.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSeq<'a> {
    /// First row of q and o that belongs to this sequence.
    pub q_start: usize,
    /// Number of query rows (new tokens) this step.
    pub q_len: usize,
    /// Tokens in the cache once this step's keys are written (past + new).
    pub context_len: usize,
    /// Block ids holding the sequence's tokens, in order.
    pub block_table: &'a [u32],
}

/// Computes `o` for every query row that a sequence of `seqs` covers; rows of `o` that no
/// sequence covers (padding) are left untouched. `q` and `o` are
/// `[rows, num_heads * head_dim]`; the query at row `q_start + i` sits at position
/// `context_len - q_len + i` and sees keys `0..=` that position.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: &[f32],
    num_heads: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    layout: &KvLayout,
    seqs: &[AttentionSeq],
    scale: f32,
    o: &mut [f32],
) {
    let d = layout.head_dim as usize;
    let width = num_heads * d;
    let group = num_heads / layout.num_kv_heads as usize;
    assert!(
        group > 0 && num_heads.is_multiple_of(layout.num_kv_heads as usize),
        "heads not grouped"
    );
    assert_eq!(q.len(), o.len(), "paged_attention: q and o differ in size");
    let rows = o.len() / width;
    let mut owned = vec![false; rows];
    for seq in seqs {
        assert!(seq.q_len <= seq.context_len, "more queries than context");
        assert!(
            seq.q_start + seq.q_len <= rows,
            "a sequence's rows lie past q and o"
        );
        for row in &mut owned[seq.q_start..seq.q_start + seq.q_len] {
            assert!(!*row, "two sequences share a row of q and o");
            *row = true;
        }
    }
    // One task per (tile of a sequence's query rows, KV head): the tile's rows and the
    // group's query heads read each key and value once.
    let kv_heads = layout.num_kv_heads as usize;
    let mut tasks = Vec::new();
    for (s, seq) in seqs.iter().enumerate() {
        for first in (0..seq.q_len).step_by(Q_TILE) {
            for kv_head in 0..kv_heads {
                tasks.push((s, first, Q_TILE.min(seq.q_len - first), kv_head));
            }
        }
    }
    let fma = Simd::detected().has_avx2();
    let dst = SendPtr(o.as_mut_ptr());
    tasks.into_par_iter().for_each(|(s, first, tile, kv_head)| {
        let seq = &seqs[s];
        let at = |r: usize| (seq.q_start + first + r) * width + kv_head * group * d;
        let task = GroupTask {
            q: (0..tile).map(|r| &q[at(r)..at(r) + group * d]).collect(),
            k_cache,
            v_cache,
            layout,
            table: seq.block_table,
            kv_head: kv_head as u64,
            first_pos: seq.context_len - seq.q_len + first,
            scale,
        };
        // SAFETY: row `q_start + first + r`'s columns of this KV group lie in `o` (checked
        // above) and belong to this task alone: sequences do not share rows (checked
        // above) and each (row, KV group) is in one tile.
        let mut out: Vec<&mut [f32]> = (0..tile)
            .map(|r| unsafe { std::slice::from_raw_parts_mut(dst.at(at(r)), group * d) })
            .collect();
        #[cfg(target_arch = "x86_64")]
        if fma {
            // SAFETY: `has_avx2` said this CPU has AVX2 and FMA.
            unsafe { task.run_fma(&mut out) };
            return;
        }
        let _ = fma;
        task.run::<false>(&mut out);
    });
}

/// Query rows of one sequence a task takes at a time.
const Q_TILE: usize = 8;

/// Consecutive query rows of one sequence, each row's heads of one KV group, against that
/// group's cached keys and values.
struct GroupTask<'a> {
    /// Each row's query heads of the group, `[group, head_dim]`.
    q: Vec<&'a [f32]>,
    k_cache: &'a [f32],
    v_cache: &'a [f32],
    layout: &'a KvLayout,
    table: &'a [u32],
    kv_head: u64,
    /// The first row's position: row `r` sees keys `0..=first_pos + r`.
    first_pos: usize,
    scale: f32,
}

impl GroupTask<'_> {
    /// [`run`](Self::run) with fused multiply-adds, compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_fma(&self, out: &mut [&mut [f32]]) {
        self.run::<true>(out)
    }

    /// Writes each row's outputs of the group (`[group, head_dim]`) into `out[r]`; `FMA`
    /// fuses each multiply-add (only where the CPU has FMA). A row's arithmetic does not
    /// depend on the other rows of the tile.
    #[inline(always)]
    fn run<const FMA: bool>(&self, out: &mut [&mut [f32]]) {
        let d = self.layout.head_dim as usize;
        let group = self.q[0].len() / d;
        let keys = |r: usize| self.first_pos + r + 1;
        let n = keys(self.q.len() - 1);
        let offsets: Vec<usize> = (self.layout)
            .token_offsets(self.table, n as u64, self.kv_head)
            .map(|at| at as usize)
            .collect();
        let token = |j: usize| offsets[j];
        // Row r's head h scores at `(r * group + h) * n`, its first `keys(r)` used.
        let mut scores = vec![0f32; self.q.len() * group * n];
        for j in 0..n {
            let k = &self.k_cache[token(j)..][..d];
            for (r, q) in self.q.iter().enumerate().filter(|&(r, _)| j < keys(r)) {
                for h in 0..group {
                    let score = dot::<FMA>(&q[h * d..(h + 1) * d], k) * self.scale;
                    scores[(r * group + h) * n + j] = score;
                }
            }
        }
        let mut inv = Vec::with_capacity(self.q.len() * group);
        for (i, scores) in scores.chunks_mut(n).enumerate() {
            let scores = &mut scores[..keys(i / group)];
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                total += *s;
            }
            inv.push(1.0 / total);
        }
        // Each value row is read once for the tile's rows and the group's heads.
        out.iter_mut().for_each(|o| o.fill(0.0));
        for j in 0..n {
            let v = &self.v_cache[token(j)..][..d];
            for (r, out) in out.iter_mut().enumerate().filter(|&(r, _)| j < keys(r)) {
                for (h, oh) in out.chunks_exact_mut(d).enumerate() {
                    let p = scores[(r * group + h) * n + j];
                    for (o, &v) in oh.iter_mut().zip(v) {
                        *o = mul_add::<FMA>(p, v, *o);
                    }
                }
            }
        }
        for (r, out) in out.iter_mut().enumerate() {
            for (h, oh) in out.chunks_exact_mut(d).enumerate() {
                let inv = inv[r * group + h];
                oh.iter_mut().for_each(|o| *o *= inv);
            }
        }
    }
}

/// `a * b + c`, fused when `FMA`.
#[inline(always)]
fn mul_add<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `a · b` summed in sixteen lanes, then the lanes in a fixed order (so it vectorizes and a
/// row's result is the same whatever else runs).
#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: `FMA` is set only where the CPU has AVX2 and FMA (see `paged_attention`).
        return unsafe { dot_avx2(a, b) };
    }
    let mut lanes = [0f32; 16];
    let whole = a.len() / 16 * 16;
    for (a, b) in a[..whole].chunks_exact(16).zip(b[..whole].chunks_exact(16)) {
        for l in 0..16 {
            lanes[l] = mul_add::<FMA>(a[l], b[l], lanes[l]);
        }
    }
    let mut sum = 0f32;
    for (&a, &b) in a[whole..].iter().zip(&b[whole..]) {
        sum = mul_add::<FMA>(a, b, sum);
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

/// [`dot`] with FMA in two eight-lane registers: the same sixteen lanes, multiply-adds and
/// reduction tree, so the same result, without leaving the vectorizing to the compiler
/// (which split the lanes into pairs).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let whole = a.len().min(b.len()) / 16 * 16;
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for i in (0..whole).step_by(16) {
        let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(pb), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(8)), _mm256_loadu_ps(pb.add(8)), hi);
    }
    let mut sum = 0f32;
    for (&a, &b) in a[whole..].iter().zip(&b[whole..]) {
        sum = a.mul_add(b, sum);
    }
    let eight = _mm256_add_ps(lo, hi);
    let four = _mm_add_ps(
        _mm256_castps256_ps128(eight),
        _mm256_extractf128_ps(eight, 1),
    );
    let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    let one = _mm_add_ss(two, _mm_movehdup_ps(two));
    _mm_cvtss_f32(one) + sum
}

#[cfg(test)]
mod tests {
    use super::super::write_kv;
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Dense attention in f64 over contiguous K/V rows, written independently.
    fn dense(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: usize,
        kvh: usize,
        d: usize,
        past: usize,
    ) -> Vec<f64> {
        let n = q.len() / (heads * d);
        let mut out = vec![0.0; n * heads * d];
        for i in 0..n {
            for h in 0..heads {
                let g = h / (heads / kvh);
                let s: Vec<f64> = (0..=past + i)
                    .map(|j| {
                        (0..d)
                            .map(|c| {
                                q[(i * heads + h) * d + c] as f64 * k[(j * kvh + g) * d + c] as f64
                            })
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (j, sj) in s.iter().enumerate() {
                    for c in 0..d {
                        out[(i * heads + h) * d + c] +=
                            (sj - m).exp() / z * v[(j * kvh + g) * d + c] as f64;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn scattered_blocks_match_dense_attention_and_padding_is_untouched() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let (heads, kvh, d, bs) = (4usize, 2usize, 8usize, 4u64);
        let layout = KvLayout {
            num_blocks: 40,
            block_size: bs,
            num_kv_heads: kvh as u64,
            head_dim: d as u64,
        };
        let total = 13usize; // 10 cached tokens, then 3 new queries
        let past = 10usize;
        let table: Vec<u32> = vec![33, 2, 17, 39];
        let kv_w = kvh * d;
        let k: Vec<f32> = (0..total * kv_w)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let v: Vec<f32> = (0..total * kv_w)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut kc = vec![f32::NAN; layout.layer_elems() as usize];
        let mut vc = kc.clone();
        let slots: Vec<i64> = (0..total as u64)
            .map(|t| (table[(t / bs) as usize] as u64 * bs + t % bs) as i64)
            .collect();
        write_kv(&mut kc, &mut vc, &layout, &slots, &k, &v);
        let q_new = 3;
        let q: Vec<f32> = (0..(q_new + 2) * heads * d)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut o = vec![-7.0f32; q.len()];
        let seqs = [AttentionSeq {
            q_start: 0,
            q_len: q_new,
            context_len: total,
            block_table: &table,
        }];
        paged_attention(
            &q,
            heads,
            &kc,
            &vc,
            &layout,
            &seqs,
            1.0 / (d as f32).sqrt(),
            &mut o,
        );
        let want = dense(&q[..q_new * heads * d], &k, &v, heads, kvh, d, past);
        for (got, want) in o.iter().zip(&want) {
            assert!((*got as f64 - want).abs() < 1e-5, "{got} vs {want}");
        }
        assert!(
            o[q_new * heads * d..].iter().all(|&x| x == -7.0),
            "padding rows were written"
        );
    }
}
