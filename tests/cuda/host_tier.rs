//! The host tier below the GPU pool: a block's keys and values of every layer gathered and
//! scattered exactly where ids and byte offsets bite, and through the backend, a prompt's
//! blocks spilled to page-locked host memory, overwritten in the pool and loaded into other
//! blocks (on the tier's own stream, reported before they are read) give the logits the
//! prompt computed cold gives (deterministic mode).

use crate::common::tiny_model::{TinyModel, TinySpec};
use crate::engine::tiny_settings;
use crate::model::gpu_sized;
use crate::{random_f32, rng, setup, to_bf16};
use half::bf16;
use peregrine_actors::backend::{
    cuda_backend, Loaded, ModelBackend, StepInput, StepSource, Wanted,
};
use peregrine_actors::messages::{KvMove, LoadDone};
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::kv_blocks::BlockCopy;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::{AttentionPlan, SeqSpec};

/// Blocks 65,535 and 65,536 of a pool whose block 65,536 starts at byte 2^31 of each
/// layer's K and V (32 KiB a block, 70,000 blocks, two layers: 9.2 GB) are gathered into a
/// staging buffer in one launch and scattered into blocks 3 and 69,999 exactly, their
/// neighbours untouched.
#[test]
fn blocks_gather_and_scatter_exactly_around_2_31_bytes() {
    let Some(s) = setup() else { return };
    let mut rng = rng("blocks_gather_and_scatter_exactly_around_2_31_bytes");
    let layout = KvLayout {
        num_blocks: 70_000,
        block_size: 16,
        num_kv_heads: 8,
        head_dim: 128,
    };
    let block = (layout.block_size * layout.slot_elems()) as usize;
    assert_eq!(65_536 * block as u64 * 2, 1 << 31);
    let mut cache = GpuKvCache::new(&s.gpu, 2, layout).unwrap();
    assert_eq!(cache.block_elems(), 4 * block);
    let stream = s.gpu.stream();
    // Fresh random rows in the two blocks of each layer's K and V, and a poison in the
    // blocks around the targets.
    let mut written = Vec::new();
    for layer in 0..2 {
        let (k, v) = cache.layer_mut(layer);
        for part in [k, v] {
            for id in [65_535usize, 65_536] {
                let rows = to_bf16(&random_f32(&mut rng, block, 1.0));
                stream
                    .memcpy_htod(&rows, &mut part.slice_mut(id * block..(id + 1) * block))
                    .unwrap();
                written.push(rows);
            }
            let poison = vec![bf16::from_bits(0x7fc1); block];
            for id in [2usize, 3, 4, 69_998, 69_999] {
                stream
                    .memcpy_htod(&poison, &mut part.slice_mut(id * block..(id + 1) * block))
                    .unwrap();
            }
        }
    }
    // Both blocks in one gather, then scattered together into blocks 3 and 69,999.
    let mut staging = s.gpu.zeros::<bf16>(2 * cache.block_elems()).unwrap();
    let (from, to) = ([65_535u32, 65_536], [3u32, 69_999]);
    let ids = s.gpu.upload(&from).unwrap();
    cache
        .copy_blocks(
            &s.kernels,
            stream,
            BlockCopy::Gather,
            &ids.as_view(),
            &from,
            &mut staging,
        )
        .unwrap();
    let gathered = s.gpu.download(&staging).unwrap();
    for i in 0..2 {
        // Entry i, layer by layer, K then V: written[(layer * 2 + part) * 2 + i].
        for part in 0..4 {
            let at = (i * 4 + part) * block;
            let want = &written[part * 2 + i];
            assert!(
                gathered[at..at + block]
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "block {}: part {part} gathered wrong",
                from[i]
            );
        }
    }
    let ids = s.gpu.upload(&to).unwrap();
    cache
        .copy_blocks(
            &s.kernels,
            stream,
            BlockCopy::Scatter,
            &ids.as_view(),
            &to,
            &mut staging,
        )
        .unwrap();
    for (i, &to) in to.iter().enumerate() {
        let to = to as usize;
        for layer in 0..2 {
            let (k, v) = cache.layer(layer);
            for (p, part) in [k, v].into_iter().enumerate() {
                let got = s
                    .gpu
                    .download(&part.slice(to * block..(to + 1) * block))
                    .unwrap();
                let want = &written[(layer * 2 + p) * 2 + i];
                assert!(
                    got.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "block {to} of layer {layer}: scattered wrong"
                );
                for id in [to - 1, to + 1].into_iter().filter(|&id| id < 70_000) {
                    let near = s
                        .gpu
                        .download(&part.slice(id * block..(id + 1) * block))
                        .unwrap();
                    assert!(
                        near.iter().all(|x| x.to_bits() == 0x7fc1),
                        "block {id} of layer {layer} changed beside block {to}"
                    );
                }
            }
        }
    }
}

/// The logits of the last of `tokens`, one sequence of blocks of 16 tokens whose first
/// `cached` tokens are in the pool's blocks `table`.
pub fn last_logits(
    backend: &mut Box<dyn ModelBackend>,
    tokens: &[u32],
    cached: usize,
    table: &[u32],
) -> Vec<f32> {
    let spec = SeqSpec {
        num_cached: cached,
        num_new: tokens.len(),
        block_table: table,
    };
    let plan = AttentionPlan::new(&[spec], 16, backend.pool().layout.num_blocks).unwrap();
    let rows = [tokens.len() - 1];
    let input = StepInput {
        source: StepSource::Fresh {
            tokens,
            plan: &plan,
            logit_rows: &rows,
        },
        wanted: Wanted::Logits,
    };
    backend.run(input).unwrap().logits().unwrap()
}

/// A 32-token prompt's two blocks spilled to host slots through the backend, its pool
/// blocks then overwritten by another prompt, loaded back into other blocks (ids past
/// 65,535 where the pool has them) by a call that then spills into one of the slots it
/// read, and continued by five tokens: the last row's logits equal those of the 37 tokens
/// computed cold, to the bit.
#[test]
fn prefix_blocks_come_back_from_host_memory_unchanged() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 31).write_hf(dir.path());
    let settings = tiny_settings(true);
    let Loaded {
        target: mut backend,
        ..
    } = cuda_backend(dir.path(), &settings).unwrap();
    let num_blocks = backend.pool().layout.num_blocks as u32;
    let block_bytes = backend.pool().bytes_per_layer / u64::from(num_blocks)
        * u64::from(backend.config().num_layers as u32);
    assert_eq!(backend.keep_host_tier(4 * block_bytes).unwrap(), 4);
    assert_eq!(backend.host_tier_slots(), 4);
    // The last block is the graphs' scratch block.
    let far = if num_blocks > 65_540 {
        65_535
    } else {
        num_blocks - 4
    };
    eprintln!(
        "pool of {num_blocks} blocks; loading into {far} and {}",
        far + 1
    );

    let prompt: Vec<u32> = (0..32).map(|i| (i * 37 + 11) % 1000).collect();
    let rest: Vec<u32> = vec![5, 901, 17, 333, 42];
    let whole: Vec<u32> = prompt.iter().chain(&rest).copied().collect();
    let cold = last_logits(&mut backend, &whole, 0, &[10, 11, 12]);
    // The prompt in blocks 0 and 1, spilled to slots 2 and 0.
    last_logits(&mut backend, &prompt, 0, &[0, 1]);
    let spill = [
        KvMove::Spill { block: 0, slot: 2 },
        KvMove::Spill { block: 1, slot: 0 },
    ];
    backend.move_kv(&spill).unwrap();
    // Another prompt over blocks 0 and 1, and the blocks loaded into first.
    let other: Vec<u32> = (0..32).map(|i| (i * 53 + 7) % 1000).collect();
    last_logits(&mut backend, &other, 0, &[0, 1]);
    last_logits(&mut backend, &other, 0, &[far, far + 1]);
    // The slot loaded first is spilled into again by the same call, after the load.
    let load = [
        KvMove::Load {
            slot: 2,
            block: far,
        },
        KvMove::Load {
            slot: 0,
            block: far + 1,
        },
        KvMove::Spill { block: 0, slot: 2 },
    ];
    backend.move_kv(&load).unwrap();
    // The loads run on the host tier's own stream: the blocks are used once reported (the
    // spill into slot 2 waited for the load that reads it).
    let mut loaded = Vec::new();
    while loaded.len() < 2 {
        loaded.extend(backend.finish_loads(true).unwrap());
    }
    let ok = |block| LoadDone { block, ok: true };
    assert_eq!(loaded, [ok(far), ok(far + 1)]);
    assert!(backend.finish_loads(true).unwrap().is_empty());
    let warm = last_logits(&mut backend, &rest, 32, &[far, far + 1, 20]);
    assert!(
        warm.iter()
            .zip(&cold)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the prompt's blocks from host memory gave other logits than the prompt cold"
    );
    // A slot never spilled into is refused, not read.
    let err = backend
        .move_kv(&[KvMove::Load { slot: 3, block: 30 }])
        .unwrap_err();
    assert!(err.to_string().contains("host slot 3"), "{err}");
}
