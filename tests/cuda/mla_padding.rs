//! The boundary between the target's padded verification step and the drafter's unpadded
//! step 0 under latent attention (an MTP head on DeepSeek's shapes). For every size S of
//! the default capture set from 2 on (39 requests in the graph of 40 among them), S - 1
//! requests of K = 2 drafts (3 rows each) over random cache rows, random distinct blocks
//! and contexts of one block to several partitions. The drafter's q and o hold the real
//! rows, each followed by a sentinel tail.
//!
//! - The target's plan, staged as its verification graph stages it (fixed layout, every
//!   sequence cut into one-row sequences, padded to 3S rows at the scratch block's slot),
//!   handed to the drafter's `prepare` is refused on the host (`RowsExceedBuffer`), with
//!   q (its q_lat) and the cache bit-for-bit as they were.
//! - Handed to `forward`, that plan is refused on the host too (its padded rows exceed q
//!   and o), with o, its poison and its sentinel tail, bit-for-bit as it was.
//! - The drafter's own plan (eager, the real rows only, cut the same way) gives o equal
//!   to `cpu::mla_attention` on the same bf16-rounded data, and its tail is untouched.

use super::mla::{layout, sentinel, BLOCK, HEADS, LATENT, SCALE, TAIL, WIDTH};
use super::{assert_close, random_f32, rng, setup, to_bf16, to_f32, Setup};
use cudarc::driver::{CudaSlice, CudaView};
use half::bf16;
use peregrine_actors::graphs::CaptureSizes;
use peregrine_kernels::cpu::{self, AttentionSeq, KvLayout};
use peregrine_kernels::cuda::attention::{DecodeKernel, PARTITION_TOKENS};
use peregrine_kernels::cuda::mla::MlaProjections;
use peregrine_models::graph::cuda::context_classes;
use peregrine_ops::cuda::attention::{AttentionError, RotaryTable};
use peregrine_ops::cuda::mla::GpuMlaAttention;
use peregrine_ops::cuda::plan::{DeviceAttentionPlan, PlanCapacity};
use peregrine_ops::{AttentionPlan, PlanError, SeqSpec};
use rand::seq::SliceRandom;
use rand::Rng;

/// Rows a request verifies: its last token and K = 2 drafts.
const ROWS: usize = 3;
/// DeepSeek's rotary key and its query part without a position, per head.
const ROPE: usize = WIDTH - LATENT;
const NOPE: usize = 128;
/// The longest context the graphs serve: two partitions.
const MAX_CONTEXT: usize = 2 * PARTITION_TOKENS;
/// The pool, whose last block is the scratch block (as the GPU backend reserves it).
const POOL_BLOCKS: usize = 3072;
const SCRATCH_BLOCK: usize = POOL_BLOCKS - 1;

const OP: GpuMlaAttention = GpuMlaAttention {
    num_heads: HEADS,
    latent: LATENT,
    scale: SCALE,
};

#[test]
fn the_drafter_refuses_the_targets_padded_verify_plan_at_every_captured_size() {
    let Some(s) = setup() else { return };
    // The default set at its cap (1, 2, 4, 8, then every multiple of 8 up to 512), and
    // the verification graphs' sizes in rows.
    let requests = CaptureSizes::for_max_num_seqs(usize::MAX);
    let verify = requests.scaled(ROWS);
    assert!(requests.sizes().contains(&40));
    // One fixed plan for every verification graph, as their shared buffers hold it.
    let capacity = PlanCapacity {
        rows: verify.largest(),
        decode_only: false,
        max_context: MAX_CONTEXT,
        block_size: BLOCK,
        scratch_slot: (SCRATCH_BLOCK * BLOCK) as i64,
    };
    let mut target =
        DeviceAttentionPlan::fixed(&s.gpu, DecodeKernel::Split, capacity, HEADS, LATENT)
            .unwrap()
            .cutting_every_sequence();
    for &size in requests.sizes().iter().filter(|&&n| n >= 2) {
        verify_step(s, &mut target, size);
    }
}

/// Checks one verification step of `size - 1` requests in the graph of `size`.
fn verify_step(s: &Setup, target: &mut DeviceAttentionPlan, size: usize) {
    let what = format!("{} requests in the graph of {size}", size - 1);
    let mut rng = rng(&format!("mla_padding: {what}"));
    // Every 32nd request has a context of several partitions, the others one to four
    // blocks; the blocks are drawn without repeats from the pool, less the scratch block.
    let cached: Vec<usize> = (0..size - 1)
        .map(|i| match i % 32 {
            31 => rng.random_range(PARTITION_TOKENS..=MAX_CONTEXT - ROWS),
            _ => rng.random_range(0..=4 * BLOCK - ROWS),
        })
        .collect();
    let mut ids: Vec<u32> = (0..SCRATCH_BLOCK as u32).collect();
    ids.shuffle(&mut rng);
    let mut free = ids.into_iter();
    let tables: Vec<Vec<u32>> = cached
        .iter()
        .map(|c| free.by_ref().take((c + ROWS).div_ceil(BLOCK)).collect())
        .collect();
    let specs: Vec<SeqSpec> = cached
        .iter()
        .zip(&tables)
        .map(|(&num_cached, table)| SeqSpec {
            num_cached,
            num_new: ROWS,
            block_table: table,
        })
        .collect();
    let plan = AttentionPlan::new(&specs, BLOCK, POOL_BLOCKS as u64).unwrap();
    let rows = plan.rows();
    // The graph of `size` requests: its rows, whatever smaller graph the set also holds.
    let padded = size * ROWS;

    // The target's plan, as its graph stages it (llama::cuda::graph): every row a logit row,
    // grids of the class that serves the step's longest context.
    let tokens = vec![0u32; rows];
    let every_row: Vec<usize> = (0..rows).collect();
    let longest = plan.seqs().iter().map(|q| q.context_len).max().unwrap();
    let class = context_classes(MAX_CONTEXT, DecodeKernel::Split)
        .into_iter()
        .find(|&c| c >= longest)
        .unwrap();
    target
        .stage_padded(&tokens, &plan, &every_row, padded, class)
        .unwrap();
    assert_eq!(
        (target.rows(), target.padded_rows()),
        (rows, padded),
        "{what}"
    );
    // The drafter's step 0 over the same rows, eager and unpadded.
    let mut drafter = DeviceAttentionPlan::growing(&s.gpu, DecodeKernel::Split)
        .unwrap()
        .cutting_every_sequence();
    drafter.stage(&tokens, &plan, &every_row).unwrap();
    assert_eq!(drafter.padded_rows(), rows, "{what}");

    let layout = layout(POOL_BLOCKS);
    let values = to_bf16(&random_f32(&mut rng, layout.layer_elems() as usize, 1.0));
    let mut cache = s.gpu.upload(&values).unwrap();
    let q_len = rows * HEADS * WIDTH;
    let mut q = to_bf16(&random_f32(&mut rng, q_len, 0.5));
    q.extend(vec![sentinel(); TAIL * HEADS * WIDTH]);
    let mut q_dev = s.gpu.upload(&q).unwrap();

    // The drafter's prepare over the target's plan: its inputs and q_lat (the q attention
    // reads) hold the real rows.
    let q_proj = upload(s, &random_f32(&mut rng, rows * HEADS * (NOPE + ROPE), 0.5));
    let kv_a = upload(s, &random_f32(&mut rng, rows * WIDTH, 1.0));
    let kv_norm = upload(s, &random_f32(&mut rng, LATENT, 1.0));
    let cos_sin = s
        .gpu
        .upload(&random_f32(&mut rng, MAX_CONTEXT * ROPE, 1.0))
        .unwrap();
    let (q_proj, kv_a, kv_norm) = (q_proj.slice(..), kv_a.slice(..), kv_norm.slice(..));
    let cos_sin = cos_sin.slice(..);
    let projections = MlaProjections {
        q: &q_proj,
        q_stride: HEADS * (NOPE + ROPE),
        nope: NOPE,
        kv_a: &kv_a,
        kv_stride: WIDTH,
        kv_norm: &kv_norm,
        eps: 1e-6,
    };
    let rotary = RotaryTable {
        cos_sin: &cos_sin,
        positions: MAX_CONTEXT,
        interleaved: true,
    };
    let err = OP
        .prepare(
            &s.kernels,
            s.gpu.stream(),
            projections,
            rotary,
            &mut cache,
            &layout,
            target,
            &mut q_dev.slice_mut(..q_len),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            AttentionError::Plan(PlanError::RowsExceedBuffer { planned, rows: held, .. })
                if planned == padded && held == rows
        ),
        "{what}: {err}"
    );
    assert!(
        same_bits(&s.gpu.download(&q_dev).unwrap(), &q),
        "{what}: the refused prepare wrote q_lat or the sentinel tail after it"
    );
    assert!(
        same_bits(&s.gpu.download(&cache).unwrap(), &values),
        "{what}: the refused prepare wrote the cache"
    );

    // Attention over either plan against the CPU over the uncut requests.
    let seqs: Vec<AttentionSeq> = plan
        .seqs()
        .iter()
        .map(|p| AttentionSeq {
            q_start: p.q_start,
            q_len: p.q_len,
            context_len: p.context_len,
            block_table: &p.block_table,
        })
        .collect();
    let mut want = vec![0f32; rows * HEADS * LATENT];
    let (q32, host) = (to_f32(&q[..q_len]), to_f32(&values));
    cpu::mla_attention(&q32, HEADS, &host, &layout, LATENT, &seqs, SCALE, &mut want);
    let q_rows = q_dev.slice(..q_len);
    let what_target = format!("{what}, the target's padded plan");
    refused(
        &what_target,
        s,
        &q_rows,
        &cache,
        &layout,
        target,
        want.len(),
    );
    let what = format!("{what}, the drafter's plan");
    attend(&what, s, &q_rows, &cache, &layout, &drafter, &want);
}

/// Hands the op `plan` with an o of `n` elements (the real rows: NaN, a sentinel tail after
/// it) and checks that it is refused on the host with o untouched.
fn refused(
    what: &str,
    s: &Setup,
    q: &CudaView<bf16>,
    cache: &CudaSlice<bf16>,
    layout: &KvLayout,
    plan: &DeviceAttentionPlan,
    n: usize,
) {
    let mut o_host = vec![bf16::NAN; n];
    o_host.extend(vec![sentinel(); TAIL * HEADS * LATENT]);
    let mut o = s.gpu.upload(&o_host).unwrap();
    let out = &mut o.slice_mut(..n);
    let err = OP
        .forward(&s.kernels, s.gpu.stream(), q, cache, layout, plan, out)
        .unwrap_err();
    assert!(
        matches!(
            err,
            AttentionError::Plan(PlanError::RowsExceedBuffer { .. })
        ),
        "{what}: {err}"
    );
    let got = s.gpu.download(&o).unwrap();
    assert!(same_bits(&got, &o_host), "{what}: o was written");
}

/// Runs the op over `plan` into an o of the real rows (NaN, a sentinel tail after it) and
/// checks it against `want`, with the tail untouched.
fn attend(
    what: &str,
    s: &Setup,
    q: &CudaView<bf16>,
    cache: &CudaSlice<bf16>,
    layout: &KvLayout,
    plan: &DeviceAttentionPlan,
    want: &[f32],
) {
    let n = want.len();
    let mut o_host = vec![bf16::NAN; n];
    o_host.extend(vec![sentinel(); TAIL * HEADS * LATENT]);
    let mut o = s.gpu.upload(&o_host).unwrap();
    OP.forward(
        &s.kernels,
        s.gpu.stream(),
        q,
        cache,
        layout,
        plan,
        &mut o.slice_mut(..n),
    )
    .unwrap();
    let got = s.gpu.download(&o).unwrap();
    assert_close(what, &to_f32(&got[..n]), want, 2e-3, 1e-2);
    assert!(
        same_bits(&got[n..], &o_host[n..]),
        "{what}: the sentinel tail after o was written"
    );
}

/// `values` rounded to bf16, on the device.
fn upload(s: &Setup, values: &[f32]) -> CudaSlice<bf16> {
    s.gpu.upload(&to_bf16(values)).unwrap()
}

fn same_bits(a: &[bf16], b: &[bf16]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}
