//! GPU tests of the CUDA backend: every op against the CPU backend on fresh random inputs,
//! the KV pool past 4 GiB, and the whole model. Each test skips itself (passing, with a
//! note on stderr) on a machine without a CUDA device, so `cargo test --features cuda`
//! still passes there; `scripts/gpu_build.sh` builds them here and `scripts/gpu_run.sh
//! tests` runs them on the GPU machine.

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod deepseek;
mod disk_tier;
mod draft_chain;
mod eagle3;
mod engine;
mod feature_ring;
mod graphs;
mod host_tier;
mod mla;
mod mla_padding;
mod model;
mod moe;
mod mtp;
mod nccl;
mod ops;
mod sampling;

use half::bf16;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::{gpu_available, Gpu};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::{Arc, OnceLock};

/// The device and its kernels, opened once for the whole test binary (shared, so that the
/// models the tests build run on the same context).
pub struct Setup {
    pub gpu: Arc<Gpu>,
    pub kernels: Arc<CudaKernels>,
}

/// The shared setup, or `None` (after saying so) on a machine without a CUDA device.
pub fn setup() -> Option<&'static Setup> {
    static SETUP: OnceLock<Option<Setup>> = OnceLock::new();
    let setup = SETUP.get_or_init(|| {
        if !gpu_available() {
            return None;
        }
        let gpu = Gpu::open(0).expect("opening CUDA device 0");
        let cache = std::env::temp_dir().join("peregrine-test-kernels");
        let kernels = CudaKernels::load(&gpu, &cache).expect("compiling the kernels");
        Some(Setup {
            gpu: Arc::new(gpu),
            kernels: Arc::new(kernels),
        })
    });
    if setup.is_none() {
        eprintln!("skipped: no CUDA device");
    }
    setup.as_ref()
}

/// The shared setup's device with its kernels loaded again for CUDA cores alone
/// ([`CudaKernels::without_tensor_cores`]), or `None` without a CUDA device.
pub fn setup_cuda_cores() -> Option<&'static Setup> {
    static SETUP: OnceLock<Option<Setup>> = OnceLock::new();
    SETUP
        .get_or_init(|| {
            let s = setup()?;
            let cache = std::env::temp_dir().join("peregrine-test-kernels");
            let kernels = CudaKernels::load(&s.gpu, &cache).expect("loading the kernels");
            Some(Setup {
                gpu: s.gpu.clone(),
                kernels: Arc::new(kernels.without_tensor_cores()),
            })
        })
        .as_ref()
}

/// A fresh RNG for one test; the seed is printed so a failure can be replayed.
pub fn rng(test: &str) -> ChaCha8Rng {
    let seed: u64 = rand::rng().random();
    eprintln!("{test}: seed {seed}");
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` uniform values in `[-scale, scale)`.
pub fn random_f32(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// `values` rounded to bf16.
pub fn to_bf16(values: &[f32]) -> Vec<bf16> {
    values.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// `values` widened to f32.
pub fn to_f32(values: &[bf16]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}

/// Asserts `|got - want| <= atol + rtol * |want|` elementwise, naming the first miss.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let mut worst = 0f32;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(
            err <= atol + rtol * w.abs() && g.is_finite(),
            "{what}: element {i}: got {g}, want {w} (tolerance {atol} + {rtol} x |want|)"
        );
        worst = worst.max(err);
    }
    eprintln!("{what}: {} elements, worst error {worst:e}", got.len());
}
