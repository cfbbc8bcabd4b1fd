//! The launchers of latent attention (`cuda/mla.cu`, `cuda/mla_mma.cu`): for one-row
//! sequences the split kernel over the paged-attention planner's split work list, then
//! `paged_attention_combine` of `cuda/attention.cu` (with the latent as its head size) for
//! the sequences of more than one partition; for the rows of longer sequences (prefill)
//! the tensor-core kernel over the prefill work list, where the device and the shape have
//! one.

use super::attention::{combine, AttentionMeta, LIVE_COUNTS, PARTITION_TOKENS};
use super::{grid, CudaKernels};
use crate::cpu::KvLayout;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError};
use half::bf16;

/// Tokens per split item of `mla_decode_split` (`MLA_PARTITION`): the planner's partition.
pub const MLA_PARTITION_TOKENS: usize = PARTITION_TOKENS;
/// The widest cache row (latent + rope) the kernel holds (`MLA_MAX_WIDTH`).
pub const MAX_WIDTH: usize = 1024;

/// Threads of the split kernel (`MLA_THREADS`).
const SPLIT_THREADS: u32 = 256;
/// Query tokens of a prefill work item (`MLA_TILE`): the planner's query tile.
const PREFILL_TOKENS: usize = super::attention::PREFILL_QUERY_TILE;
/// (token, head) pairs of a block of the tensor-core prefill kernel (`MLA_MMA_ROWS`).
const MMA_ROWS: usize = 64;
/// Keys per tile of the tensor-core prefill kernel (`MLA_MMA_BK`).
const MMA_KEYS: usize = 32;
/// bf16 after each shared row of the tensor-core prefill kernel (`MLA_MMA_PAD`).
const MMA_PAD: usize = 8;
/// The (latent, row width) shapes the tensor-core prefill kernel is built for
/// (`mla_prefill_mma_l{latent}_w{width}`): DeepSeek's, and the small test models'.
const MMA_SHAPES: [(usize, usize); 2] = [(512, 576), (32, 40)];

// An item's (token, head) pairs make at most num_heads tiles: its grid's blocks.
const _: () = assert!(PREFILL_TOKENS <= MMA_ROWS);

/// Whether latent attention on `k` runs the rows of sequences longer than one query
/// (prefill) itself, on tensor cores, for a latent of `latent` in cache rows of `width`:
/// where not, every sequence must be cut into one-row sequences for the split kernel.
pub fn runs_prefill(k: &CudaKernels, latent: usize, width: usize) -> bool {
    k.tensor_cores() && MMA_SHAPES.contains(&(latent, width))
}

/// Threads and dynamic shared bytes of a block of the tensor-core prefill kernel
/// (`MlaMma<LATENT, WIDTH>` in `cuda/mla_mma.cu`).
fn mma_geometry(latent: usize, width: usize) -> (u32, u32) {
    let slice = latent.min(256);
    let threads = 4 * (latent / slice) * 32;
    let row = width.div_ceil(16) * 16 + MMA_PAD;
    let scores = MMA_ROWS * (MMA_KEYS + 4) * 4;
    let shared = (MMA_ROWS + 2 * MMA_KEYS) * row * 2 + scores + 2 * MMA_KEYS * 8;
    (threads as u32, shared as u32)
}
/// Threads of the combine kernel (`PA_COMBINE_THREADS`): the latent must divide it.
pub const COMBINE_THREADS: u32 = super::attention::COMBINE_THREADS;

/// The head geometry of one latent-attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaHeads {
    /// Query heads.
    pub num_heads: usize,
    /// Width of the latent part of a cache row; the output's per-head width.
    pub latent: usize,
    /// Softmax scale.
    pub scale: f32,
}

/// Latent attention of every planned row: q (`[rows, num_heads, width]` bf16, each head's
/// absorbed query then its rotary query; width = the layout's head_dim, one KV head)
/// against one layer's latent `cache`, into `o` (`[rows, num_heads, latent]`). Rows no
/// sequence covers are not touched. A plan with prefill rows needs [`runs_prefill`]. `scratch` holds at least
/// `meta.counts.scratch_floats(num_heads, latent)` elements.
///
/// The metadata lives on the device: the caller vouches that every block id is inside the
/// pool and every row below `meta.rows` (the ops layer checks both on its host copy).
#[allow(clippy::too_many_arguments)]
pub fn mla_attention(
    k: &CudaKernels,
    stream: &CudaStream,
    q: &CudaView<bf16>,
    cache: &CudaSlice<bf16>,
    layout: &KvLayout,
    heads: MlaHeads,
    meta: &AttentionMeta,
    scratch: &mut CudaSlice<f32>,
    o: &mut CudaViewMut<bf16>,
) -> Result<(), DriverError> {
    let (nh, latent, width) = (heads.num_heads, heads.latent, layout.head_dim as usize);
    assert_eq!(
        layout.num_kv_heads, 1,
        "mla_attention: one latent row a token"
    );
    assert!(
        latent > 0 && latent <= width && width <= MAX_WIDTH,
        "mla_attention: latent {latent} of rows of {width} (at most {MAX_WIDTH})"
    );
    // 16-byte loads of the cache rows and of each thread's 8 latent elements.
    assert!(
        latent.is_multiple_of(8) && width.is_multiple_of(8),
        "mla_attention: latent {latent} or row width {width} not a multiple of 8"
    );
    // The combine kernel gives every output element the same number of threads.
    assert!(
        (COMBINE_THREADS as usize).is_multiple_of(latent),
        "mla_attention: latent {latent} does not divide {COMBINE_THREADS}"
    );
    assert!(layout.block_size > 0, "mla_attention: block size 0");
    assert!(
        q.len() / (nh * width) >= meta.rows && o.len() / (nh * latent) >= meta.rows,
        "mla_attention: q or o holds fewer rows than planned"
    );
    assert!(
        cache.len() as u64 >= layout.layer_elems(),
        "mla_attention: cache smaller than its layout"
    );
    let counts = meta.counts;
    assert!(
        counts.prefill == 0 || runs_prefill(k, latent, width),
        "mla_attention: no prefill kernel for a latent of {latent} in rows of {width} here"
    );
    assert!(
        meta.q_start.len() >= meta.num_seqs
            && meta.context_len.len() >= meta.num_seqs
            && meta.table_start.len() >= meta.num_seqs
            && meta.split.len() >= 2 * counts.split
            && meta.decode.len() >= 2 * counts.decode
            && meta.q_len.len() >= meta.num_seqs
            && meta.prefill.len() >= 2 * counts.prefill
            && meta.live.len() >= LIVE_COUNTS,
        "mla_attention: metadata shorter than its counts"
    );
    assert!(
        scratch.len() >= counts.scratch_floats(nh, latent),
        "mla_attention: scratch too small"
    );
    let blocks = |items: usize| -> u32 {
        let blocks = items * nh;
        assert!(blocks <= i32::MAX as usize, "mla_attention: grid too large");
        blocks as u32
    };
    let (nh_i, width_i, latent_i, bs_i) = (
        nh as i32,
        width as i32,
        latent as i32,
        layout.block_size as i32,
    );
    if counts.split > 0 {
        let work_i = counts.split as i32;
        let mut launch = k.launch(stream, "mla_decode_split");
        launch
            .arg(q)
            .arg(cache)
            .arg(&meta.q_start)
            .arg(&meta.context_len)
            .arg(&meta.table_start)
            .arg(&meta.block_table)
            .arg(&meta.split)
            .arg(&work_i)
            .arg(&meta.live)
            .arg(&mut *scratch)
            .arg(&mut *o)
            .arg(&nh_i)
            .arg(&width_i)
            .arg(&latent_i)
            .arg(&bs_i)
            .arg(&heads.scale);
        // SAFETY: one block per split pair and head; the rows and block ids the metadata
        // names lie inside q and the cache (the caller's contract, checked on the host by
        // the ops layer), every record written lies inside scratch (checked above), and a
        // one-partition row writes its own row of o (below `meta.rows`, checked).
        unsafe { launch.launch(grid(blocks(counts.split), SPLIT_THREADS, 0)) }?;
    }
    if counts.decode > 0 {
        combine(k, stream, scratch, nh, latent, meta, o)?;
    }
    if counts.prefill > 0 {
        // The kernel copies q rows in whole 16-byte pieces.
        assert!(
            q.device_ptr(stream).0.is_multiple_of(16),
            "mla_attention: q not 16-byte aligned"
        );
        let name = format!("mla_prefill_mma_l{latent}_w{width}");
        let (threads, shared) = mma_geometry(latent, width);
        k.grant_shared(&name, shared)?;
        let mut launch = k.launch(stream, &name);
        launch
            .arg(q)
            .arg(cache)
            .arg(&meta.q_start)
            .arg(&meta.q_len)
            .arg(&meta.context_len)
            .arg(&meta.table_start)
            .arg(&meta.block_table)
            .arg(&meta.prefill)
            .arg(&meta.live)
            .arg(&mut *o)
            .arg(&nh_i)
            .arg(&bs_i)
            .arg(&heads.scale);
        // SAFETY: one block per prefill item and tile of its (token, head) pairs; the rows
        // and block ids the metadata names lie inside q and the cache (the caller's
        // contract, checked on the host by the ops layer), and each block writes only its
        // pairs' rows of o (below `meta.rows`, checked above).
        unsafe { launch.launch(grid(blocks(counts.prefill), threads, shared)) }?;
    }
    Ok(())
}

/// Threads of `mla_prepare` (`MLA_PREPARE_THREADS`).
const PREPARE_THREADS: u32 = 128;

/// The projections of one step's rows of a latent-attention layer, as [`mla_prepare`]
/// reads them: each row's query heads and its compressed key/value row.
#[derive(Clone, Copy)]
pub struct MlaProjections<'a, 'b> {
    /// `[rows, q_stride]`: row r's head h is `[q_nope | q_pe]` from column
    /// `h * (nope + rope)`.
    pub q: &'a CudaView<'b, bf16>,
    /// Elements between rows of `q`.
    pub q_stride: usize,
    /// Per-head width of the query's part without a position.
    pub nope: usize,
    /// `[rows, kv_stride]`: row r's latent then its rotary key, from column 0.
    pub kv_a: &'a CudaView<'b, bf16>,
    /// Elements between rows of `kv_a`.
    pub kv_stride: usize,
    /// The latent's RMSNorm weight (`kv_a_layernorm`), `[latent]`, and its epsilon.
    pub kv_norm: &'a CudaView<'b, bf16>,
    pub eps: f32,
}

/// The rotary table and the step's positions and slots, as [`mla_prepare`] reads them.
#[derive(Clone, Copy)]
pub struct MlaRotary<'a, 'b> {
    /// Per position, rope/2 cosines then rope/2 sines (f32).
    pub cos_sin: &'a CudaView<'b, f32>,
    /// Positions the table covers.
    pub table_positions: usize,
    /// Whether pairs are interleaved (element 2i with 2i+1) rather than halves.
    pub interleaved: bool,
    /// Each row's position (below `table_positions`: the caller's check).
    pub positions: &'a CudaView<'b, i32>,
    /// Each row's cache slot (negative: not written).
    pub slot_mapping: &'a CudaView<'b, i64>,
}

/// For `rows` rows: each query head's rotary part rotated into `q_lat` (`[rows, heads,
/// latent + rope]`, from column `latent` of each head; the absorbed part is left to the
/// product) and each row's cache row (the normed latent, then the rotated key) written at
/// its slot of one layer's latent `cache` (`layout`: one head of `latent + rope`). A slot
/// past the pool is skipped on the device; the ops layer refuses such plans first.
#[allow(clippy::too_many_arguments)]
pub fn mla_prepare(
    k: &CudaKernels,
    stream: &CudaStream,
    p: MlaProjections,
    rot: MlaRotary,
    heads: usize,
    rows: usize,
    cache: &mut CudaSlice<bf16>,
    layout: &KvLayout,
    q_lat: &mut CudaViewMut<bf16>,
) -> Result<(), DriverError> {
    let width = layout.head_dim as usize;
    let latent = p.kv_norm.len();
    assert!(
        layout.num_kv_heads == 1 && latent < width,
        "mla_prepare: not a latent layout"
    );
    let rope = width - latent;
    assert!(
        rope.is_multiple_of(2),
        "mla_prepare: odd rotary width {rope}"
    );
    assert!(
        rot.cos_sin.len() >= rot.table_positions * rope,
        "mla_prepare: a rotary table shorter than its positions"
    );
    let reach = |stride: usize, cols: usize| rows.saturating_sub(1) * stride + cols;
    assert!(
        p.q.len() >= reach(p.q_stride, heads * (p.nope + rope))
            && p.kv_a.len() >= reach(p.kv_stride, width)
            && rot.positions.len() >= rows
            && rot.slot_mapping.len() >= rows
            && q_lat.len() >= rows * heads * width,
        "mla_prepare: short buffers"
    );
    assert!(
        cache.len() as u64 >= layout.layer_elems(),
        "mla_prepare: cache smaller than its layout"
    );
    if rows == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(rows * (heads + 1)).expect("mla_prepare: grid too large");
    let slots = (layout.num_blocks * layout.block_size) as i64;
    let rotary: i32 = if rot.interleaved { 2 } else { 1 };
    let (q_stride, kv_stride) = (p.q_stride as i64, p.kv_stride as i64);
    let (nope, rows_i, heads_i) = (p.nope as i32, rows as i32, heads as i32);
    let (latent_i, rope_i) = (latent as i32, rope as i32);
    let mut launch = k.launch(stream, "mla_prepare");
    launch
        .arg(p.q)
        .arg(&q_stride)
        .arg(&nope)
        .arg(p.kv_a)
        .arg(&kv_stride)
        .arg(p.kv_norm)
        .arg(&p.eps)
        .arg(rot.positions)
        .arg(rot.cos_sin)
        .arg(&rotary)
        .arg(rot.slot_mapping)
        .arg(&rows_i)
        .arg(&slots)
        .arg(&mut *q_lat)
        .arg(&mut *cache)
        .arg(&heads_i)
        .arg(&latent_i)
        .arg(&rope_i);
    // SAFETY: every row read or written lies inside its buffer (checked above); cache rows
    // are written only at slots inside the pool (checked on the device), positions are in
    // the table (the caller's contract, checked by the model against max_model_len).
    unsafe { launch.launch(grid(blocks, PREPARE_THREADS, 0)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kernel_source_agrees_with_the_host_constants() {
        let source = concat!(
            include_str!("../../cuda/mla.cu"),
            include_str!("../../cuda/mla_mma.cu")
        );
        for (name, value) in [
            ("MLA_TILE", super::PREFILL_TOKENS),
            ("MLA_LIVE_PREFILL", 2),
            ("MLA_MMA_ROWS", super::MMA_ROWS),
            ("MLA_MMA_BK", super::MMA_KEYS),
            ("MLA_MMA_PAD", super::MMA_PAD),
            ("MLA_PARTITION", super::MLA_PARTITION_TOKENS),
            ("MLA_MAX_WIDTH", super::MAX_WIDTH),
            ("MLA_THREADS", super::SPLIT_THREADS as usize),
            ("MLA_LIVE_SPLIT", 0),
            ("MLA_PREPARE_THREADS", super::PREPARE_THREADS as usize),
        ] {
            let line = format!("#define {name} {value} ");
            assert!(source.contains(&line), "{name} is not {value} in mla*.cu");
        }
        let attention = include_str!("../../cuda/attention.cu");
        assert!(attention.contains("#define PA_LIVE_SPLIT 0 "));
        assert!(attention.contains("#define PA_LIVE_PREFILL 2"));
        for (latent, width) in super::MMA_SHAPES {
            let name = format!("mla_prefill_mma_l{latent}_w{width}(");
            assert!(source.contains(&name), "mla_mma.cu lacks {name}");
        }
        assert!(attention.contains(&format!(
            "#define PA_COMBINE_THREADS {} ",
            super::COMBINE_THREADS
        )));
    }
}
