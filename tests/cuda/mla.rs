//! Latent attention on the GPU against the CPU kernel (`cpu::mla_attention`) on the same
//! bf16-rounded data: decode rows over scattered blocks, contexts of one partition and of
//! several (the combine); prefill rows on tensor cores (whole prompts, chunks, beside
//! decode rows); a sentinel tail after o; a single-layer latent pool past 4 GiB read by
//! decode and prefill rows at rows 3,728,269 / 3,728,270 (2^31 / 576) and blocks 65,535 /
//! 65,536; a plan of more rows than q or o, and prefill rows without tensor cores, refused
//! on the host with nothing launched.

use super::{assert_close, random_f32, rng, setup, setup_cuda_cores, to_bf16, to_f32, Setup};
use half::bf16;
use peregrine_kernels::cpu::{self, AttentionSeq, KvLayout};
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_kernels::cuda::mla::runs_prefill;
use peregrine_ops::cuda::attention::AttentionError;
use peregrine_ops::cuda::mla::GpuMlaAttention;
use peregrine_ops::cuda::plan::DeviceAttentionPlan;
use peregrine_ops::{AttentionPlan, PlanError, SeqSpec};
use rand::seq::SliceRandom;
use std::collections::HashMap;

/// DeepSeek's shapes: 16 heads (V2-Lite), a 512-wide latent and a 64-wide rotary key.
pub(super) const HEADS: usize = 16;
pub(super) const LATENT: usize = 512;
pub(super) const WIDTH: usize = 576;
pub(super) const BLOCK: usize = 16;
pub(super) const TAIL: usize = 3;
/// The softmax scale of DeepSeek-V2-Lite (192^-0.5 times YaRN's mscale squared).
pub(super) const SCALE: f32 = 0.114_721;

pub(super) fn layout(num_blocks: usize) -> KvLayout {
    KvLayout {
        num_blocks: num_blocks as u64,
        block_size: BLOCK as u64,
        num_kv_heads: 1,
        head_dim: WIDTH as u64,
    }
}

pub(super) fn sentinel() -> bf16 {
    bf16::from_f32(12_345.0)
}

/// Runs the op for sequences of `shapes` (context length, query rows) with `tables` over
/// `cache` (device) and checks it against the CPU kernel over `host_cache` (with
/// `host_tables`). Sequences of more than `SPLIT_MAX_ROWS` rows run on the prefill kernel.
#[allow(clippy::too_many_arguments)]
fn check(
    what: &str,
    shapes: &[(usize, usize)],
    tables: &[Vec<u32>],
    cache: &cudarc::driver::CudaSlice<bf16>,
    device_layout: &KvLayout,
    host_cache: &[f32],
    host_layout: &KvLayout,
    host_tables: &[Vec<u32>],
) {
    let s = setup().unwrap();
    let mut rng = rng(what);
    let rows: usize = shapes.iter().map(|&(_, n)| n).sum();
    let q = to_bf16(&random_f32(&mut rng, rows * HEADS * WIDTH, 0.5));
    let specs: Vec<SeqSpec> = shapes
        .iter()
        .zip(tables)
        .map(|(&(ctx, n), t)| SeqSpec {
            num_cached: ctx - n,
            num_new: n,
            block_table: t,
        })
        .collect();
    let plan = AttentionPlan::new(&specs, BLOCK, device_layout.num_blocks).unwrap();
    let dplan = DeviceAttentionPlan::upload(&s.gpu, &plan, DecodeKernel::Split).unwrap();
    let q_dev = s.gpu.upload(&q).unwrap();
    let mut o_host = vec![bf16::NAN; rows * HEADS * LATENT];
    o_host.extend(vec![sentinel(); TAIL * HEADS * LATENT]);
    let mut o_dev = s.gpu.upload(&o_host).unwrap();
    let op = GpuMlaAttention {
        num_heads: HEADS,
        latent: LATENT,
        scale: SCALE,
    };
    op.forward(
        &s.kernels,
        s.gpu.stream(),
        &q_dev.slice(..),
        cache,
        device_layout,
        &dplan,
        &mut o_dev.slice_mut(..),
    )
    .unwrap();
    let got = s.gpu.download(&o_dev).unwrap();
    let mut q_start = 0;
    let seqs: Vec<AttentionSeq> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(ctx, n))| {
            q_start += n;
            AttentionSeq {
                q_start: q_start - n,
                q_len: n,
                context_len: ctx,
                block_table: &host_tables[i],
            }
        })
        .collect();
    let mut want = vec![0f32; rows * HEADS * LATENT];
    let q32 = to_f32(&q);
    cpu::mla_attention(
        &q32,
        HEADS,
        host_cache,
        host_layout,
        LATENT,
        &seqs,
        SCALE,
        &mut want,
    );
    let n = rows * HEADS * LATENT;
    assert_close(what, &to_f32(&got[..n]), &want, 2e-3, 1e-2);
    assert!(
        got[n..].iter().all(|x| x.to_bits() == sentinel().to_bits()),
        "{what}: the sentinel tail after o was written"
    );
}

/// Runs the op for `specs` over an 8-block zeroed pool with q and o of `rows` real rows (o
/// a sentinel), expecting a refusal: returns the error once o is checked untouched.
fn refused(s: &Setup, specs: &[SeqSpec], rows: usize) -> AttentionError {
    let layout = layout(8);
    let cache = s.gpu.zeros::<bf16>(layout.layer_elems() as usize).unwrap();
    let plan = AttentionPlan::new(specs, BLOCK, layout.num_blocks).unwrap();
    let dplan = DeviceAttentionPlan::upload(&s.gpu, &plan, DecodeKernel::Split).unwrap();
    let q = s
        .gpu
        .upload(&vec![bf16::ONE; rows * HEADS * WIDTH])
        .unwrap();
    let mut o = s
        .gpu
        .upload(&vec![sentinel(); rows * HEADS * LATENT])
        .unwrap();
    let op = GpuMlaAttention {
        num_heads: HEADS,
        latent: LATENT,
        scale: SCALE,
    };
    let err = op
        .forward(
            &s.kernels,
            s.gpu.stream(),
            &q.slice(..),
            &cache,
            &layout,
            &dplan,
            &mut o.slice_mut(..),
        )
        .unwrap_err();
    let back = s.gpu.download(&o).unwrap();
    assert!(back.iter().all(|x| x.to_bits() == sentinel().to_bits()));
    err
}

/// One-row sequences of `contexts`.
fn decode_rows(contexts: &[usize]) -> Vec<(usize, usize)> {
    contexts.iter().map(|&c| (c, 1)).collect()
}

/// Tables of `need` blocks each, from the ids 0 .. `total` shuffled.
fn scattered_tables(rng: &mut impl rand::Rng, need: &[usize], total: usize) -> Vec<Vec<u32>> {
    let mut ids: Vec<u32> = (0..total as u32).collect();
    ids.shuffle(rng);
    let mut tables = Vec::new();
    let mut at = 0;
    for &n in need {
        tables.push(ids[at..at + n].to_vec());
        at += n;
    }
    tables
}

#[test]
fn mla_decode_matches_the_cpu_over_scattered_blocks_and_partitions() {
    let Some(s) = setup() else { return };
    let mut rng = rng("mla_decode_matches_the_cpu");
    // One partition (1, 37, 512 tokens) and several (513, 1,500), blocks shuffled.
    let contexts = [1usize, 37, 512, 513, 1_500, 200];
    let need: Vec<usize> = contexts.iter().map(|c| c.div_ceil(BLOCK)).collect();
    let total: usize = need.iter().sum::<usize>() + 11;
    let tables = scattered_tables(&mut rng, &need, total);
    let layout = layout(total);
    let values = to_bf16(&random_f32(&mut rng, layout.layer_elems() as usize, 1.0));
    let cache = s.gpu.upload(&values).unwrap();
    let host = to_f32(&values);
    check(
        "scattered",
        &decode_rows(&contexts),
        &tables,
        &cache,
        &layout,
        &host,
        &layout,
        &tables,
    );
}

#[test]
fn mla_prefill_matches_the_cpu_in_whole_prompts_chunks_and_beside_decode_rows() {
    let Some(s) = setup() else { return };
    assert!(
        runs_prefill(&s.kernels, LATENT, WIDTH),
        "no tensor-core latent prefill on this device"
    );
    let mut rng = rng("mla_prefill_matches_the_cpu");
    // (context, query rows): whole prompts of 33 (one tile of pairs short), 64 (an item of
    // whole tiles) and 301 rows (items of 64 tokens and a last of 45), chunks after 37 and
    // 700 cached tokens, and decode rows (one and two partitions) and a short verification
    // step (cut into one-row sequences) in the same step.
    let shapes = [
        (33usize, 33usize),
        (1_000, 1),
        (64, 64),
        (107, 70),
        (301, 301),
        (600, 1),
        (740, 40),
        (90, 4),
    ];
    let need: Vec<usize> = shapes.iter().map(|&(c, _)| c.div_ceil(BLOCK)).collect();
    let total: usize = need.iter().sum::<usize>() + 5;
    let tables = scattered_tables(&mut rng, &need, total);
    let layout = layout(total);
    let values = to_bf16(&random_f32(&mut rng, layout.layer_elems() as usize, 1.0));
    let cache = s.gpu.upload(&values).unwrap();
    let host = to_f32(&values);
    check(
        "prefill", &shapes, &tables, &cache, &layout, &host, &layout, &tables,
    );
}

#[test]
fn mla_prefill_without_tensor_cores_is_refused_with_nothing_launched() {
    let Some(s) = setup_cuda_cores() else { return };
    let table = [0u32, 1, 2];
    let specs = [SeqSpec {
        num_cached: 0,
        num_new: 40,
        block_table: &table,
    }];
    let err = refused(s, &specs, 40);
    assert!(err.to_string().contains("one row a sequence"), "{err}");
}

#[test]
fn mla_past_4_gib_reads_rows_past_2_31_over_576_exactly() {
    let Some(s) = setup() else { return };
    let mut rng = rng("mla_past_4_gib");
    let layout = layout(300_000);
    let bytes = layout.layer_elems() * 2;
    assert!(bytes > 5 << 30, "{bytes}");
    // Row 3,728,270 is the last whose element offset (x 576) stays below 2^31; block
    // `high` holds it, the rows before it and 3,728,271, the first past.
    let (row_a, row_b) = (3_728_269u64, 3_728_270u64);
    assert!(row_b * 576 < 1 << 31 && (row_b + 1) * 576 > 1 << 31);
    let high = (row_a / BLOCK as u64) as u32;
    assert_eq!(high, ((row_b + 1) / BLOCK as u64) as u32);
    let tables = vec![
        vec![65_535, 65_536, high, 299_999],
        vec![1, high + 1, 65_534],
        vec![high - 1, high, 131_072],
    ];
    // A chunk of 40 rows after 24 cached tokens and a whole prompt (prefill), a decode row.
    let shapes = [(64usize, 40usize), (40, 1), (3 * BLOCK, 3 * BLOCK)];
    let mut cache = s.gpu.zeros::<bf16>(layout.layer_elems() as usize).unwrap();
    // Random rows in every block a table names, on the device and in a compact host copy.
    let used: Vec<u32> = {
        let mut u: Vec<u32> = tables.iter().flatten().copied().collect();
        u.sort_unstable();
        u.dedup();
        u
    };
    let host_ids: HashMap<u32, u32> = used
        .iter()
        .enumerate()
        .map(|(i, &b)| (b, i as u32))
        .collect();
    let block = BLOCK * WIDTH;
    let mut host = vec![0f32; used.len() * block];
    for (i, &b) in used.iter().enumerate() {
        let data = to_bf16(&random_f32(&mut rng, block, 1.0));
        let at = b as usize * block;
        s.gpu
            .stream()
            .memcpy_htod(&data, &mut cache.slice_mut(at..at + block))
            .unwrap();
        let back = s.gpu.download(&cache.slice(at..at + block)).unwrap();
        assert!(back
            .iter()
            .zip(&data)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        host[i * block..(i + 1) * block].copy_from_slice(&to_f32(&data));
    }
    let host_tables: Vec<Vec<u32>> = tables
        .iter()
        .map(|t| t.iter().map(|b| host_ids[b]).collect())
        .collect();
    let host_layout = self::layout(used.len());
    check(
        "past 4 GiB",
        &shapes,
        &tables,
        &cache,
        &layout,
        &host,
        &host_layout,
        &host_tables,
    );
}

#[test]
fn a_plan_past_q_or_o_is_refused_with_nothing_launched() {
    let Some(s) = setup() else { return };
    let tables = [vec![0u32], vec![1], vec![2]];
    let specs: Vec<SeqSpec> = tables
        .iter()
        .map(|t| SeqSpec {
            num_cached: 3,
            num_new: 1,
            block_table: t,
        })
        .collect();
    // Three rows planned (as a padded plan would be) over q and o of the two real rows.
    let err = refused(s, &specs, 2);
    assert!(
        matches!(
            err,
            AttentionError::Plan(PlanError::RowsExceedBuffer { planned: 3, .. })
        ),
        "{err}"
    );
}
