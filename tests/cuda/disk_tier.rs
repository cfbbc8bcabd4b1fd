//! The disk tier below the GPU pool, through the backend: a prompt's blocks written to the
//! model's file from the pool and from a host slot (one at a byte offset past 2^32 of a
//! sparse file) hold the same bytes, come back into other blocks (overwritten first) and
//! give the logits the prompt computed cold gives (deterministic mode), again after a
//! restart; a flipped byte makes its block fail, reported and never copied; a CPU pool
//! over the same directory finds none of the GPU's blocks. Disk reads and writes go through
//! the tier's thread, in order: the reads come back from `finish_loads`.

use crate::common::tiny_model::{TinyModel, TinySpec};
use crate::engine::tiny_settings;
use crate::host_tier::last_logits;
use crate::model::gpu_sized;
use crate::setup;
use peregrine_actors::backend::{cpu_backend_with, cuda_backend, Loaded, ModelBackend};
use peregrine_actors::kv_disk::format::PAGE;
use peregrine_actors::kv_disk::{chain_hash, model_fingerprint, FailedRead, FileHeader, ROOT_HASH};
use peregrine_actors::messages::{KvMove, KvSource, LoadDone};
use peregrine_models::LlamaModel;
use peregrine_ops::KvDtype;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The one block file in `dir`.
fn blocks_file(dir: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "blocks"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.remove(0)
}

/// Where slot `slot`'s data starts in `file`, from its header.
fn data_offset(file: &Path, slot: u64) -> u64 {
    let mut page = vec![0; PAGE as usize];
    std::fs::File::open(file)
        .unwrap()
        .read_exact_at(&mut page, 0)
        .unwrap();
    let header = FileHeader::decode(&page).unwrap();
    header.slot_offset(slot).unwrap() + PAGE
}

/// Slot `slot`'s `bytes` bytes of data in `file`.
fn slot_data(file: &Path, slot: u64, bytes: u64) -> Vec<u8> {
    let mut data = vec![0; bytes as usize];
    std::fs::File::open(file)
        .unwrap()
        .read_exact_at(&mut data, data_offset(file, slot))
        .unwrap();
    data
}

/// Makes `moves` and waits for their disk reads; the reports in the order of the moves.
fn read_in(gpu: &mut Box<dyn ModelBackend>, moves: &[KvMove]) -> Vec<LoadDone> {
    gpu.move_kv(moves).unwrap();
    let blocks: Vec<u32> = moves
        .iter()
        .filter_map(|m| match m {
            KvMove::DiskRead { block, .. } => Some(*block),
            _ => None,
        })
        .collect();
    let mut done = Vec::new();
    while done.len() < blocks.len() {
        done.extend(gpu.finish_loads(true).unwrap());
    }
    let in_order: Vec<LoadDone> = blocks
        .iter()
        .map(|b| {
            *done
                .iter()
                .find(|r| r.block == *b)
                .expect("each read reported")
        })
        .collect();
    assert_eq!(done.len(), in_order.len());
    in_order
}

/// The cuda backend of the model in `dir`, deterministic.
fn backend(dir: &Path) -> Box<dyn ModelBackend> {
    let Loaded { target, .. } = cuda_backend(dir, &tiny_settings(true)).unwrap();
    target
}

/// Bytes of one block of `backend`'s pool over every layer.
fn block_bytes(backend: &dyn ModelBackend) -> u64 {
    let pool = backend.pool();
    pool.bytes_per_layer / pool.layout.num_blocks * backend.config().num_layers as u64
}

#[test]
fn prefix_blocks_come_back_from_disk_unchanged_and_damage_is_never_copied() {
    if setup().is_none() {
        return;
    }
    let model_dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 37).write_hf(model_dir.path());
    let kv_dir = tempfile::tempdir().unwrap();
    let model = model_fingerprint(model_dir.path()).unwrap();
    let mut gpu = backend(model_dir.path());
    let bytes = block_bytes(gpu.as_ref());
    assert_eq!(gpu.keep_host_tier(2 * bytes).unwrap(), 2);
    // A sparse file whose last slot's data starts past 2^32 bytes.
    let stride = bytes.next_multiple_of(PAGE) + PAGE;
    let far_slot = (1u64 << 32) / stride + 1;
    gpu.keep_disk_tier(kv_dir.path(), (far_slot + 1) * stride, &model)
        .unwrap();
    let start = gpu.take_disk_tier().unwrap();
    assert_eq!(start.slots, far_slot + 1);
    assert!(start.found.is_empty());
    let file = blocks_file(kv_dir.path());
    assert!(data_offset(&file, far_slot) > 1 << 32);
    let num_blocks = gpu.pool().layout.num_blocks as u32;
    // The last block is the graphs' scratch block.
    let far = if num_blocks > 65_540 {
        65_535
    } else {
        num_blocks - 4
    };
    eprintln!("pool of {num_blocks} blocks, {bytes} bytes a block; slot {far_slot} past 2^32");

    let prompt: Vec<u32> = (0..32).map(|i| (i * 41 + 3) % 1000).collect();
    let rest: Vec<u32> = vec![8, 700, 31, 256, 99];
    let whole: Vec<u32> = prompt.iter().chain(&rest).copied().collect();
    let (first, second): (Arc<[u32]>, Arc<[u32]>) = (prompt[..16].into(), prompt[16..].into());
    let chain0 = chain_hash(&ROOT_HASH, &first);
    let chain1 = chain_hash(&chain0, &second);
    let write = |from, slot, parent, tokens: &Arc<[u32]>| KvMove::DiskWrite {
        from,
        slot,
        parent,
        tokens: tokens.clone(),
    };
    let cold = last_logits(&mut gpu, &whole, 0, &[10, 11, 12]);
    // The prompt in blocks 0 and 1: block 0 to slot 0 from the pool, block 1 to slot 1
    // from the pool and to the far slot through host slot 1.
    last_logits(&mut gpu, &prompt, 0, &[0, 1]);
    gpu.move_kv(&[
        write(KvSource::Pool(0), 0, ROOT_HASH, &first),
        KvMove::Spill { block: 1, slot: 1 },
        write(KvSource::Host(1), far_slot, chain0, &second),
        write(KvSource::Pool(1), 1, chain0, &second),
    ])
    .unwrap();
    // A read of a slot queued after its write comes back once the write is made.
    let flushed = read_in(
        &mut gpu,
        &[
            KvMove::DiskRead {
                slot: 1,
                chain: chain1,
                block: 47,
            },
            KvMove::DiskRead {
                slot: far_slot,
                chain: chain1,
                block: 48,
            },
        ],
    );
    assert!(flushed.iter().all(|r| r.ok), "{flushed:?}");
    let second_bytes = slot_data(&file, 1, bytes);
    assert!(second_bytes.iter().any(|&b| b != 0), "slot 1 holds zeros");
    assert!(
        slot_data(&file, far_slot, bytes) == second_bytes,
        "the host slot's copy of block 1 differs from the pool's"
    );
    // Blocks 0 and 1, and the blocks loaded into, overwritten by another prompt first.
    let other: Vec<u32> = (0..32).map(|i| (i * 59 + 5) % 1000).collect();
    last_logits(&mut gpu, &other, 0, &[0, 1]);
    last_logits(&mut gpu, &other, 0, &[far, far + 1]);
    let done = read_in(
        &mut gpu,
        &[
            KvMove::DiskRead {
                slot: 0,
                chain: chain0,
                block: far,
            },
            KvMove::DiskRead {
                slot: far_slot,
                chain: chain1,
                block: far + 1,
            },
        ],
    );
    assert!(done.iter().all(|r| r.ok), "{done:?}");
    let warm = last_logits(&mut gpu, &rest, 32, &[far, far + 1, 20]);
    assert!(
        warm.iter()
            .zip(&cold)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the prompt's blocks from disk gave other logits than the prompt cold"
    );
    // Block far + 1, read from disk, written to disk again: the same bytes.
    gpu.move_kv(&[write(KvSource::Pool(far + 1), 2, chain0, &second)])
        .unwrap();
    let flushed = read_in(
        &mut gpu,
        &[KvMove::DiskRead {
            slot: 2,
            chain: chain1,
            block: 47,
        }],
    );
    assert_eq!(
        flushed,
        [LoadDone {
            block: 47,
            ok: true
        }]
    );
    assert!(
        slot_data(&file, 2, bytes) == second_bytes,
        "a round trip changed block 1"
    );

    // A flipped byte in slot 1's data: the read fails, is reported, copies nothing into
    // its block (which holds the other prompt's second block), and the record is gone.
    let at = data_offset(&file, 1) + bytes / 2;
    let raw = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    raw.write_all_at(&[second_bytes[(bytes / 2) as usize] ^ 0x10], at)
        .unwrap();
    let other_rest: Vec<u32> = vec![3, 4, 5];
    last_logits(&mut gpu, &other, 0, &[30, 31]);
    let before = last_logits(&mut gpu, &other_rest, 32, &[30, 31, 41]);
    let read_1 = KvMove::DiskRead {
        slot: 1,
        chain: chain1,
        block: 31,
    };
    let failed = read_in(&mut gpu, std::slice::from_ref(&read_1));
    assert_eq!(
        failed,
        [LoadDone {
            block: 31,
            ok: false
        }]
    );
    assert_eq!(start.failed.take(), vec![FailedRead { slot: 1, block: 31 }]);
    let after = last_logits(&mut gpu, &other_rest, 32, &[30, 31, 41]);
    assert!(
        after
            .iter()
            .zip(&before)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "a damaged block was copied into the pool"
    );
    // Its record is gone: read again, it fails again.
    let failed = read_in(&mut gpu, &[read_1]);
    assert_eq!(
        failed,
        [LoadDone {
            block: 31,
            ok: false
        }]
    );
    drop(gpu);

    // A restart finds the blocks that pass their checks, and they serve the prompt.
    let mut gpu = backend(model_dir.path());
    gpu.keep_disk_tier(kv_dir.path(), (far_slot + 1) * stride, &model)
        .unwrap();
    let start = gpu.take_disk_tier().unwrap();
    let mut found: Vec<u64> = start.found.iter().map(|f| f.slot).collect();
    found.sort_unstable();
    assert_eq!(found, vec![0, 2, far_slot]);
    last_logits(&mut gpu, &other, 0, &[5, 6]);
    let done = read_in(
        &mut gpu,
        &[
            KvMove::DiskRead {
                slot: 0,
                chain: chain0,
                block: 5,
            },
            KvMove::DiskRead {
                slot: 2,
                chain: chain1,
                block: 6,
            },
        ],
    );
    assert!(done.iter().all(|r| r.ok), "{done:?}");
    let restarted = last_logits(&mut gpu, &rest, 32, &[5, 6, 20]);
    assert!(
        restarted
            .iter()
            .zip(&cold)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the prompt's blocks from disk after a restart gave other logits than cold"
    );
    drop(gpu);

    // A CPU pool of bf16 blocks of the same bytes keeps a file of its own.
    let cpu_model = LlamaModel::load(model_dir.path()).unwrap();
    let mut cpu = cpu_backend_with(cpu_model, 64 * bytes, 16, KvDtype::Bfloat16).unwrap();
    assert_eq!(block_bytes(cpu.as_ref()), bytes);
    cpu.keep_disk_tier(kv_dir.path(), 8 * stride, &model)
        .unwrap();
    assert!(cpu.take_disk_tier().unwrap().found.is_empty());
}
