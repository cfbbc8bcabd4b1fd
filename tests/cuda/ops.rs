//! The element-wise, norm and matrix-product kernels against the CPU kernels, on the same
//! bf16-rounded inputs widened to f32.
//!
//! Tolerances: a bf16 output carries 8 significant bits, so a correct result is within half
//! an ulp, 2^-9 relative, of the f32 value; the bounds below (1e-2 relative plus a small
//! absolute term for values near zero) leave room for f32 summation in another order
//! and nothing more. The matrix products compare f32 outputs of bf16 inputs, whose
//! products are exact in f32, so only the summation order differs: 1e-4 relative.

use crate::{assert_close, random_f32, rng, setup, to_bf16, to_f32};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use half::bf16;
use peregrine_kernels::cpu;
use peregrine_kernels::cuda::elementwise;
use peregrine_kernels::cuda::gemm::{Gemm, NormedInput, FIXED_MMA_CHUNK};
use peregrine_kernels::cuda::norm;
use peregrine_runtime::cuda::Gpu;
use rand::Rng;

/// Rounds to bf16 and back, so the CPU reference sees exactly the GPU's inputs.
fn bf16_round(values: &[f32]) -> Vec<f32> {
    to_f32(&to_bf16(values))
}

/// A device buffer of `real` elements followed by a sentinel tail, all poisoned with
/// `poison`; the tail must survive the kernel.
fn poisoned<T: DeviceRepr + Copy>(gpu: &Gpu, real: usize, poison: T) -> CudaSlice<T> {
    gpu.upload(&vec![poison; real + 64]).unwrap()
}

fn download_checked<T: DeviceRepr + Copy + PartialEq + std::fmt::Debug, S: DevicePtr<T>>(
    gpu: &Gpu,
    buffer: &S,
    real: usize,
    poison: T,
) -> Vec<T> {
    let all = gpu.download(buffer).unwrap();
    assert!(
        all[real..].iter().all(|&v| v == poison),
        "a kernel wrote past the {real} real elements"
    );
    all[..real].to_vec()
}

/// A finite sentinel far outside every value these tests produce (a NaN would not compare
/// equal to itself).
const POISON: bf16 = bf16::from_bits(0xc6f5); // -31,360

#[test]
fn rms_norm_and_the_fused_residual_add_match_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("rms_norm");
    let eps = 1e-5f32;
    // 2048: every element in registers; 576: a partial last pass; 10000: past what the
    // kernel keeps in registers, so the rest is read again.
    for (rows, dim) in [(37, 2048), (5, 576), (3, 10_000)] {
        let x = random_f32(&mut rng, rows * dim, 3.0);
        let delta = bf16_round(&random_f32(&mut rng, rows * dim, 1.0));
        let w = bf16_round(&random_f32(&mut rng, dim, 1.5));
        let (x_d, delta_d, w_d) = (
            s.gpu.upload(&x).unwrap(),
            s.gpu.upload(&to_bf16(&delta)).unwrap(),
            s.gpu.upload(&to_bf16(&w)).unwrap(),
        );
        let mut out_d = poisoned(&s.gpu, rows * dim, POISON);
        let stream = s.gpu.stream();
        norm::rms_norm(
            &s.kernels,
            stream,
            &x_d.as_view(),
            &w_d.as_view(),
            &mut out_d.slice_mut(..rows * dim),
            rows,
            eps,
        )
        .unwrap();
        let got = to_f32(&download_checked(&s.gpu, &out_d, rows * dim, POISON));
        let mut want = vec![0.0; rows * dim];
        cpu::rms_norm(&x, &w, eps, &mut want);
        assert_close(&format!("rms_norm {dim}"), &got, &want, 1e-3, 1e-2);

        let mut residual_d = s.gpu.upload(&x).unwrap();
        let mut out_d = poisoned(&s.gpu, rows * dim, POISON);
        norm::add_rms_norm(
            &s.kernels,
            stream,
            &mut residual_d.as_view_mut(),
            &delta_d.as_view(),
            &w_d.as_view(),
            &mut out_d.slice_mut(..rows * dim),
            rows,
            eps,
        )
        .unwrap();
        let got = to_f32(&download_checked(&s.gpu, &out_d, rows * dim, POISON));
        let mut residual = x.clone();
        cpu::add_rms_norm(&mut residual, &delta, &w, eps, &mut want);
        assert_close(&format!("add_rms_norm {dim}"), &got, &want, 1e-3, 1e-2);
        let got_residual = s.gpu.download(&residual_d).unwrap();
        assert_close("add_rms_norm residual", &got_residual, &residual, 0.0, 1e-6);
    }
}

#[test]
fn per_head_rms_norm_touches_only_its_heads() {
    let Some(s) = setup() else { return };
    let mut rng = rng("head_rms_norm");
    let (rows, heads, d, eps) = (9, 4, 128, 1e-6f32);
    let width = 3 * heads * d;
    let x = bf16_round(&random_f32(&mut rng, rows * width, 2.0));
    let w = bf16_round(&random_f32(&mut rng, d, 1.5));
    let mut x_d = s.gpu.upload(&to_bf16(&x)).unwrap();
    let w_d = s.gpu.upload(&to_bf16(&w)).unwrap();
    let first = heads * d;
    norm::head_rms_norm(
        &s.kernels,
        s.gpu.stream(),
        &mut x_d.as_view_mut(),
        &w_d.as_view(),
        rows,
        width,
        first,
        heads,
        eps,
    )
    .unwrap();
    let got = to_f32(&s.gpu.download(&x_d).unwrap());
    let mut want = x.clone();
    for row in want.chunks_mut(width) {
        for head in row[first..first + heads * d].chunks_mut(d) {
            let src = head.to_vec();
            cpu::rms_norm(&src, &w, eps, head);
        }
    }
    assert_close("head_rms_norm", &got, &want, 1e-3, 1e-2);
}

#[test]
fn embedding_silu_and_gather_match_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("elementwise");
    let (vocab, dim, rows, inter) = (70_001, 256, 33, 1536);
    let table = bf16_round(&random_f32(&mut rng, vocab * dim, 1.0));
    let ids: Vec<u32> = (0..rows)
        .map(|i| {
            if i == 0 {
                vocab as u32 - 1
            } else {
                rng.random_range(0..vocab as u32)
            }
        })
        .collect();
    let table_d = s.gpu.upload(&to_bf16(&table)).unwrap();
    let ids_d = s
        .gpu
        .upload(&ids.iter().map(|&t| t as i32).collect::<Vec<_>>())
        .unwrap();
    let mut out_d = poisoned(&s.gpu, rows * dim, f32::NAN.to_bits());
    // The f32 output is checked through its bits, so that NaN poison compares equal.
    let mut out_view = unsafe { out_d.transmute_mut::<f32>(rows * dim) }.unwrap();
    elementwise::embedding(
        &s.kernels,
        s.gpu.stream(),
        &ids_d.as_view(),
        &table_d.as_view(),
        &mut out_view,
        dim,
    )
    .unwrap();
    let got: Vec<f32> = download_checked(&s.gpu, &out_d, rows * dim, f32::NAN.to_bits())
        .into_iter()
        .map(f32::from_bits)
        .collect();
    let mut want = vec![0.0; rows * dim];
    let matrix = cpu::Matrix::f32(table.clone().into(), dim).unwrap();
    cpu::embedding(&ids, &matrix, &mut want);
    assert_close("embedding", &got, &want, 0.0, 0.0);

    let gate_up = bf16_round(&random_f32(&mut rng, rows * 2 * inter, 4.0));
    let gu_d = s.gpu.upload(&to_bf16(&gate_up)).unwrap();
    let mut act_d = poisoned(&s.gpu, rows * inter, POISON);
    elementwise::silu_and_mul(
        &s.kernels,
        s.gpu.stream(),
        &gu_d.as_view(),
        &mut act_d.slice_mut(..rows * inter),
        rows,
        inter,
    )
    .unwrap();
    let got = to_f32(&download_checked(&s.gpu, &act_d, rows * inter, POISON));
    let mut want = vec![0.0; rows * inter];
    cpu::silu_and_mul(&gate_up, inter, &mut want);
    assert_close("silu_and_mul", &got, &want, 1e-3, 1e-2);

    let picks: Vec<i32> = vec![32, 0, 7, 7];
    let picks_d = s.gpu.upload(&picks).unwrap();
    let src_d = s.gpu.upload(&to_bf16(&table[..rows * dim])).unwrap();
    let mut gathered_d = poisoned(&s.gpu, picks.len() * dim, POISON);
    elementwise::gather_rows(
        &s.kernels,
        s.gpu.stream(),
        &src_d.as_view(),
        &picks_d.as_view(),
        &mut gathered_d.slice_mut(..picks.len() * dim),
        dim,
    )
    .unwrap();
    let got = to_f32(&download_checked(
        &s.gpu,
        &gathered_d,
        picks.len() * dim,
        POISON,
    ));
    let want: Vec<f32> = picks
        .iter()
        .flat_map(|&r| table[r as usize * dim..(r as usize + 1) * dim].to_vec())
        .collect();
    assert_close("gather_rows", &got, &want, 0.0, 0.0);
}

fn check_linear(s: &crate::Setup, deterministic: bool) {
    let mut rng = rng("linear");
    let gemm = Gemm::new(s.gpu.stream().clone(), deterministic).unwrap();
    // x starts `offset` elements into its buffer: 8 bf16 leave it 16-byte aligned only.
    for (m, n, k, offset) in [
        (1, 2048, 2048, 0),
        (7, 6144, 2048, 8),
        (64, 8192, 2048, 0),
        (130, 1000, 576, 8),
        // 131 and 150 share 130's bucket of rows, and so its algorithm, once checked.
        (131, 1000, 576, 0),
        (150, 1000, 576, 0),
        // Columns of 8192 split over 4 warps of the GEMV kernel; 521 columns leave the
        // last block's second column empty.
        (3, 521, 8192, 0),
        // 999 columns leave the last block's last warps without one.
        (5, 999, 2048, 0),
        // 2,500 blocks of the GEMV kernel, many waves of them.
        (2, 20_000, 1024, 0),
        // One row of 24,576 bf16 is past what a block stages: the two-row kernel reads it
        // in place.
        (1, 300, 24_576, 8),
        // Deterministic mode's tensor-core tiles of 128 x 128 with a tail of rows and
        // columns (both paths take 1,100 x 2,100 in tiles), and a depth that is not a
        // multiple of FIXED_MMA_CHUNK (the GEMV kernel).
        (1100, 2100, 256, 8),
        (3, 700, FIXED_MMA_CHUNK * 16 + 8, 0),
    ] {
        let x = bf16_round(&random_f32(&mut rng, m * k, 1.0));
        let w = bf16_round(&random_f32(&mut rng, n * k, 0.05));
        let mut x_host = vec![bf16::NAN; offset];
        x_host.extend(to_bf16(&x));
        let (x_d, w_d) = (
            s.gpu.upload(&x_host).unwrap(),
            s.gpu.upload(&to_bf16(&w)).unwrap(),
        );
        let mut want = vec![0.0; m * n];
        cpu::linear(&x, k, &w, n, &mut want);
        // The second product of a shape reuses what the first chose: the same bits.
        let mut first: Option<Vec<f32>> = None;
        for _ in 0..2 {
            let mut out_d = poisoned(&s.gpu, m * n, f32::NAN.to_bits());
            let mut out_view = unsafe { out_d.transmute_mut::<f32>(m * n) }.unwrap();
            gemm.linear(
                &s.kernels,
                s.gpu.stream(),
                &x_d.slice(offset..),
                &w_d.as_view(),
                &mut out_view,
                m,
                n,
            )
            .unwrap();
            let got: Vec<f32> = download_checked(&s.gpu, &out_d, m * n, f32::NAN.to_bits())
                .into_iter()
                .map(f32::from_bits)
                .collect();
            // Scale: |x| <= 1, |w| <= 0.05, so sums of k products reach sqrt(k) * 0.03 or so.
            assert_close(
                &format!("linear {m}x{n}x{k} deterministic={deterministic}"),
                &got,
                &want,
                1e-4,
                1e-3,
            );
            match &first {
                None => first = Some(got),
                Some(first) => assert!(
                    first
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "linear {m}x{n}x{k}: a repeated product changed"
                ),
            }
        }
    }
}

/// Products chained on one stream without a synchronization, each reading what the one
/// before wrote into a buffer filled with poison: under programmatic dependent launch (on
/// where the device has it), a kernel that read its input before waiting for the kernel
/// ahead would read poison, or an input not yet complete.
#[test]
fn chained_products_read_what_the_kernel_ahead_wrote() {
    let Some(s) = setup() else { return };
    eprintln!(
        "programmatic dependent launch: {}",
        s.kernels.programmatic_launch()
    );
    let mut rng = rng("chained_products");
    let (k, rounds) = (2048, 24);
    // Uniform in ±sqrt(3 / k): each product keeps the input's scale.
    let scale = (3.0 / k as f32).sqrt();
    let w: Vec<Vec<f32>> = (0..2)
        .map(|_| bf16_round(&random_f32(&mut rng, k * k, scale)))
        .collect();
    let w_d: Vec<_> = w
        .iter()
        .map(|w| s.gpu.upload(&to_bf16(w)).unwrap())
        .collect();
    let x0 = bf16_round(&random_f32(&mut rng, k, 1.0));
    let mut outs = vec![s.gpu.upload(&to_bf16(&x0)).unwrap()];
    outs.extend((0..rounds).map(|_| poisoned(&s.gpu, k, POISON)));
    s.gpu.stream().synchronize().unwrap();
    let gemm = Gemm::new(s.gpu.stream().clone(), true).unwrap();
    for i in 0..rounds {
        let (done, rest) = outs.split_at_mut(i + 1);
        gemm.linear(
            &s.kernels,
            s.gpu.stream(),
            &done[i].slice(..k),
            &w_d[i % 2].as_view(),
            &mut rest[0].slice_mut(..k),
            1,
            k,
        )
        .unwrap();
    }
    let mut input = x0;
    for (i, out) in outs[1..].iter().enumerate() {
        let got = to_f32(&download_checked(&s.gpu, out, k, POISON));
        let mut want = vec![0.0; k];
        cpu::linear(&input, k, &w[i % 2], k, &mut want);
        assert_close(
            &format!("product {i} of the chain"),
            &got,
            &bf16_round(&want),
            1e-2,
            1e-2,
        );
        input = got;
    }
}

#[test]
fn cublas_linear_matches_the_cpu() {
    let Some(s) = setup() else { return };
    check_linear(s, false);
}

/// A shape's algorithm comes from its bucket of rows, chosen for the bucket's largest, so a
/// product's bits do not depend on which shapes of its bucket came before it.
#[test]
fn a_products_bits_do_not_depend_on_the_shapes_before_it() {
    let Some(s) = setup() else { return };
    let mut rng = rng("buckets");
    let (n, k) = (1000, 576);
    let x = to_bf16(&random_f32(&mut rng, 160 * k, 1.0));
    let w = to_bf16(&random_f32(&mut rng, n * k, 0.05));
    let (x_d, w_d) = (s.gpu.upload(&x).unwrap(), s.gpu.upload(&w).unwrap());
    let product = |gemm: &Gemm, m: usize| -> Vec<u32> {
        let mut out_d = poisoned(&s.gpu, m * n, f32::NAN.to_bits());
        let mut out_view = unsafe { out_d.transmute_mut::<f32>(m * n) }.unwrap();
        let x_view = x_d.slice(..m * k);
        gemm.linear(
            &s.kernels,
            s.gpu.stream(),
            &x_view,
            &w_d.as_view(),
            &mut out_view,
            m,
            n,
        )
        .unwrap();
        download_checked(&s.gpu, &out_d, m * n, f32::NAN.to_bits())
    };
    let alone = product(&Gemm::new(s.gpu.stream().clone(), false).unwrap(), 150);
    let after = Gemm::new(s.gpu.stream().clone(), false).unwrap();
    for m in [131, 160, 129] {
        product(&after, m);
    }
    assert!(
        alone == product(&after, 150),
        "150 rows after 131, 160 and 129 changed"
    );
}

#[test]
fn fixed_order_linear_matches_the_cpu_and_is_batch_invariant() {
    let Some(s) = setup() else { return };
    check_linear(s, true);
    let mut rng = rng("fixed_order_batch_invariance");
    // The tensor-core path (in tiles of 128 and of 64 rows), and the GEMV's (a depth that is
    // not a multiple of FIXED_MMA_CHUNK).
    for (n, k) in [(3000, 2048), (700, 8192), (500, FIXED_MMA_CHUNK * 64 + 8)] {
        check_batch_invariance(s, &mut rng, n, k);
    }
}

/// Rows of a 700-row product in deterministic mode (tiles of 64 rows on the tensor-core
/// path, passes of 8 rows of the GEMV kernel otherwise) give the same bits alone (the split
/// kernel, the one-row GEMV kernel), and the first 2, 4, 16, 17, 40, 64 and 65 rows the same
/// bits as a product of their own (the split kernel's groups of 16 rows and column tiles of
/// 8, 16 or 32 as the grid needs them, the tile again; one staged GEMV pass).
fn check_batch_invariance(s: &crate::Setup, rng: &mut rand_chacha::ChaCha8Rng, n: usize, k: usize) {
    const ROWS: usize = 700;
    let gemm = Gemm::new(s.gpu.stream().clone(), true).unwrap();
    let w_d = s
        .gpu
        .upload(&to_bf16(&random_f32(rng, n * k, 0.05)))
        .unwrap();
    let rows = to_bf16(&random_f32(rng, ROWS * k, 1.0));
    let run = |x: &[bf16], m: usize| -> Vec<bf16> {
        let x_d = s.gpu.upload(x).unwrap();
        let mut out_d = s.gpu.zeros::<bf16>(m * n).unwrap();
        gemm.linear(
            &s.kernels,
            s.gpu.stream(),
            &x_d.as_view(),
            &w_d.as_view(),
            &mut out_d.as_view_mut(),
            m,
            n,
        )
        .unwrap();
        s.gpu.download(&out_d).unwrap()
    };
    let batch = run(&rows, ROWS);
    for row in [0, 31, 32, 63, 127, 128, 650, ROWS - 1] {
        let alone = run(&rows[row * k..(row + 1) * k], 1);
        assert!(
            alone
                .iter()
                .zip(&batch[row * n..(row + 1) * n])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{n}x{k}: row {row} differs alone and in a batch of {ROWS}"
        );
    }
    for m in [2, 4, 16, 17, 40, 64, 65] {
        let few = run(&rows[..m * k], m);
        assert!(
            few.iter()
                .zip(&batch[..m * n])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{n}x{k}: the first {m} rows differ alone and in a batch of {ROWS}"
        );
    }
}

#[test]
fn the_gated_activation_matches_the_cpu_on_both_paths_and_is_batch_invariant() {
    let Some(s) = setup() else { return };
    // Deterministic mode takes the tensor-core kernels for a depth of 512 (where the device
    // has them) and the GEMV kernel for 520 (not a multiple of FIXED_MMA_CHUNK).
    for k in [512, 520] {
        check_gated_activation(s, k);
    }
}

fn check_gated_activation(s: &crate::Setup, k: usize) {
    let mut rng = rng(&format!("gate_up_act {k}"));
    // 512 blocks of the gated GEMV kernel, more than one wave.
    let inter = 4096;
    let w = bf16_round(&random_f32(&mut rng, 2 * inter * k, 0.05));
    let w_d = s.gpu.upload(&to_bf16(&w)).unwrap();
    let x = bf16_round(&random_f32(&mut rng, 40 * k, 1.0));
    let x_d = s.gpu.upload(&to_bf16(&x)).unwrap();
    let run = |m: usize, deterministic: bool, x: &CudaSlice<bf16>| -> Vec<bf16> {
        let gemm = Gemm::new(s.gpu.stream().clone(), deterministic).unwrap();
        let mut gate_up = s.gpu.zeros::<bf16>(m * 2 * inter).unwrap();
        let mut act = poisoned(&s.gpu, m * inter, POISON);
        gemm.gate_up_act(
            &s.kernels,
            s.gpu.stream(),
            &x.slice(..m * k),
            &w_d.as_view(),
            &mut gate_up.as_view_mut(),
            &mut act.slice_mut(..m * inter),
            m,
            inter,
        )
        .unwrap();
        download_checked(&s.gpu, &act, m * inter, POISON)
    };
    // m = 1 takes the fused GEMV kernel, m = 5 cuBLAS and silu_and_mul; deterministic mode
    // on the GEMV path the fused kernel for 8 rows and the GEMV and silu_and_mul for 40,
    // on the tensor-core path the product and silu_and_mul for both.
    for (m, deterministic) in [(1, false), (5, false), (8, true), (40, true)] {
        let got = to_f32(&run(m, deterministic, &x_d));
        let mut gate_up = vec![0.0; m * 2 * inter];
        cpu::linear(&x[..m * k], k, &w, 2 * inter, &mut gate_up);
        let mut want = vec![0.0; m * inter];
        cpu::silu_and_mul(&bf16_round(&gate_up), inter, &mut want);
        let what = format!("gate_up_act m={m} k={k} deterministic={deterministic}");
        assert_close(&what, &got, &bf16_round(&want), 2e-3, 1e-2);
    }
    // Deterministic mode: row 7 alone gives the bits it gives in the batch of 40.
    let batch = run(40, true, &x_d);
    let row = s.gpu.upload(&to_bf16(&x[7 * k..8 * k])).unwrap();
    let alone = run(1, true, &row);
    assert!(
        alone
            .iter()
            .zip(&batch[7 * inter..8 * inter])
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "k = {k}: row 7 differs alone and in a batch of 40"
    );
}

/// `rms_norm(x[r]) * gamma · w[c]` of every row r and column c, in f64 from the same
/// inputs: the decode fusions' reference.
fn normed_products(x: &[f32], gamma: &[f32], w: &[f32], k: usize, eps: f32) -> Vec<f64> {
    let n = w.len() / k;
    let mut out = Vec::with_capacity(x.len() / k * n);
    for row in x.chunks(k) {
        let mean_sq = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / k as f64;
        let inv = 1.0 / (mean_sq + eps as f64).sqrt();
        let normed: Vec<f64> = row
            .iter()
            .zip(gamma)
            .map(|(&v, &g)| v as f64 * inv * g as f64)
            .collect();
        for col in w.chunks(k) {
            out.push(normed.iter().zip(col).map(|(a, &b)| a * b as f64).sum());
        }
    }
    out
}

fn round_bf16(v: f64) -> f32 {
    bf16::from_f64(v).to_f32()
}

/// The decode fusions (a norm folded into the product after it, a residual add into the
/// product before it) against an f64 reference, at one row (the GEMV's one-row kernels) and
/// three (its four-row pass), at depths of one warp per column (2048, and 576 with a
/// partial stretch) and of four (8192), with more column groups than the grid has blocks
/// (40,000 x 2048); the one-row add takes its packed kernel where the column groups
/// outnumber the multiprocessors (on an H200's 132, every one-row shape here but 130 x
/// 12,288; Llama-3.2-1B's down projection, 2048 x 8192, among them); and a normed row of a
/// batch has the bits it has alone (the one-row kernels take the norm's scale while they
/// stage the row, the others in a pass of their own).
#[test]
fn the_decode_fusions_match_an_f64_reference() {
    let Some(s) = setup() else { return };
    let mut rng = rng("decode_fusions");
    let eps = 1e-5f32;
    assert!(!Gemm::new(s.gpu.stream().clone(), true)
        .unwrap()
        .fuses_norms(1));
    let gemm = Gemm::new(s.gpu.stream().clone(), false)
        .unwrap()
        .with_gemv_max_rows(4);
    assert!(gemm.fuses_norms(1) && gemm.fuses_norms(3) && !gemm.fuses_norms(5));
    let stream = s.gpu.stream();
    for (m, n, k) in [
        (1, 3072, 2048),
        (3, 999, 576),
        (3, 521, 8192),
        (1, 2048, 8192),
        // One normed row of 12,288 is past what a block stages: the two-row kernel reads
        // it in place.
        (1, 130, 12_288),
        (1, 40_000, 2048),
    ] {
        let x = random_f32(&mut rng, m * k, 3.0);
        let gamma = bf16_round(&random_f32(&mut rng, k, 1.5));
        let w = bf16_round(&random_f32(&mut rng, 2 * n * k, 0.05));
        let (x_d, gamma_d, w_d) = (
            s.gpu.upload(&x).unwrap(),
            s.gpu.upload(&to_bf16(&gamma)).unwrap(),
            s.gpu.upload(&to_bf16(&w)).unwrap(),
        );
        let (residual, weight) = (&x_d.as_view(), &gamma_d.as_view());
        let normed = NormedInput {
            residual,
            weight,
            eps,
        };
        let want = normed_products(&x, &gamma, &w, k, eps);

        // The plain product over the first n rows of w.
        let mut out_d = poisoned(&s.gpu, m * n, POISON);
        let w_plain = w_d.slice(..n * k);
        let mut out = out_d.slice_mut(..m * n);
        gemm.normed_linear(&s.kernels, stream, normed, &w_plain, &mut out, m, n)
            .unwrap();
        let got = to_f32(&download_checked(&s.gpu, &out_d, m * n, POISON));
        let want_plain: Vec<f32> = (0..m * n)
            .map(|i| round_bf16(want[i / n * 2 * n + i % n]))
            .collect();
        let what = format!("normed_linear {m}x{n}x{k}");
        assert_close(&what, &got, &want_plain, 1e-3, 1e-2);

        // The gated activation over all 2n rows (gate rows, then up rows).
        let mut act_d = poisoned(&s.gpu, m * n, POISON);
        let mut act = act_d.slice_mut(..m * n);
        let w_all = w_d.as_view();
        gemm.normed_gate_up_act(&s.kernels, stream, normed, &w_all, &mut act, m, n)
            .unwrap();
        let got = to_f32(&download_checked(&s.gpu, &act_d, m * n, POISON));
        let want_act: Vec<f32> = (0..m * n)
            .map(|i| {
                let (row, col) = (i / n, i % n);
                let gate = round_bf16(want[row * 2 * n + col]) as f64;
                let up = round_bf16(want[row * 2 * n + n + col]) as f64;
                (gate / (1.0 + (-gate).exp()) * up) as f32
            })
            .collect();
        let what = format!("normed_gate_up_act {m}x{n}x{k}");
        assert_close(&what, &got, &want_act, 1e-3, 1e-2);

        // The batch's first row alone: the same bits from both fusions.
        if m > 1 {
            let first = NormedInput {
                residual: &x_d.slice(..k),
                weight,
                eps,
            };
            // The first n values of a buffer of `real` values and a poisoned tail.
            let bits = |d: &CudaSlice<bf16>, real: usize| -> Vec<u16> {
                let all = download_checked(&s.gpu, d, real, POISON);
                all[..n].iter().map(|v| v.to_bits()).collect()
            };
            let mut alone_d = poisoned(&s.gpu, n, POISON);
            let mut alone = alone_d.slice_mut(..n);
            gemm.normed_linear(&s.kernels, stream, first, &w_plain, &mut alone, 1, n)
                .unwrap();
            let what = format!("normed_linear {m}x{n}x{k}: row 0 alone");
            assert_eq!(bits(&alone_d, n), bits(&out_d, m * n), "{what}");
            let mut alone = alone_d.slice_mut(..n);
            gemm.normed_gate_up_act(&s.kernels, stream, first, &w_all, &mut alone, 1, n)
                .unwrap();
            let what = format!("normed_gate_up_act {m}x{n}x{k}: row 0 alone");
            assert_eq!(bits(&alone_d, n), bits(&act_d, m * n), "{what}");
        }

        // The residual add: a bf16 input of m rows of k, its product added into an f32
        // residual of m rows of n followed by a sentinel tail.
        let input = bf16_round(&random_f32(&mut rng, m * k, 1.0));
        let start = random_f32(&mut rng, m * n, 3.0);
        let input_d = s.gpu.upload(&to_bf16(&input)).unwrap();
        let sentinel = -12_345.0f32;
        let mut tail = start.clone();
        tail.extend([sentinel; 64]);
        let mut residual_d = s.gpu.upload(&tail).unwrap();
        let mut target = residual_d.slice_mut(..m * n);
        gemm.add_linear(
            &s.kernels,
            stream,
            &input_d.as_view(),
            &w_plain,
            &mut target,
            m,
            n,
        )
        .unwrap();
        let got = download_checked(&s.gpu, &residual_d, m * n, sentinel);
        let mut product = vec![0.0; m * n];
        cpu::linear(&input, k, &w[..n * k], n, &mut product);
        // What was added: the product rounded to bf16, within one bf16 ulp (2^-7 relative)
        // where the two sums round apart.
        let added: Vec<f32> = got.iter().zip(&start).map(|(g, r)| g - r).collect();
        let want_added: Vec<f32> = product.iter().map(|&p| round_bf16(p as f64)).collect();
        let what = format!("add_linear {m}x{n}x{k}");
        assert_close(&what, &added, &want_added, 1e-5, 1.0 / 128.0);
    }
}
