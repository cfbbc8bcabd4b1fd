//! Paged attention over a block table, for prefill and decode alike: every query row of a
//! sequence attends causally to the sequence's cached keys, grouped-query heads sharing
//! their KV head.

use super::linear::SendPtr;
use super::quant::Simd;
use super::softmax::exp_row;
#[cfg(target_arch = "x86_64")]
use super::softmax::exp_row_avx2;
use super::{KvElem, KvLayout};
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
/// `context_len - q_len + i` and sees keys `0..=` that position. The caches hold f32 or
/// bf16 ([`KvElem`]); the arithmetic is f32 either way.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<T: KvElem>(
    q: &[f32],
    num_heads: usize,
    k_cache: &[T],
    v_cache: &[T],
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
    check_rows(seqs, o.len() / width);
    // One task per (tile of a sequence's query rows, KV head): the tile's rows and the
    // group's query heads read each key and value once.
    let kv_heads = layout.num_kv_heads as usize;
    let tile = tile_rows(seqs, kv_heads);
    let mut tasks = Vec::new();
    for (s, seq) in seqs.iter().enumerate() {
        for first in (0..seq.q_len).step_by(tile) {
            for kv_head in 0..kv_heads {
                tasks.push((s, first, tile.min(seq.q_len - first), kv_head));
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

/// Checks that every sequence of `seqs` has no more queries than context and owns rows of
/// its own among `rows` (the raw-pointer writes of the kernels rely on it).
pub(super) fn check_rows(seqs: &[AttentionSeq], rows: usize) {
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
}

/// Query rows of one sequence a task takes at a time.
const Q_TILE: usize = 8;

/// The rows a task takes: [`Q_TILE`], or one where tiles of [`Q_TILE`] would make fewer
/// than two tasks a thread (a decode or verification step of a few sequences, whose few
/// tasks would leave threads idle while the last ones run).
fn tile_rows(seqs: &[AttentionSeq], kv_heads: usize) -> usize {
    let tiles: usize = seqs.iter().map(|s| s.q_len.div_ceil(Q_TILE)).sum();
    if tiles * kv_heads >= 2 * rayon::current_num_threads() {
        Q_TILE
    } else {
        1
    }
}

/// Consecutive query rows of one sequence, each row's heads of one KV group, against that
/// group's cached keys and values.
struct GroupTask<'a, T> {
    /// Each row's query heads of the group, `[group, head_dim]`.
    q: Vec<&'a [f32]>,
    k_cache: &'a [T],
    v_cache: &'a [T],
    layout: &'a KvLayout,
    table: &'a [u32],
    kv_head: u64,
    /// The first row's position: row `r` sees keys `0..=first_pos + r`.
    first_pos: usize,
    scale: f32,
}

impl<T: KvElem> GroupTask<'_, T> {
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
        #[cfg(target_arch = "x86_64")]
        if FMA {
            // SAFETY: `FMA` is set only where the CPU has AVX2 and FMA (see `paged_attention`).
            unsafe { self.scores_avx2(&offsets, &mut scores) };
        }
        if !FMA || cfg!(not(target_arch = "x86_64")) {
            for j in 0..n {
                let k = &self.k_cache[token(j)..][..d];
                for (r, q) in self.q.iter().enumerate().filter(|&(r, _)| j < keys(r)) {
                    for h in 0..group {
                        let score = dot::<FMA, T>(&q[h * d..(h + 1) * d], k) * self.scale;
                        scores[(r * group + h) * n + j] = score;
                    }
                }
            }
        }
        let mut inv = Vec::with_capacity(self.q.len() * group);
        for (i, scores) in scores.chunks_mut(n).enumerate() {
            let scores = &mut scores[..keys(i / group)];
            #[cfg(target_arch = "x86_64")]
            if FMA {
                // SAFETY: as above.
                inv.push(1.0 / unsafe { exp_row_avx2(scores) });
                continue;
            }
            inv.push(1.0 / exp_row(scores));
        }
        // Each value row is read once for the tile's rows and the group's heads.
        out.iter_mut().for_each(|o| o.fill(0.0));
        #[cfg(target_arch = "x86_64")]
        if FMA {
            // SAFETY: as above.
            unsafe { self.values_avx2(&offsets, &scores, out) };
        }
        if !FMA || cfg!(not(target_arch = "x86_64")) {
            for j in 0..n {
                let v = &self.v_cache[token(j)..][..d];
                for (r, out) in out.iter_mut().enumerate().filter(|&(r, _)| j < keys(r)) {
                    for (h, oh) in out.chunks_exact_mut(d).enumerate() {
                        let p = scores[(r * group + h) * n + j];
                        for (o, &v) in oh.iter_mut().zip(v) {
                            *o = mul_add::<FMA>(p, v.to_f32(), *o);
                        }
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

/// Keys whose scores [`dots8_avx2`] computes at once.
#[cfg(target_arch = "x86_64")]
const KEY_BLOCK: usize = 8;

/// Keys whose values stay in the first-level cache while every row and head of a task
/// adds them up.
#[cfg(target_arch = "x86_64")]
const VALUE_BLOCK: usize = 64;

#[cfg(target_arch = "x86_64")]
impl<T: KvElem> GroupTask<'_, T> {
    /// The scores of [`run`](Self::run) (`scores[(r * group + h) * n + j]`, key `j` at
    /// `token[j]`), each the same as `dot_avx2` gives it: keys a block of eight at a time,
    /// each block read once for the task's rows and heads.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn scores_avx2(&self, token: &[usize], scores: &mut [f32]) {
        use std::arch::x86_64::*;
        let d = self.layout.head_dim as usize;
        let group = self.q[0].len() / d;
        let n = token.len();
        let scale = _mm256_set1_ps(self.scale);
        for j0 in (0..n).step_by(KEY_BLOCK) {
            let block: [&[T]; KEY_BLOCK] =
                std::array::from_fn(|m| &self.k_cache[token[(j0 + m).min(n - 1)]..][..d]);
            for (r, q) in self.q.iter().enumerate() {
                let visible = (self.first_pos + r + 1).saturating_sub(j0).min(KEY_BLOCK);
                for h in 0..group {
                    let q = &q[h * d..(h + 1) * d];
                    let row = &mut scores[(r * group + h) * n + j0..];
                    if visible == KEY_BLOCK {
                        let dots = _mm256_mul_ps(dots8_avx2(q, &block), scale);
                        _mm256_storeu_ps(row.as_mut_ptr(), dots);
                    } else {
                        for (m, score) in row[..visible].iter_mut().enumerate() {
                            *score = dot_avx2(q, block[m]) * self.scale;
                        }
                    }
                }
            }
        }
    }

    /// The weighted values of [`run`](Self::run) added into `out` (zeroed): each output
    /// element takes `fma(p, v, o)` over its visible keys in order, as the plain loop does,
    /// 64 (or 32) elements kept in registers while a block of keys goes by.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn values_avx2(&self, token: &[usize], scores: &[f32], out: &mut [&mut [f32]]) {
        let d = self.layout.head_dim as usize;
        let n = token.len();
        let (wide, whole) = (d / 64 * 64, d / 32 * 32);
        // `add_weighted` reads through a raw pointer: every key's values must lie in the cache.
        assert!(
            token.iter().all(|&at| at + d <= self.v_cache.len()),
            "paged_attention: a block id lies past the value cache"
        );
        let v = self.v_cache.as_ptr();
        for j0 in (0..n).step_by(VALUE_BLOCK) {
            let block = &token[j0..n.min(j0 + VALUE_BLOCK)];
            for (r, out) in out.iter_mut().enumerate() {
                let visible = (self.first_pos + r + 1).saturating_sub(j0).min(block.len());
                let group = out.len() / d;
                for (h, o) in out.chunks_exact_mut(d).enumerate() {
                    let p = &scores[(r * group + h) * n + j0..][..visible];
                    let keys = &block[..visible];
                    for c in (0..wide).step_by(64) {
                        add_weighted::<8, T>(o.as_mut_ptr().add(c), p, v.add(c), keys);
                    }
                    if whole > wide {
                        add_weighted::<4, T>(o.as_mut_ptr().add(wide), p, v.add(wide), keys);
                    }
                    for (&p, &at) in p.iter().zip(keys) {
                        let v = &self.v_cache[at..][..d];
                        for (o, &v) in o[whole..].iter_mut().zip(&v[whole..]) {
                            *o = p.mul_add(v.to_f32(), *o);
                        }
                    }
                }
            }
        }
    }
}

/// `o[i] = fma(p[j], v[keys[j] + i], o[i])` for `i` in `0..8 * N` and every `j` in order,
/// the `N` registers of `o` held while the keys go by.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_weighted<const N: usize, T: KvElem>(
    o: *mut f32,
    p: &[f32],
    v: *const T,
    keys: &[usize],
) {
    use std::arch::x86_64::*;
    let mut acc: [__m256; N] = std::array::from_fn(|i| _mm256_loadu_ps(o.add(8 * i)));
    for (&p, &at) in p.iter().zip(keys) {
        let (p, v) = (_mm256_set1_ps(p), v.add(at));
        for (i, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(p, T::load8(v.add(8 * i)), *acc);
        }
    }
    for (i, acc) in acc.into_iter().enumerate() {
        _mm256_storeu_ps(o.add(8 * i), acc);
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
fn dot<const FMA: bool, T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: `FMA` is set only where the CPU has AVX2 and FMA (see `paged_attention`).
        return unsafe { dot_avx2(a, b) };
    }
    let mut lanes = [0f32; 16];
    let whole = a.len() / 16 * 16;
    for (a, b) in a[..whole].chunks_exact(16).zip(b[..whole].chunks_exact(16)) {
        for l in 0..16 {
            lanes[l] = mul_add::<FMA>(a[l], b[l].to_f32(), lanes[l]);
        }
    }
    let mut sum = 0f32;
    for (&a, &b) in a[whole..].iter().zip(&b[whole..]) {
        sum = mul_add::<FMA>(a, b.to_f32(), sum);
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
unsafe fn dot_avx2<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    use std::arch::x86_64::*;
    let whole = a.len().min(b.len()) / 16 * 16;
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for i in (0..whole).step_by(16) {
        let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(pa), T::load8(pb), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(8)), T::load8(pb.add(8)), hi);
    }
    let mut sum = 0f32;
    for (&a, &b) in a[whole..].iter().zip(&b[whole..]) {
        sum = a.mul_add(b.to_f32(), sum);
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

/// `dot_avx2(a, k[m])` for the eight keys at once, in lane `m`: the same sixteen lanes,
/// multiply-adds and reduction tree for each key, the eight trees run side by side.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots8_avx2<T: KvElem>(a: &[f32], k: &[&[T]; KEY_BLOCK]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let whole = a.len() / 16 * 16;
    // Each key's two eight-lane sums, added: `eight` of `dot_avx2`; four keys at a time.
    let mut eight = [_mm256_setzero_ps(); KEY_BLOCK];
    for half in 0..2 {
        let keys = &k[4 * half..4 * half + 4];
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
        for i in (0..whole).step_by(16) {
            let (a_lo, a_hi) = (
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(a.as_ptr().add(i + 8)),
            );
            for m in 0..4 {
                let p = keys[m].as_ptr().add(i);
                lo[m] = _mm256_fmadd_ps(a_lo, T::load8(p), lo[m]);
                hi[m] = _mm256_fmadd_ps(a_hi, T::load8(p.add(8)), hi[m]);
            }
        }
        for m in 0..4 {
            eight[4 * half + m] = _mm256_add_ps(lo[m], hi[m]);
        }
    }
    // four[l] = eight[l] + eight[l + 4], two keys to a register.
    let four = |x: __m256, y: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps(x, y, 0x20),
            _mm256_permute2f128_ps(x, y, 0x31),
        )
    };
    let (f01, f23) = (four(eight[0], eight[1]), four(eight[2], eight[3]));
    let (f45, f67) = (four(eight[4], eight[5]), four(eight[6], eight[7]));
    // two[l] = four[l] + four[l + 2]: keys (0, 2 | 1, 3) and (4, 6 | 5, 7).
    let two = |x: __m256, y: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps(x, y, 0b01_00_01_00),
            _mm256_shuffle_ps(x, y, 0b11_10_11_10),
        )
    };
    let (t0, t1) = (two(f01, f23), two(f45, f67));
    // one = two[0] + two[1]: keys in lanes 0, 2, 4, 6, 1, 3, 5, 7.
    let one = _mm256_add_ps(
        _mm256_shuffle_ps(t0, t1, 0b10_00_10_00),
        _mm256_shuffle_ps(t0, t1, 0b11_01_11_01),
    );
    let ordered = _mm256_permutevar8x32_ps(one, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // The values past the last whole sixteen, as `dot_avx2` adds them.
    let tails: [f32; KEY_BLOCK] = std::array::from_fn(|m| {
        a[whole..]
            .iter()
            .zip(&k[m][whole..])
            .fold(0f32, |sum, (&a, &b)| a.mul_add(b.to_f32(), sum))
    });
    _mm256_add_ps(ordered, _mm256_loadu_ps(tails.as_ptr()))
}

#[cfg(test)]
mod tests {
    use super::super::write_kv;
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A layer's K and V caches (NaN where nothing is written) holding `k` and `v`, one
    /// token per slot of `layout.slot_elems()`, token `t` in block `table[t / block_size]`.
    fn cache(layout: &KvLayout, table: &[u32], k: &[f32], v: &[f32]) -> (Vec<f32>, Vec<f32>) {
        cache_of(layout, table, k, v)
    }

    /// [`cache`] in elements of `T`.
    fn cache_of<T: KvElem>(
        layout: &KvLayout,
        table: &[u32],
        k: &[f32],
        v: &[f32],
    ) -> (Vec<T>, Vec<T>) {
        let bs = layout.block_size;
        let mut kc = vec![T::from_f32(f32::NAN); layout.layer_elems() as usize];
        let mut vc = kc.clone();
        let slots: Vec<i64> = (0..(k.len() as u64 / layout.slot_elems()))
            .map(|t| (table[(t / bs) as usize] as u64 * bs + t % bs) as i64)
            .collect();
        write_kv(&mut kc, &mut vc, layout, &slots, k, v);
        (kc, vc)
    }

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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn eight_keys_at_once_score_as_one_key_at_a_time_bit_for_bit() {
        if !Simd::detected().has_avx2() {
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for d in [8usize, 16, 24, 64, 72, 128] {
            let mut random =
                |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-3.0..3.0)).collect() };
            let (a, keys) = (random(d), random(KEY_BLOCK * d));
            let k: [&[f32]; KEY_BLOCK] = std::array::from_fn(|m| &keys[m * d..(m + 1) * d]);
            let mut got = [f32::NAN; KEY_BLOCK];
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            unsafe {
                std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr(), dots8_avx2(&a, &k));
                for (m, got) in got.iter().enumerate() {
                    assert_eq!(got.to_bits(), dot_avx2(&a, k[m]).to_bits(), "d {d} key {m}");
                }
            }
        }
    }

    /// A 64-wide head (the models' width) over 3 to 150 keys, prefill rows spanning
    /// several tiles: against the float64 reference, and each row equal bit for bit to the
    /// same row computed alone.
    #[test]
    fn wide_heads_match_dense_attention_and_a_row_alone() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let (heads, kvh, d, bs) = (6usize, 2usize, 64usize, 16u64);
        for (past, q_new) in [(0usize, 3usize), (5, 1), (0, 37), (113, 37)] {
            let total = past + q_new;
            let layout = KvLayout {
                num_blocks: 20,
                block_size: bs,
                num_kv_heads: kvh as u64,
                head_dim: d as u64,
            };
            let table: Vec<u32> = (0..total.div_ceil(bs as usize) as u32)
                .map(|b| 19 - b)
                .collect();
            let kv_w = kvh * d;
            let mut random =
                |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
            let (k, v, q) = (
                random(total * kv_w),
                random(total * kv_w),
                random(q_new * heads * d),
            );
            let (kc, vc) = cache(&layout, &table, &k, &v);
            let scale = 1.0 / (d as f32).sqrt();
            let attend = |q: &[f32], q_len: usize, context_len: usize| -> Vec<f32> {
                let mut o = vec![f32::NAN; q.len()];
                let seqs = [AttentionSeq {
                    q_start: 0,
                    q_len,
                    context_len,
                    block_table: &table,
                }];
                paged_attention(q, heads, &kc, &vc, &layout, &seqs, scale, &mut o);
                o
            };
            let o = attend(&q, q_new, total);
            let want = dense(&q, &k, &v, heads, kvh, d, past);
            for (got, want) in o.iter().zip(&want) {
                assert!(
                    (*got as f64 - want).abs() < 1e-5,
                    "past {past}: {got} vs {want}"
                );
            }
            let w = heads * d;
            for i in [0, q_new / 2, q_new - 1] {
                let alone = attend(&q[i * w..(i + 1) * w], 1, past + i + 1);
                assert_eq!(alone, o[i * w..(i + 1) * w], "past {past} row {i}");
            }
        }
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
        let (kc, vc) = cache(&layout, &table, &k, &v);
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

    /// bf16 caches: the kernel widens each element exactly, so it matches the float64
    /// reference over the bf16-rounded keys and values as closely as f32 caches match
    /// theirs, prefill and decode rows alike, over scattered blocks.
    #[test]
    fn bf16_caches_match_dense_attention_over_rounded_keys_and_values() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (heads, kvh, d, bs) = (6usize, 2usize, 64usize, 16u64);
        let layout = KvLayout {
            num_blocks: 24,
            block_size: bs,
            num_kv_heads: kvh as u64,
            head_dim: d as u64,
        };
        for (past, q_new) in [(0usize, 21usize), (150, 1), (90, 9)] {
            let total = past + q_new;
            let table: Vec<u32> = (0..total.div_ceil(bs as usize) as u32)
                .map(|b| (b * 7 + 3) % 24)
                .collect();
            let mut random =
                |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-2.0..2.0)).collect() };
            let (k, v, q) = (
                random(total * kvh * d),
                random(total * kvh * d),
                random(q_new * heads * d),
            );
            let (kc, vc) = cache_of::<half::bf16>(&layout, &table, &k, &v);
            let round = |x: &[f32]| -> Vec<f32> {
                x.iter()
                    .map(|&x| half::bf16::from_f32(x).to_f32())
                    .collect()
            };
            let mut o = vec![f32::NAN; q.len()];
            let seqs = [AttentionSeq {
                q_start: 0,
                q_len: q_new,
                context_len: total,
                block_table: &table,
            }];
            let scale = 1.0 / (d as f32).sqrt();
            paged_attention(&q, heads, &kc, &vc, &layout, &seqs, scale, &mut o);
            // Widening is exact: the same as f32 caches holding the rounded values, bit
            // for bit.
            let (kf, vf) = cache(&layout, &table, &round(&k), &round(&v));
            let mut of = vec![f32::NAN; q.len()];
            paged_attention(&q, heads, &kf, &vf, &layout, &seqs, scale, &mut of);
            assert_eq!(
                o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                of.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "past {past}"
            );
            let want = dense(&q, &round(&k), &round(&v), heads, kvh, d, past);
            for (got, want) in o.iter().zip(&want) {
                assert!(
                    (*got as f64 - want).abs() < 1e-5,
                    "past {past}: {got} vs {want}"
                );
            }
        }
    }
}
