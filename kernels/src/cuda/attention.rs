//! Launchers of paged attention (`cuda/attention.cu`), the host-side work lists they walk,
//! and the address audit of the GPU cache kernels (docs/architecture.md, rule 2).
//!
//! A sequence with one query row (decode) goes through the split kernel: its context is cut
//! into partitions of [`PARTITION_TOKENS`] tokens, each writing a partial result to scratch,
//! then the combine kernel merges them in an order fixed by the number of partitions (a
//! context of one partition is finished by the split kernel, to the same bits). A split
//! block serves up to 4 query heads of one KV head, so K and V are read once for the heads
//! that share them, or fewer when that leaves the GPU idle. A sequence with more query rows
//! goes through the prefill kernel (flash-attention tiles), except that the ops layer cuts a
//! sequence of up to [`SPLIT_MAX_ROWS`] rows (a verification step) into one-row sequences
//! for the split kernel where it is the decode kernel. The choice and every reduction
//! order depend only on the sequence's own shape, so a row's result is the same whatever else
//! is in the batch.

use super::launch::ByValue;
use super::{grid, CudaKernels};
use crate::cpu::{AddressAudit, KvLayout};
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceRepr, DriverError,
};
use half::bf16;

/// Entries of the live-count array the kernels read: split, decode and prefill pairs.
pub const LIVE_COUNTS: usize = 3;

/// Tokens per split partition (`PA_PARTITION` in the kernel source): a constant, never
/// chosen from the batch, so that a row's partitions do not depend on the batch.
pub const PARTITION_TOKENS: usize = 512;
/// The most query rows of a sequence that go through the split kernel one row at a time,
/// each as the decode row at its position (where the split kernel is the decode kernel):
/// a verification step's rows (1 + up to 16 drafts) and short chunks. The prefill kernel
/// runs one block per query tile and head, walking the context's key tiles in turn: for a
/// verification step of 4 rows on SmolLM2-135M (9 heads, contexts of 128 to 400) it took
/// 22.6 us a layer on the H200 against 7.0 us for the split kernel's decode row (Nsight
/// Compute). Cut rows read their context once each, so past a few dozen rows the prefill
/// kernel's single pass over the keys wins.
pub const SPLIT_MAX_ROWS: usize = 32;
/// Query rows per prefill work item (`PA_TILE`): the tensor-core kernel's tile, which the
/// CUDA-core kernel takes in two passes.
pub const PREFILL_QUERY_TILE: usize = 64;
/// Head dimensions the kernels are built for.
pub const HEAD_DIMS: [usize; 2] = [64, 128];

/// Query heads per split block: one kernel per bucket (`_g1`, `_g2`, `_g4`).
const SPLIT_GROUPS: [usize; 3] = [1, 2, 4];

/// Split blocks that keep the GPU busy (two per multiprocessor of an H200, about): the
/// launcher takes the largest bucket of query heads per block that still launches this
/// many, so a short batch spreads its heads over more blocks. A head's result does not
/// depend on the bucket.
const SPLIT_BUSY_BLOCKS: usize = 256;

/// Threads of the split, combine and prefill kernels (`PA_*_THREADS` in the source).
const SPLIT_THREADS: u32 = 256;
pub(crate) const COMBINE_THREADS: u32 = 512;
const PREFILL_THREADS: u32 = 128;
/// Threads of the tensor-core prefill kernel (`PA_MMA_THREADS`): a warp per 16 query rows.
const PREFILL_MMA_THREADS: u32 = 128;

/// One sequence's query rows and context, as the work lists need them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqRows {
    /// Query rows (new tokens) this step; at least 1.
    pub q_len: usize,
    /// Tokens in the cache once this step's keys are written; at least `q_len`.
    pub context_len: usize,
}

/// Which kernel the rows of a one-token step of a sequence (a decode) go through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeKernel {
    /// The split kernel: the context's partitions in parallel, then the combine. Fastest,
    /// but its reduction order differs from the prefill kernel's, so a position computed
    /// in a chunk of one token differs in the last bits from the same position computed
    /// inside a longer chunk.
    #[default]
    Split,
    /// The prefill kernel, like every longer chunk: each query row reduces its keys in the
    /// same order however the prompt was cut into chunks and whether its prefix came from
    /// the cache (--deterministic).
    Prefill,
}

/// The work lists of one step, built on the host from the sequences alone. Each list holds
/// `i32` pairs; the kernels launch one block per pair and head.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttentionWork {
    /// `(sequence, partition)` for every partition of every decode sequence, in order.
    pub split: Vec<i32>,
    /// `(sequence, index of its first split pair)` for every decode sequence of more than
    /// one partition (the split kernel finishes the others).
    pub decode: Vec<i32>,
    /// `(sequence, query tile)` for every tile of every prefill sequence.
    pub prefill: Vec<i32>,
}

impl AttentionWork {
    /// The work lists for `seqs` (indexed as in the device metadata): sequences with one
    /// query row go to `decode`'s kernel, the others are tiled by query rows.
    pub fn new(seqs: &[SeqRows], decode: DecodeKernel) -> AttentionWork {
        let mut work = AttentionWork::default();
        for (s, seq) in seqs.iter().enumerate() {
            assert!(
                seq.q_len >= 1 && seq.q_len <= seq.context_len,
                "sequence {s}: {} queries over a context of {}",
                seq.q_len,
                seq.context_len
            );
            assert!(
                seq.context_len <= (i32::MAX as usize) - PARTITION_TOKENS,
                "sequence {s}: context of {} tokens does not fit the kernels' int positions",
                seq.context_len
            );
            let s = s as i32;
            if seq.q_len == 1 && decode == DecodeKernel::Split {
                let parts = seq.context_len.div_ceil(PARTITION_TOKENS);
                if parts > 1 {
                    work.decode.extend([s, (work.split.len() / 2) as i32]);
                }
                for part in 0..parts {
                    work.split.extend([s, part as i32]);
                }
            } else {
                for tile in 0..seq.q_len.div_ceil(PREFILL_QUERY_TILE) {
                    work.prefill.extend([s, tile as i32]);
                }
            }
        }
        work
    }

    /// Split pairs (partitions of decode sequences).
    pub fn split_items(&self) -> usize {
        self.split.len() / 2
    }

    /// Decode sequences of more than one partition.
    pub fn decode_seqs(&self) -> usize {
        self.decode.len() / 2
    }

    /// Prefill pairs (query tiles of prefill sequences).
    pub fn prefill_items(&self) -> usize {
        self.prefill.len() / 2
    }

    /// The counts, for the launcher.
    pub fn counts(&self) -> WorkCounts {
        WorkCounts {
            split: self.split_items(),
            decode: self.decode_seqs(),
            prefill: self.prefill_items(),
        }
    }
}

/// How many pairs each work list holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCounts {
    /// Split pairs.
    pub split: usize,
    /// Decode sequences of more than one partition.
    pub decode: usize,
    /// Prefill pairs.
    pub prefill: usize,
}

impl WorkCounts {
    /// f32 elements of split scratch for heads of `head_dim`: one record of `head_dim`
    /// partial outputs plus a max and a sum per split pair and head.
    pub fn scratch_floats(&self, num_heads: usize, head_dim: usize) -> usize {
        self.split * num_heads * (head_dim + 2)
    }
}

/// One step's metadata on the device, as the kernels read it. Every per-sequence array has
/// `num_seqs` entries; the work lists hold what `counts` says.
pub struct AttentionMeta<'a> {
    /// First query row of each sequence.
    pub q_start: CudaView<'a, i32>,
    /// Query rows of each sequence.
    pub q_len: CudaView<'a, i32>,
    /// Context length of each sequence (after this step's writes).
    pub context_len: CudaView<'a, i32>,
    /// Where each sequence's block ids start in `block_table`.
    pub table_start: CudaView<'a, i64>,
    /// Every sequence's block ids, one after another.
    pub block_table: CudaView<'a, i32>,
    /// `AttentionWork::split`.
    pub split: CudaView<'a, i32>,
    /// `AttentionWork::decode`.
    pub decode: CudaView<'a, i32>,
    /// `AttentionWork::prefill`.
    pub prefill: CudaView<'a, i32>,
    /// The pairs of this step in each list (`[split, decode, prefill]`, [`LIVE_COUNTS`]
    /// entries), read by the kernels on the device: blocks past them return at once.
    pub live: CudaView<'a, i32>,
    /// Sequences.
    pub num_seqs: usize,
    /// Pairs each work list has room for: the grids and the scratch layout. An eager step
    /// launches its live counts; a captured graph its capacity, so that one graph serves
    /// every step that fits.
    pub counts: WorkCounts,
    /// Query rows the sequences cover (the largest `q_start + q_len`).
    pub rows: usize,
}

/// The KV write of a step whose rows all go to the split kernel, fused into it: each
/// sequence's last token is written to `slot_mapping[row]` (rotated by `rotary`, the table
/// and whether pairs are interleaved, at `positions[row]`) and read from q's K and V
/// columns, as `kv_write_bf16` would write it; q is rotated as it is read. The
/// `step_tokens[seq]` tokens at the end of a sequence's context (its own and those of the
/// rows before it, a verification step's rows cut into sequences) are read from q's rows
/// too, never from the cache that other blocks of the launch write.
pub struct FusedKvWrite<'a, 'b> {
    /// Position of every row.
    pub positions: &'a CudaView<'b, i32>,
    /// The cos/sin table (`[positions, head_dim]`) and the pairing, if the model rotates.
    pub rotary: Option<(&'a CudaView<'b, f32>, bool)>,
    /// Cache slot of every row.
    pub slot_mapping: &'a CudaView<'b, i64>,
    /// This step's tokens at the end of each sequence's context, the last the sequence's
    /// row (`PlannedSeq::step_tokens` of the ops layer).
    pub step_tokens: &'a CudaView<'b, i32>,
    /// The most of them a sequence of this launch has (or of any step a graph's launch
    /// replays): 1 launches the decode step's kernel, up to [`SPLIT_MAX_ROWS`] the kernel
    /// that stages a sequence's earlier rows of the step.
    pub step_rows: usize,
}

/// `PaNewKv` of the kernel source, as the launcher passes it by value.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PaNewKv {
    positions: u64,
    cos_sin: u64,
    rotary: i32,
    slot_mapping: u64,
    step_tokens: u64,
    num_slots: i64,
    fuse: i32,
}

// SAFETY: a plain C struct of integers, laid out as the kernel's `PaNewKv`.
unsafe impl DeviceRepr for PaNewKv {}

/// The head geometry of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Heads {
    /// Query heads; a multiple of the layout's KV heads.
    pub num_heads: usize,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// `paged_attention_combine` of a step's decode sequences of more than one partition:
/// their split records in `scratch` (of `num_heads` heads of `head_dim`) merged into their
/// rows of `o`. The caller has checked `meta`, `scratch` and `o` against each other (and
/// `head_dim` divides [`COMBINE_THREADS`]).
pub(crate) fn combine(
    k: &CudaKernels,
    stream: &CudaStream,
    scratch: &CudaSlice<f32>,
    num_heads: usize,
    head_dim: usize,
    meta: &AttentionMeta,
    o: &mut CudaViewMut<bf16>,
) -> Result<(), DriverError> {
    let blocks = meta.counts.decode * num_heads;
    assert!(blocks <= i32::MAX as usize, "combine: grid too large");
    let (work_i, nh_i, d_i) = (meta.counts.split as i32, num_heads as i32, head_dim as i32);
    let mut launch = k.launch(stream, "paged_attention_combine");
    launch
        .arg(scratch)
        .arg(&work_i)
        .arg(&nh_i)
        .arg(&d_i)
        .arg(&meta.decode)
        .arg(&meta.live)
        .arg(&meta.q_start)
        .arg(&meta.context_len)
        .arg(&mut *o);
    // SAFETY: one block per decode sequence and head, reading the records the split kernel
    // wrote for it and writing its own row of o (below `meta.rows`, checked by the caller).
    unsafe { launch.launch(grid(blocks as u32, COMBINE_THREADS, 0)) }
}

/// Paged attention of every planned row: q (bf16 rows of `q_stride`, heads at column 0)
/// against one layer's caches, into the dense `o` (`[rows, num_heads * head_dim]`). Rows no
/// sequence covers are not touched. `scratch` holds at least
/// `meta.counts.scratch_floats(num_heads, head_dim)` elements.
///
/// The metadata itself lives on the device and cannot be checked here: the caller vouches
/// that every block id is inside the pool and every sequence's rows lie below `meta.rows`
/// (the ops layer checks both on its host copy before calling).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    k: &CudaKernels,
    stream: &CudaStream,
    q: &CudaView<bf16>,
    q_stride: usize,
    k_cache: &mut CudaSlice<bf16>,
    v_cache: &mut CudaSlice<bf16>,
    layout: &KvLayout,
    heads: Heads,
    meta: &AttentionMeta,
    fused: Option<FusedKvWrite>,
    scratch: &mut CudaSlice<f32>,
    o: &mut CudaViewMut<bf16>,
) -> Result<(), DriverError> {
    let d = layout.head_dim as usize;
    let kv_heads = layout.num_kv_heads as usize;
    let nh = heads.num_heads;
    let width = nh * d;
    assert!(
        HEAD_DIMS.contains(&d),
        "paged_attention: head_dim {d} not built"
    );
    // The combine kernel gives every output element the same number of threads.
    assert!((COMBINE_THREADS as usize).is_multiple_of(d));
    assert!(
        kv_heads > 0 && nh.is_multiple_of(kv_heads),
        "paged_attention: {nh} heads not grouped over {kv_heads} KV heads"
    );
    assert!(layout.block_size > 0, "paged_attention: block size 0");
    assert!(
        q_stride >= width && q.len() / q_stride >= meta.rows,
        "paged_attention: q holds fewer rows than planned"
    );
    assert!(
        o.len() / width >= meta.rows,
        "paged_attention: o holds fewer rows than planned"
    );
    let layer = layout.layer_elems();
    assert!(
        k_cache.len() as u64 >= layer && v_cache.len() as u64 >= layer,
        "paged_attention: cache smaller than its layout"
    );
    let counts = meta.counts;
    assert!(
        meta.q_start.len() >= meta.num_seqs
            && meta.q_len.len() >= meta.num_seqs
            && meta.context_len.len() >= meta.num_seqs
            && meta.table_start.len() >= meta.num_seqs
            && meta.split.len() >= 2 * counts.split
            && meta.decode.len() >= 2 * counts.decode
            && meta.prefill.len() >= 2 * counts.prefill
            && meta.live.len() >= LIVE_COUNTS,
        "paged_attention: metadata shorter than its counts"
    );
    assert!(
        scratch.len() >= counts.scratch_floats(nh, d),
        "paged_attention: scratch too small"
    );
    let blocks = |items: usize| -> u32 {
        let blocks = items * nh;
        assert!(
            blocks <= i32::MAX as usize,
            "paged_attention: grid too large"
        );
        blocks as u32
    };
    let q_stride_i = q_stride as i64;
    let (nh_i, kvh_i, bs_i) = (nh as i32, kv_heads as i32, layout.block_size as i32);
    let scale = heads.scale;
    let new_kv = match &fused {
        None => PaNewKv::default(),
        Some(f) => {
            assert!(
                counts.prefill == 0 && q_stride >= width + 2 * kv_heads * d,
                "paged_attention: a fused KV write needs split-kernel rows only and K and V columns"
            );
            assert!(
                f.positions.len() >= meta.rows
                    && f.slot_mapping.len() >= meta.rows
                    && f.step_tokens.len() >= meta.num_seqs,
                "paged_attention: short positions, slot mapping or step tokens"
            );
            assert!(
                (1..=SPLIT_MAX_ROWS).contains(&f.step_rows),
                "paged_attention: {} step tokens a sequence past the kernels' {SPLIT_MAX_ROWS}",
                f.step_rows
            );
            let (cos_sin, rotary) = match &f.rotary {
                Some((table, interleaved)) => {
                    assert!(table.len() >= d, "paged_attention: empty rotary table");
                    (table.device_ptr(stream).0, if *interleaved { 2 } else { 1 })
                }
                None => (0, 0),
            };
            PaNewKv {
                positions: f.positions.device_ptr(stream).0,
                cos_sin,
                rotary,
                slot_mapping: f.slot_mapping.device_ptr(stream).0,
                step_tokens: f.step_tokens.device_ptr(stream).0,
                num_slots: (layout.num_blocks * layout.block_size) as i64,
                fuse: 1,
            }
        }
    };

    if counts.split > 0 {
        let work_i = counts.split as i32;
        let bucket = split_bucket(counts.split, nh / kv_heads, kv_heads);
        let per_item = kv_heads * (nh / kv_heads).div_ceil(bucket);
        let steps = match &fused {
            Some(f) if f.step_rows > 1 => "steps_",
            _ => "",
        };
        let name = format!("paged_attention_split_{steps}d{d}_g{bucket}");
        let mut launch = k.launch(stream, &name);
        launch
            .arg(q)
            .arg(&q_stride_i)
            .arg(&mut *k_cache)
            .arg(&mut *v_cache)
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
            .arg(&kvh_i)
            .arg(&bs_i)
            .arg(&scale)
            .arg(ByValue(new_kv));
        let split_blocks = counts.split * per_item;
        assert!(
            split_blocks <= i32::MAX as usize,
            "paged_attention: grid too large"
        );
        // SAFETY: one block per split pair, KV head and chunk of its query heads; the rows
        // and block ids the metadata names lie inside q and the caches (the caller's
        // contract, checked on the host by the ops layer), every record written lies
        // inside scratch (checked above), and a one-partition row writes its own row of o
        // (below `meta.rows`, checked). A fused KV write reads positions and slots of rows
        // below `meta.rows` (checked above) and skips slots outside the pool; the caller
        // vouches that positions lie inside the rotary table (checked by the ops layer) and
        // that a sequence's step tokens are rows of q at and before its own (the ops
        // layer's plan asserts it when staged).
        unsafe { launch.launch(grid(split_blocks as u32, SPLIT_THREADS, 0)) }?;
    }
    if counts.decode > 0 {
        combine(k, stream, scratch, nh, d, meta, o)?;
    }
    if counts.prefill > 0 {
        // The tensor-core kernel copies q rows in 16-byte pieces.
        let tensor_cores = k.tensor_cores();
        assert!(
            !tensor_cores || (q.device_ptr(stream).0 % 16 == 0 && q_stride.is_multiple_of(8)),
            "paged_attention: q rows not 16-byte aligned"
        );
        let (name, threads) = if tensor_cores {
            (
                format!("paged_attention_prefill_mma_d{d}"),
                PREFILL_MMA_THREADS,
            )
        } else {
            (format!("paged_attention_prefill_d{d}"), PREFILL_THREADS)
        };
        let mut launch = k.launch(stream, &name);
        launch
            .arg(q)
            .arg(&q_stride_i)
            .arg(&*k_cache)
            .arg(&*v_cache)
            .arg(&meta.q_start)
            .arg(&meta.q_len)
            .arg(&meta.context_len)
            .arg(&meta.table_start)
            .arg(&meta.block_table)
            .arg(&meta.prefill)
            .arg(&meta.live)
            .arg(&mut *o)
            .arg(&nh_i)
            .arg(&kvh_i)
            .arg(&bs_i)
            .arg(&scale);
        // SAFETY: one block per query tile and head; as for the split kernel, every row and
        // block id is inside its buffer, and each block writes only its tile's rows of o.
        unsafe { launch.launch(grid(blocks(counts.prefill), threads, 0)) }?;
    }
    Ok(())
}

/// Query heads per split block for `items` split pairs of `group` query heads per KV head:
/// the largest bucket, up to the one that holds the group, that launches at least
/// [`SPLIT_BUSY_BLOCKS`] blocks, else one head per block.
fn split_bucket(items: usize, group: usize, kv_heads: usize) -> usize {
    let holds = SPLIT_GROUPS
        .into_iter()
        .find(|&g| g >= group)
        .unwrap_or(SPLIT_GROUPS[SPLIT_GROUPS.len() - 1]);
    SPLIT_GROUPS
        .into_iter()
        .rev()
        .filter(|&g| g <= holds)
        .find(|&g| items * kv_heads * group.div_ceil(g) >= SPLIT_BUSY_BLOCKS)
        .unwrap_or(SPLIT_GROUPS[0])
}

/// The address audit of the GPU cache kernels (`kv_write_bf16`, `paged_attention_*`) for
/// one layer of `layout` with `elem_bytes`-byte elements: they compute every element offset
/// as a 64-bit `long long`, so the largest byte offset must fit `i64::MAX`; block ids travel
/// in an `int` block table, so the pool may hold at most `i32::MAX` blocks; and the kernels
/// take block size and slot width as `int`. The error names the kernels, the pool and the
/// limit that does not hold.
pub fn audit(layout: &KvLayout, elem_bytes: u64) -> Result<AddressAudit, String> {
    let limit = i64::MAX as u64;
    let pool = format!(
        "a layer of {} blocks x {} tokens x {} KV heads x {} elements of {elem_bytes} bytes",
        layout.num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim
    );
    if layout.num_blocks > i32::MAX as u64 {
        return Err(format!(
            "kv_write_bf16 / paged_attention: {pool} has block ids past the i32 block table's \
             limit of {} blocks",
            i32::MAX
        ));
    }
    let int_max = i32::MAX as u64;
    if layout.block_size > int_max || layout.slot_elems() > int_max {
        return Err(format!(
            "kv_write_bf16 / paged_attention: {pool} has a block size or slot width past the \
             kernels' int limit of {int_max}"
        ));
    }
    let bytes = layout
        .num_blocks
        .checked_mul(layout.block_size)
        .and_then(|t| t.checked_mul(layout.slot_elems()))
        .and_then(|e| e.checked_mul(elem_bytes))
        .filter(|&b| b <= limit)
        .ok_or_else(|| {
            format!(
                "kv_write_bf16 / paged_attention: {pool} has byte offsets past the kernels' \
                 64-bit (long long) limit of {limit}"
            )
        })?;
    Ok(AddressAudit {
        largest_byte_offset: bytes.saturating_sub(1),
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = concat!(
        include_str!("../../cuda/attention.cu"),
        include_str!("../../cuda/attention_mma.cu")
    );

    #[test]
    fn the_source_agrees_with_the_launcher_constants() {
        for (name, value) in [
            ("PA_PARTITION", PARTITION_TOKENS),
            ("PA_TILE", PREFILL_QUERY_TILE),
            ("PA_MMA_THREADS", PREFILL_MMA_THREADS as usize),
            ("PA_SPLIT_THREADS", SPLIT_THREADS as usize),
            ("PA_STEP_ROWS", SPLIT_MAX_ROWS),
            ("PA_COMBINE_THREADS", COMBINE_THREADS as usize),
            ("PA_PREFILL_THREADS", PREFILL_THREADS as usize),
        ] {
            let line = format!("#define {name} {value} ");
            assert!(SOURCE.contains(&line), "attention.cu lacks `{line}`");
        }
        for d in HEAD_DIMS {
            for g in SPLIT_GROUPS {
                assert!(SOURCE.contains(&format!("paged_attention_split_d{d}_g{g}(")));
                assert!(SOURCE.contains(&format!("paged_attention_split_steps_d{d}_g{g}(")));
            }
            assert!(SOURCE.contains(&format!("paged_attention_prefill_d{d}(")));
            assert!(SOURCE.contains(&format!("paged_attention_prefill_mma_d{d}(")));
        }
    }

    #[test]
    fn work_lists_depend_on_each_sequence_alone() {
        let seqs = [
            SeqRows {
                q_len: 1,
                context_len: 1500,
            },
            SeqRows {
                q_len: 130,
                context_len: 160,
            },
            SeqRows {
                q_len: 1,
                context_len: 512,
            },
            SeqRows {
                q_len: 1,
                context_len: 513,
            },
        ];
        let work = AttentionWork::new(&seqs, DecodeKernel::Split);
        assert_eq!(work.split, [0, 0, 0, 1, 0, 2, 2, 0, 3, 0, 3, 1]);
        // Sequence 2 (one partition) is finished by the split kernel: nothing to combine.
        assert_eq!(work.decode, [0, 0, 3, 4]);
        assert_eq!(work.prefill, [1, 0, 1, 1, 1, 2]);
        let counts = work.counts();
        assert_eq!((counts.split, counts.decode, counts.prefill), (6, 2, 3));
        assert_eq!(counts.scratch_floats(8, 128), 6 * 8 * 130);
        // The last sequence alone gets the same partitions, only renumbered.
        let alone = AttentionWork::new(&seqs[3..], DecodeKernel::Split);
        assert_eq!(alone.split, [0, 0, 0, 1]);
        // Deterministic mode: one-token steps are query tiles of the prefill kernel too.
        let same_order = AttentionWork::new(&seqs, DecodeKernel::Prefill);
        assert!(same_order.split.is_empty() && same_order.decode.is_empty());
        assert_eq!(same_order.prefill, [0, 0, 1, 0, 1, 1, 1, 2, 2, 0, 3, 0]);
    }

    #[test]
    fn the_split_bucket_fills_the_gpu_then_shares_kv_reads() {
        // Llama-3.2-1B: 8 KV heads of 4 query heads each.
        assert_eq!(split_bucket(1, 4, 8), 1);
        assert_eq!(split_bucket(8, 4, 8), 1);
        assert_eq!(split_bucket(16, 4, 8), 2);
        assert_eq!(split_bucket(64, 4, 8), 4);
        // A group of 2 never takes the bucket of 4; a group of 8 takes blocks of 4.
        assert_eq!(split_bucket(1000, 2, 8), 2);
        assert_eq!(split_bucket(1000, 8, 8), 4);
        assert_eq!(split_bucket(1000, 1, 32), 1);
    }

    #[test]
    fn the_audit_states_64_bit_offsets_and_refuses_what_does_not_fit() {
        let layout = |num_blocks| KvLayout {
            num_blocks,
            block_size: 16,
            num_kv_heads: 8,
            head_dim: 128,
        };
        let ok = audit(&layout(140_000), 2).unwrap();
        assert_eq!(ok.largest_byte_offset, 140_000 * 32_768 - 1);
        assert!(ok.largest_byte_offset > 1 << 32);
        assert_eq!(ok.limit, i64::MAX as u64);
        let err = audit(&layout(i32::MAX as u64 + 1), 2).unwrap_err();
        assert!(
            err.contains("paged_attention") && err.contains("i32") && err.contains("2147483648"),
            "{err}"
        );
        let huge = KvLayout {
            num_blocks: i32::MAX as u64,
            block_size: 1 << 30,
            num_kv_heads: 64,
            head_dim: 256,
        };
        let err = audit(&huge, 2).unwrap_err();
        assert!(
            err.contains("kv_write_bf16") && err.contains("long long"),
            "{err}"
        );
    }
}
