//! The launcher of latent-attention decode (`cuda/mla.cu`): the split kernel over the
//! paged-attention planner's split work list, then `paged_attention_combine` of
//! `cuda/attention.cu` (with the latent as its head size) for the sequences of more than
//! one partition.

use super::attention::{combine, AttentionMeta, LIVE_COUNTS, PARTITION_TOKENS};
use super::{grid, CudaKernels};
use crate::cpu::KvLayout;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError};
use half::bf16;

/// Tokens per split item of `mla_decode_split` (`MLA_PARTITION`): the planner's partition.
pub const MLA_PARTITION_TOKENS: usize = PARTITION_TOKENS;
/// The widest cache row (latent + rope) the kernel holds (`MLA_MAX_WIDTH`).
pub const MAX_WIDTH: usize = 1024;

/// Threads of the split kernel (`MLA_THREADS`).
const SPLIT_THREADS: u32 = 256;
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

/// Latent attention of every planned decode row: q (`[rows, num_heads, width]` bf16, each
/// head's absorbed query then its rotary query; width = the layout's head_dim, one KV head)
/// against one layer's latent `cache`, into `o` (`[rows, num_heads, latent]`). Rows no
/// sequence covers are not touched. `scratch` holds at least
/// `meta.counts.scratch_floats(num_heads, latent)` elements.
///
/// The metadata lives on the device: the caller vouches that every block id is inside the
/// pool and every row below `meta.rows` (the ops layer checks both on its host copy).
#[allow(clippy::too_many_arguments)]
pub fn mla_decode(
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
    assert_eq!(layout.num_kv_heads, 1, "mla_decode: one latent row a token");
    assert!(
        latent > 0 && latent <= width && width <= MAX_WIDTH,
        "mla_decode: latent {latent} of rows of {width} (at most {MAX_WIDTH})"
    );
    // The combine kernel gives every output element the same number of threads.
    assert!(
        (COMBINE_THREADS as usize).is_multiple_of(latent),
        "mla_decode: latent {latent} does not divide {COMBINE_THREADS}"
    );
    assert!(layout.block_size > 0, "mla_decode: block size 0");
    assert!(
        q.len() / (nh * width) >= meta.rows && o.len() / (nh * latent) >= meta.rows,
        "mla_decode: q or o holds fewer rows than planned"
    );
    assert!(
        cache.len() as u64 >= layout.layer_elems(),
        "mla_decode: cache smaller than its layout"
    );
    let counts = meta.counts;
    assert_eq!(counts.prefill, 0, "mla_decode: decode rows only");
    assert!(
        meta.q_start.len() >= meta.num_seqs
            && meta.context_len.len() >= meta.num_seqs
            && meta.table_start.len() >= meta.num_seqs
            && meta.split.len() >= 2 * counts.split
            && meta.decode.len() >= 2 * counts.decode
            && meta.live.len() >= LIVE_COUNTS,
        "mla_decode: metadata shorter than its counts"
    );
    assert!(
        scratch.len() >= counts.scratch_floats(nh, latent),
        "mla_decode: scratch too small"
    );
    let blocks = |items: usize| -> u32 {
        let blocks = items * nh;
        assert!(blocks <= i32::MAX as usize, "mla_decode: grid too large");
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
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kernel_source_agrees_with_the_host_constants() {
        let source = include_str!("../../cuda/mla.cu");
        for (name, value) in [
            ("MLA_PARTITION", super::MLA_PARTITION_TOKENS),
            ("MLA_MAX_WIDTH", super::MAX_WIDTH),
            ("MLA_THREADS", super::SPLIT_THREADS as usize),
            ("MLA_LIVE_SPLIT", 0),
        ] {
            let line = format!("#define {name} {value} ");
            assert!(source.contains(&line), "{name} is not {value} in mla.cu");
        }
        let attention = include_str!("../../cuda/attention.cu");
        assert!(attention.contains("#define PA_LIVE_SPLIT 0 "));
        assert!(attention.contains(&format!(
            "#define PA_COMBINE_THREADS {} ",
            super::COMBINE_THREADS
        )));
    }
}
