//! The block-quantized weight kernels against independent references: dequantization
//! and Q8_0 quantization against gguf-py's (llama.cpp's Python package;
//! `scripts/make_quant_fixture.py` made the fixture), every SIMD path's products against a float64 product of the dequantized
//! weights and the unquantized activations, bounded by the activations' quantization
//! error; and batch invariance, bit for bit.

use half::{bf16, f16};
use peregrine_kernels::cpu::quant::{
    interleave, interleaved_row, interleaved_rows, q8_0_blocks, woven_row_bytes, BlockFormat, Half,
    Q8Row, Q8Rows, Simd, LANES, WIDE_LANES,
};
use peregrine_kernels::cpu::Matrix;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// Byte offsets of each format's f16 scales in a block (ggml's layouts).
fn scale_offsets(format: BlockFormat) -> &'static [usize] {
    match format {
        BlockFormat::Q8_0 | BlockFormat::Q4_0 | BlockFormat::Q5_0 => &[0],
        BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
        BlockFormat::Q6K => &[208],
    }
}

/// `blocks` random blocks of `format`: random bytes, scales finite f16 in ±0.05.
fn random_blocks(rng: &mut ChaCha8Rng, format: BlockFormat, blocks: usize) -> Vec<u8> {
    let size = format.block_bytes();
    let mut bytes: Vec<u8> = (0..blocks * size).map(|_| rng.random()).collect();
    for block in bytes.chunks_mut(size) {
        for &at in scale_offsets(format) {
            let scale = f16::from_f32(rng.random_range(-0.05..0.05));
            block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
        }
    }
    bytes
}

fn random(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// The SIMD levels this CPU runs, portable first.
fn levels() -> Vec<Simd> {
    let mut levels = vec![Simd::Portable];
    match Simd::detected() {
        Simd::Avx512Vnni => levels.extend([Simd::Avx2, Simd::Avx512Vnni]),
        Simd::Avx2 => levels.push(Simd::Avx2),
        Simd::Portable => {}
    }
    levels
}

/// The fixture of `scripts/make_quant_fixture.py`.
fn gguf_py_fixture() -> serde_json::Value {
    serde_json::from_str(include_str!("fixtures/ggml_blocks.json")).unwrap()
}

/// The bytes of a fixture case, from their hex.
fn fixture_bytes(case: &serde_json::Value) -> Vec<u8> {
    let hex = case["bytes"].as_str().unwrap();
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

#[test]
fn dequantization_matches_gguf_py() {
    let fixture = gguf_py_fixture();
    for format in BlockFormat::ALL {
        let case = &fixture[format.name()];
        let bytes = fixture_bytes(case);
        let want: Vec<f64> = case["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let mut got = vec![f32::NAN; want.len()];
        format.dequantize(&bytes, &mut got);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= 1e-6 * w.abs().max(1e-3),
                "{} value {i}: {g} vs gguf-py's {w}",
                format.name()
            );
        }
    }
}

/// Float values (random scales, a block of zeros, a block of ties on halves) quantized to
/// Q8_0 give gguf-py's bytes exactly; a matrix of them reads back what the bytes hold.
#[test]
fn q8_0_quantization_matches_gguf_py_byte_for_byte() {
    let case = &gguf_py_fixture()["quantized_Q8_0"];
    let values: Vec<f32> = case["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let want = fixture_bytes(case);
    let got = q8_0_blocks(&values);
    assert_eq!(got.len(), want.len());
    for (b, (g, w)) in got.chunks(34).zip(want.chunks(34)).enumerate() {
        assert_eq!(g, w, "block {b}");
    }

    let cols = 64;
    let float = Matrix::f32(values.clone().into(), cols).unwrap();
    let q8 = float.to_q8_0().expect("float rows of whole blocks");
    assert_eq!(q8.size_bytes(), want.len() as u64);
    let mut expected = vec![f32::NAN; values.len()];
    BlockFormat::Q8_0.dequantize(&want, &mut expected);
    let mut row = vec![f32::NAN; cols];
    for r in 0..q8.rows() {
        q8.row_into(r, &mut row);
        assert_eq!(row, expected[r * cols..(r + 1) * cols], "row {r}");
    }
    // Rows that are not whole blocks, or weights already quantized, stay as they are.
    assert!(Matrix::f32(values[..48].to_vec().into(), 48)
        .unwrap()
        .to_q8_0()
        .is_none());
    assert!(q8.to_q8_0().is_none());
}

/// The float64 product of `w`'s dequantized rows with the unquantized rows of `x`, and the
/// most quantizing `x` per 32 values (to within half a step of amax / 127) can move it.
fn reference(w: &Matrix, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let k = w.cols();
    let mut row = vec![0.0f32; k];
    let (mut want, mut bound) = (Vec::new(), Vec::new());
    for xr in x.chunks(k) {
        for j in 0..w.rows() {
            w.row_into(j, &mut row);
            let exact: f64 = row
                .iter()
                .zip(xr)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let mut err = 0.0;
            for (wb, xb) in row.chunks(32).zip(xr.chunks(32)) {
                let step = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
                err += 0.5 * f64::from(step) * wb.iter().map(|&v| f64::from(v.abs())).sum::<f64>();
            }
            let magnitude: f64 = row
                .iter()
                .zip(xr)
                .map(|(&a, &b)| f64::from((a * b).abs()))
                .sum();
            want.push(exact);
            bound.push(1.001 * err + 1e-5 * magnitude + 1e-7);
        }
    }
    (want, bound)
}

#[test]
fn every_kernel_matches_a_float64_product_within_the_activation_rounding() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for format in BlockFormat::ALL {
        for blocks_per_row in [1, 2, 3, 5] {
            let k = blocks_per_row * format.block_elems();
            // 8, 24 and 32 rows of Q4_0, Q4_1 and Q8_0 are interleaved (32 sixteen at a
            // time where the CPU has AVX-512 VNNI); 1 and 7 are not.
            for rows in [1, 7, 8, 24, 32] {
                let bytes = random_blocks(&mut rng, format, rows * blocks_per_row);
                let w = Matrix::blocks(format, Arc::from(bytes), k).unwrap();
                for n in [1, 2, 3, 4, 5, 9] {
                    let x = random(&mut rng, n * k);
                    let (want, bound) = reference(&w, &x);
                    for simd in levels() {
                        let mut got = vec![f32::NAN; n * rows];
                        w.matmul_with(simd, &x, &mut got);
                        for (i, ((&g, &w), &b)) in got.iter().zip(&want).zip(&bound).enumerate() {
                            assert!(
                                (f64::from(g) - w).abs() <= b,
                                "{} {simd:?} k {k} rows {rows} n {n} output {i}: {g} vs {w} (bound {b})",
                                format.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_row_is_bit_identical_alone_and_in_any_batch() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    for format in BlockFormat::ALL {
        let k = 3 * format.block_elems();
        for rows in [11, 16] {
            let w = Matrix::blocks(
                format,
                Arc::from(random_blocks(&mut rng, format, rows * 3)),
                k,
            )
            .unwrap();
            let row = random(&mut rng, k);
            for simd in levels() {
                let mut alone = vec![f32::NAN; rows];
                w.matmul_with(simd, &row, &mut alone);
                for (batch, at) in [(2, 1), (3, 2), (5, 4), (8, 5), (13, 0), (13, 12)] {
                    let mut x = random(&mut rng, batch * k);
                    x[at * k..(at + 1) * k].copy_from_slice(&row);
                    let mut out = vec![f32::NAN; batch * rows];
                    w.matmul_with(simd, &x, &mut out);
                    assert_eq!(
                        &out[at * rows..(at + 1) * rows],
                        &alone[..],
                        "{} {simd:?} batch {batch} at {at} rows {rows}",
                        format.name()
                    );
                }
            }
        }
    }
}

#[test]
fn interleaved_rows_dequantize_as_stored_and_agree_across_simd_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let formats = [
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q5_1,
        BlockFormat::Q8_0,
        BlockFormat::Q4K,
    ];
    for format in formats {
        for lanes in [LANES, WIDE_LANES] {
            let (blocks, rows, n) = (5, 2 * lanes, 6);
            let k = blocks * format.block_elems();
            let row_bytes = format.row_bytes(k).unwrap();
            let bytes = random_blocks(&mut rng, format, rows * blocks);
            let woven = interleave(format, &bytes, row_bytes, lanes);
            let woven_row = woven_row_bytes(format, k).unwrap();
            assert_eq!(woven.len(), rows * woven_row);
            let mut want = vec![f32::NAN; rows * k];
            format.dequantize(&bytes, &mut want);
            for (r, want) in want.chunks_exact(k).enumerate() {
                let mut got = vec![f32::NAN; k];
                interleaved_row(format, lanes, &woven, woven_row, r, &mut got);
                assert!(
                    got.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} lanes {lanes} row {r}: not the stored values",
                    format.name()
                );
            }
            let x = random(&mut rng, n * k);
            let q = Q8Rows::quantize(&x, k);
            let q8: Vec<Q8Row> = (0..n).map(|r| q.row(r)).collect();
            // Output rows wider than the weight's, their tails a sentinel left untouched.
            let stride = rows + 3;
            let run = |simd: Simd| -> Vec<u32> {
                let mut out = vec![f32::NAN; n * stride];
                // SAFETY: `out` holds `n` rows of `stride >= rows` columns.
                unsafe {
                    interleaved_rows(simd, format, lanes, &woven, &q8, out.as_mut_ptr(), stride)
                };
                for r in 0..n {
                    let tail = &out[r * stride + rows..(r + 1) * stride];
                    assert!(
                        tail.iter().all(|v| v.is_nan()),
                        "{simd:?} wrote past row {r}"
                    );
                    assert!(out[r * stride..r * stride + rows]
                        .iter()
                        .all(|v| v.is_finite()));
                }
                out.iter().map(|v| v.to_bits()).collect()
            };
            let portable = run(Simd::Portable);
            for simd in levels() {
                assert_eq!(
                    run(simd),
                    portable,
                    "{} {simd:?} lanes {lanes}",
                    format.name()
                );
            }
        }
        // A matrix of such rows is interleaved and says what it holds.
        let (k, rows) = (5 * format.block_elems(), 32);
        let bytes = random_blocks(&mut rng, format, rows * 5);
        let w = Matrix::blocks(format, Arc::from(bytes.clone()), k).unwrap();
        assert_eq!(w.describe(), format!("{} x {rows}", format.name()));
        let mut want = vec![f32::NAN; rows * k];
        format.dequantize(&bytes, &mut want);
        assert_eq!(w.to_f32(), want);
    }
}

#[test]
fn stacked_parts_of_different_storage_multiply_as_their_parts() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let k = 256;
    let q4k = Matrix::blocks(
        BlockFormat::Q4K,
        Arc::from(random_blocks(&mut rng, BlockFormat::Q4K, 3)),
        k,
    )
    .unwrap();
    let q6k = Matrix::blocks(
        BlockFormat::Q6K,
        Arc::from(random_blocks(&mut rng, BlockFormat::Q6K, 2)),
        k,
    )
    .unwrap();
    let f32s = Matrix::f32(Arc::from(random(&mut rng, 2 * k)), k).unwrap();
    let bits =
        |v: Vec<f32>| -> Arc<[u16]> { v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect() };
    let bf16s = Matrix::half(Half::Bf16, bits(random(&mut rng, 4 * k)), k).unwrap();
    let more_q4k = Matrix::blocks(
        BlockFormat::Q4K,
        Arc::from(random_blocks(&mut rng, BlockFormat::Q4K, 1)),
        k,
    )
    .unwrap();
    let parts = [q4k, more_q4k, q6k, f32s, bf16s];
    let stacked = Matrix::stack(parts.to_vec()).unwrap();
    assert_eq!(stacked.rows(), 12);
    assert_eq!(stacked.describe(), "Q4_K x 4, Q6_K x 2, F32 x 2, BF16 x 4");
    let n = 3;
    let x = random(&mut rng, n * k);
    let mut got = vec![f32::NAN; n * 12];
    stacked.matmul(&x, &mut got);
    // Block and 16-bit parts compute alike alone and stacked (a lone float32 matrix goes
    // through `gemm` instead, checked against float64 below).
    let mut first = 0;
    for part in &parts {
        let mut alone = vec![f32::NAN; n * part.rows()];
        part.matmul(&x, &mut alone);
        if part.as_f32().is_some() {
            first += part.rows();
            continue;
        }
        for r in 0..n {
            for j in 0..part.rows() {
                assert_eq!(
                    got[r * 12 + first + j],
                    alone[r * part.rows() + j],
                    "row {r} col {}",
                    first + j
                );
            }
        }
        first += part.rows();
    }
    // The float parts against float64 (they see the activations unrounded).
    let mut row = vec![0.0f32; k];
    for r in 0..n {
        for j in 6..12 {
            stacked.row_into(j, &mut row);
            let xr = &x[r * k..(r + 1) * k];
            let want: f64 = row
                .iter()
                .zip(xr)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let g = f64::from(got[r * 12 + j]);
            assert!((g - want).abs() <= 1e-4, "float row {j}: {g} vs {want}");
        }
    }
}

#[test]
fn matrices_of_the_wrong_shape_are_refused_by_name() {
    let e = Matrix::blocks(BlockFormat::Q4K, Arc::from(vec![0u8; 144]), 96).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rows of 96 values are not whole Q4_K blocks of 256"
    );
    let e = Matrix::blocks(BlockFormat::Q8_0, Arc::from(vec![0u8; 35]), 32).unwrap_err();
    assert!(e.to_string().contains("35"), "{e}");
    let a = Matrix::f32(Arc::from(vec![1.0; 8]), 4).unwrap();
    let b = Matrix::f32(Arc::from(vec![1.0; 8]), 8).unwrap();
    assert_eq!(
        Matrix::stack(vec![a, b]).unwrap_err().to_string(),
        "cannot stack matrices of 4 and 8 columns"
    );
}
