//! The disk tier's file: written blocks come back after a reopen, and nothing that fails a
//! check (a flipped byte, a cut file, a misplaced record, another model's or layout's
//! file) is read; offsets past 2^31 and 2^32 bytes land where they should.

use super::file::hex;
use super::format::{RecordHeader, MAX_BLOCK_TOKENS, PAGE};
use super::*;
use peregrine_kernels::cpu::KvLayout;
use peregrine_ops::{KvDtype, KvRows};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::os::unix::fs::FileExt;

const BLOCK_BYTES: u64 = 3 * 4096 + 100;

fn header(fingerprint: u8, slots: u64) -> FileHeader {
    FileHeader {
        version: FORMAT_VERSION,
        fingerprint: [fingerprint; 32],
        block_bytes: BLOCK_BYTES,
        block_tokens: 16,
        slots,
    }
}

fn random_block(rng: &mut ChaCha8Rng, bytes: u64) -> Vec<u8> {
    (0..bytes).map(|_| rng.random()).collect()
}

fn tokens(rng: &mut ChaCha8Rng) -> Vec<u32> {
    (0..16).map(|_| rng.random()).collect()
}

/// Writes a chain of `n` blocks into slots `first..first + n`: (slot, parent, tokens,
/// data, chain) each.
#[allow(clippy::type_complexity)]
fn write_chain(
    disk: &DiskFile,
    rng: &mut ChaCha8Rng,
    first: u64,
    n: u64,
) -> Vec<(u64, ContentHash, Vec<u32>, Vec<u8>, ContentHash)> {
    let mut parent = ROOT_HASH;
    (first..first + n)
        .map(|slot| {
            let t = tokens(rng);
            let data = random_block(rng, disk.header().block_bytes);
            let chain = disk.write(slot, &parent, &t, &data).unwrap();
            let entry = (slot, parent, t, data, chain);
            parent = chain;
            entry
        })
        .collect()
}

#[test]
fn the_chain_hash_is_sha256_over_the_parent_and_the_tokens() {
    // Fixtures from Python's hashlib: sha256(parent + len as <I + each token as <I).
    let first = chain_hash(&ROOT_HASH, &[1, 2, 3, 65536, u32::MAX]);
    assert_eq!(
        hex(&first),
        "196a2be2f3c406861ea5fd78082372ddfa8b9cb686512cdb6e1577e810409fd8"
    );
    assert_eq!(
        hex(&chain_hash(&first, &[7, 8])),
        "1d31aff2eb314141e8909fde22fa83861b138a84e9abea6cbb0690ff5309dc6a"
    );
}

#[test]
fn written_blocks_come_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (disk, found) = DiskFile::open(dir.path(), header(1, 10)).unwrap();
    assert!(found.is_empty());
    let chain = write_chain(&disk, &mut rng, 2, 5);
    for (slot, _, _, data, c) in &chain {
        assert_eq!(&disk.read(*slot, c).unwrap(), data);
    }
    drop(disk);
    let (disk, found) = DiskFile::open(dir.path(), header(1, 10)).unwrap();
    let expected: Vec<FoundBlock> = chain
        .iter()
        .map(|(slot, parent, t, _, c)| FoundBlock {
            slot: *slot,
            chain: *c,
            parent: *parent,
            tokens: t.clone(),
        })
        .collect();
    assert_eq!(found, expected);
    for (slot, _, _, data, c) in &chain {
        assert_eq!(&disk.read(*slot, c).unwrap(), data);
    }
    // A read names the chain it wants: another block's chain is refused.
    assert!(matches!(
        disk.read(2, &chain[1].4),
        Err(ReadError::OtherBlock { slot: 2 })
    ));
    // Erased and never-written slots hold nothing.
    disk.erase(3).unwrap();
    assert!(matches!(
        disk.read(3, &chain[1].4),
        Err(ReadError::NoRecord { slot: 3 })
    ));
    assert!(matches!(
        disk.read(0, &chain[0].4),
        Err(ReadError::NoRecord { slot: 0 })
    ));
    drop(disk);
    let (_, found) = DiskFile::open(dir.path(), header(1, 10)).unwrap();
    assert_eq!(
        found.iter().map(|f| f.slot).collect::<Vec<_>>(),
        [2, 4, 5, 6]
    );
}

#[test]
fn a_flipped_byte_makes_a_block_miss_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (disk, _) = DiskFile::open(dir.path(), header(1, 8)).unwrap();
    let chain = write_chain(&disk, &mut rng, 0, 4);
    let path = disk.path().to_path_buf();
    let stride = disk.header().slot_stride().unwrap();
    drop(disk);
    let raw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let flip = |at: u64| {
        let mut b = [0u8];
        raw.read_exact_at(&mut b, at).unwrap();
        raw.write_all_at(&[b[0] ^ 0x10], at).unwrap();
    };
    // Slot 1: a byte of its data, deep in the block. Slot 2: a token in its record.
    flip(PAGE + stride + PAGE + 2 * 4096 + 17);
    flip(PAGE + 2 * stride + 112 + 4 * 3);
    let (disk, found) = DiskFile::open(dir.path(), header(1, 8)).unwrap();
    // The damaged record is not found; the damaged data is found but never read.
    assert_eq!(found.iter().map(|f| f.slot).collect::<Vec<_>>(), [0, 1, 3]);
    assert!(matches!(
        disk.read(1, &chain[1].4),
        Err(ReadError::Damaged { slot: 1 })
    ));
    assert!(matches!(
        disk.read(2, &chain[2].4),
        Err(ReadError::NoRecord { slot: 2 })
    ));
    assert_eq!(disk.read(0, &chain[0].4).unwrap(), chain[0].3);
    assert_eq!(disk.read(3, &chain[3].4).unwrap(), chain[3].3);
}

#[test]
fn a_file_cut_short_keeps_only_its_whole_slots() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (disk, _) = DiskFile::open(dir.path(), header(1, 8)).unwrap();
    write_chain(&disk, &mut rng, 0, 6);
    let path = disk.path().to_path_buf();
    let at = disk.header().slot_offset(4).unwrap();
    drop(disk);
    // Cut inside slot 4's data.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(at + PAGE + 100)
        .unwrap();
    let (disk, found) = DiskFile::open(dir.path(), header(1, 8)).unwrap();
    assert_eq!(
        found.iter().map(|f| f.slot).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    // The file has its full length again, and the cut slots are written anew.
    let data = random_block(&mut rng, BLOCK_BYTES);
    let c = disk.write(5, &ROOT_HASH, &[9; 16], &data).unwrap();
    assert_eq!(disk.read(5, &c).unwrap(), data);
}

#[test]
fn a_record_copied_into_another_slot_is_not_valid_there() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (disk, _) = DiskFile::open(dir.path(), header(1, 4)).unwrap();
    let chain = write_chain(&disk, &mut rng, 0, 1);
    let path = disk.path().to_path_buf();
    let (from, to) = (
        disk.header().slot_offset(0).unwrap(),
        disk.header().slot_offset(2).unwrap(),
    );
    drop(disk);
    let raw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut slot = vec![0; (PAGE + BLOCK_BYTES) as usize];
    raw.read_exact_at(&mut slot, from).unwrap();
    raw.write_all_at(&slot, to).unwrap();
    let (disk, found) = DiskFile::open(dir.path(), header(1, 4)).unwrap();
    assert_eq!(found.iter().map(|f| f.slot).collect::<Vec<_>>(), [0]);
    assert!(matches!(
        disk.read(2, &chain[0].4),
        Err(ReadError::NoRecord { slot: 2 })
    ));
}

#[test]
fn another_model_layout_or_version_finds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (disk, _) = DiskFile::open(dir.path(), header(1, 8)).unwrap();
    write_chain(&disk, &mut rng, 0, 3);
    drop(disk);
    // Another model: its own file, empty; the first model's file is left alone.
    let (other, found) = DiskFile::open(dir.path(), header(2, 8)).unwrap();
    assert!(found.is_empty());
    drop(other);
    let (disk, found) = DiskFile::open(dir.path(), header(1, 8)).unwrap();
    assert_eq!(found.len(), 3);
    drop(disk);
    // More or fewer slots of the same blocks keep the slots both have.
    let (disk, found) = DiskFile::open(dir.path(), header(1, 2)).unwrap();
    assert_eq!(found.iter().map(|f| f.slot).collect::<Vec<_>>(), [0, 1]);
    drop(disk);
    let (disk, found) = DiskFile::open(dir.path(), header(1, 20)).unwrap();
    assert_eq!(found.iter().map(|f| f.slot).collect::<Vec<_>>(), [0, 1]);
    drop(disk);
    // Another block size or format version: the file starts afresh.
    let mut wider = header(1, 20);
    wider.block_tokens = 32;
    let (disk, found) = DiskFile::open(dir.path(), wider).unwrap();
    assert!(found.is_empty());
    write_chain(&disk, &mut rng, 0, 2);
    drop(disk);
    let mut newer = header(1, 20);
    newer.block_tokens = 32;
    newer.version = FORMAT_VERSION + 1;
    let (_, found) = DiskFile::open(dir.path(), newer).unwrap();
    assert!(found.is_empty());
}

#[test]
fn a_second_process_on_the_same_file_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = DiskFile::open(dir.path(), header(1, 4)).unwrap();
    let Err(err) = DiskFile::open(dir.path(), header(1, 4)) else {
        panic!("a second open of a locked file succeeded");
    };
    assert!(matches!(err, DiskOpenError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("directory of its own"), "{err}");
    // Another model's file in the same directory is its own.
    assert!(DiskFile::open(dir.path(), header(2, 4)).is_ok());
    drop(first);
    assert!(DiskFile::open(dir.path(), header(1, 4)).is_ok());
}

#[test]
fn a_tier_past_a_64_bit_offset_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = DiskFile::open(dir.path(), header(1, u64::MAX / 4096))
        .err()
        .expect("refused");
    assert!(matches!(err, DiskOpenError::TooLarge { .. }), "{err}");
}

#[test]
fn records_reject_what_does_not_fit_or_does_not_chain() {
    let long = RecordHeader {
        slot: 0,
        chain: ROOT_HASH,
        parent: ROOT_HASH,
        tokens: vec![1; MAX_BLOCK_TOKENS + 1],
        data_sum: ROOT_HASH,
    };
    assert!(long.encode().is_err());
    let tokens = vec![5; MAX_BLOCK_TOKENS];
    let mut record = RecordHeader {
        slot: 7,
        chain: chain_hash(&ROOT_HASH, &tokens),
        parent: ROOT_HASH,
        tokens,
        data_sum: [3; 32],
    };
    let page = record.encode().unwrap();
    assert_eq!(page.len() as u64, PAGE);
    assert_eq!(RecordHeader::decode(&page, 7), Some(record.clone()));
    assert_eq!(RecordHeader::decode(&page, 8), None);
    // A chain that is not the hash of its parent and tokens, checksummed or not.
    record.chain = [1; 32];
    assert_eq!(RecordHeader::decode(&record.encode().unwrap(), 7), None);
}

/// Slots whose records and data straddle 2^31 and 2^32 bytes of a sparse file of about
/// 4.4 GB: each is written where its offset says and read back whole after a reopen.
#[test]
fn slots_around_2_31_and_2_32_bytes_land_where_their_offsets_say() {
    let dir = tempfile::tempdir().unwrap();
    let big = FileHeader {
        block_bytes: 1 << 20,
        slots: 4200,
        ..header(7, 0)
    };
    let stride = big.slot_stride().unwrap();
    assert_eq!(stride, (1 << 20) + PAGE);
    assert!(big.file_len().unwrap() > (1 << 32) + stride);
    // The slot whose span holds each boundary, and its neighbours.
    let holding = |boundary: u64| (boundary - PAGE) / stride;
    let mut slots = Vec::new();
    for boundary in [1u64 << 31, 1u64 << 32] {
        let s = holding(boundary);
        let at = big.slot_offset(s).unwrap();
        assert!(at <= boundary && boundary < at + stride, "slot {s} at {at}");
        assert_eq!(
            u128::from(at),
            u128::from(PAGE) + u128::from(s) * u128::from(stride)
        );
        slots.extend([s - 1, s, s + 1]);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let (disk, _) = DiskFile::open(dir.path(), big.clone()).unwrap();
    let mut written = Vec::new();
    for &slot in &slots {
        let t = tokens(&mut rng);
        let data = random_block(&mut rng, 1 << 20);
        let chain = disk.write(slot, &ROOT_HASH, &t, &data).unwrap();
        written.push((slot, chain, data));
    }
    let path = disk.path().to_path_buf();
    drop(disk);
    // The bytes are at the offsets computed independently here.
    let raw = std::fs::File::open(&path).unwrap();
    for (slot, _, data) in &written {
        let mut tail = [0u8; 64];
        raw.read_exact_at(&mut tail, PAGE + slot * stride + PAGE + (1 << 20) - 64)
            .unwrap();
        assert_eq!(&tail[..], &data[data.len() - 64..], "slot {slot}");
    }
    let (disk, found) = DiskFile::open(dir.path(), big).unwrap();
    assert_eq!(found.iter().map(|f| f.slot).collect::<Vec<_>>(), slots);
    for (slot, chain, data) in &written {
        assert_eq!(&disk.read(*slot, chain).unwrap(), data, "slot {slot}");
    }
}

/// A pool's block shape names its file: the CPU's fingerprint is what it always was (a
/// fixture from Python's hashlib, so files written before stay readable), and the same
/// bytes per block on another device, dtype, row kind or layout name another file.
#[test]
fn the_block_shape_and_the_device_name_the_file() {
    let model = [7; 32];
    let cpu = BlockShape {
        device: "cpu",
        dtype: KvDtype::Float32,
        rows: KvRows::KeysAndValues,
        layout: KvLayout {
            num_blocks: 100,
            block_size: 16,
            num_kv_heads: 3,
            head_dim: 64,
        },
        block_bytes: 196_608,
    };
    assert_eq!(
        hex(&block_fingerprint(&model, &cpu)),
        "59830284322441e08b772777ada4185e73b5698847a42d173d43a2d704e7f9fd"
    );
    let more_blocks = BlockShape {
        layout: KvLayout {
            num_blocks: 7,
            ..cpu.layout
        },
        ..cpu
    };
    assert_eq!(
        block_fingerprint(&model, &more_blocks),
        block_fingerprint(&model, &cpu)
    );
    let bf16 = BlockShape {
        dtype: KvDtype::Bfloat16,
        block_bytes: 98_304,
        ..cpu
    };
    let cuda = BlockShape {
        device: "cuda",
        ..bf16
    };
    let latent = BlockShape {
        rows: KvRows::Latent,
        ..cuda
    };
    let wider = BlockShape {
        layout: KvLayout {
            num_kv_heads: 6,
            head_dim: 32,
            ..cpu.layout
        },
        ..cuda
    };
    let mut names: Vec<ContentHash> = [cpu, bf16, cuda, latent, wider]
        .iter()
        .map(|s| block_fingerprint(&model, s))
        .collect();
    names.push(block_fingerprint(&[8; 32], &cuda));
    let distinct: std::collections::HashSet<_> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "two shapes share a file");
}

/// A CPU block shape of `block_bytes` a block, for the queue's tests.
fn small_shape() -> BlockShape {
    BlockShape {
        device: "cpu",
        dtype: KvDtype::Float32,
        rows: KvRows::KeysAndValues,
        layout: KvLayout {
            num_blocks: 8,
            block_size: 16,
            num_kv_heads: 1,
            head_dim: 64,
        },
        block_bytes: 8192,
    }
}

/// Everything the queue hands back until `n` reads are in.
fn finished_reads(queue: &mut DiskQueue, n: usize) -> Vec<FinishedRead> {
    let mut reads = Vec::new();
    while reads.len() < n {
        reads.extend(queue.finished(true));
    }
    assert!(queue.finished(false).is_empty());
    assert_eq!(queue.pending(), 0);
    reads
}

#[test]
fn the_queue_keeps_each_slots_order_hands_back_checked_bytes_and_flushes_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let model = [3; 32];
    let shape = small_shape();
    let (disk, start) = DiskBlocks::open(dir.path(), 1 << 20, &model, &shape).unwrap();
    assert!(start.found.is_empty());
    let mut queue = DiskQueue::start(disk).unwrap();
    assert!(queue.finished(true).is_empty(), "nothing pending: no wait");
    let mut parent = ROOT_HASH;
    let mut written = Vec::new();
    for slot in 0..3u64 {
        let t: std::sync::Arc<[u32]> = tokens(&mut rng).into();
        let data = random_block(&mut rng, shape.block_bytes);
        queue.write(slot, &parent, &t, data.clone());
        parent = chain_hash(&parent, &t);
        written.push((parent, data));
    }
    // Slot 1 read, then written over with another block, then read again: each read sees
    // the slot as the queue's order left it (the read of slot 2 may go ahead of the write).
    queue.read(1, &written[1].0, 40);
    let other: std::sync::Arc<[u32]> = tokens(&mut rng).into();
    let other_data = random_block(&mut rng, shape.block_bytes);
    queue.write(1, &ROOT_HASH, &other, other_data.clone());
    let other_chain = chain_hash(&ROOT_HASH, &other);
    queue.read(1, &other_chain, 41);
    queue.read(2, &written[2].0, 42);
    assert_eq!(queue.pending(), 3);
    let mut reads = finished_reads(&mut queue, 3);
    reads.sort_by_key(|r| r.block);
    let blocks: Vec<u32> = reads.iter().map(|r| r.block).collect();
    assert_eq!(blocks, [40, 41, 42]);
    assert_eq!(reads[0].data.as_deref(), Some(&written[1].1[..]));
    assert_eq!(reads[1].data.as_deref(), Some(&other_data[..]));
    assert_eq!(reads[2].data.as_deref(), Some(&written[2].1[..]));
    // The writes queued last are on disk once the queue is dropped.
    queue.write(5, &written[2].0, &other, other_data.clone());
    drop(queue);
    let (disk, start) = DiskBlocks::open(dir.path(), 1 << 20, &model, &shape).unwrap();
    let mut slots: Vec<u64> = start.found.iter().map(|f| f.slot).collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2, 5]);
    // A flipped byte: the read comes back empty, reported to the allocator.
    let path = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "blocks"))
        .unwrap();
    drop(disk);
    let stride = FileHeader {
        block_bytes: shape.block_bytes,
        ..header(0, 1)
    }
    .slot_stride()
    .unwrap();
    let raw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let at = PAGE + 2 * stride + PAGE + 100;
    let mut b = [0u8];
    raw.read_exact_at(&mut b, at).unwrap();
    let (disk, start) = DiskBlocks::open(dir.path(), 1 << 20, &model, &shape).unwrap();
    let mut queue = DiskQueue::start(disk).unwrap();
    raw.write_all_at(&[b[0] ^ 0x01], at).unwrap();
    queue.read(2, &written[2].0, 7);
    queue.read(0, &written[0].0, 8);
    let mut reads = finished_reads(&mut queue, 2);
    reads.sort_by_key(|r| r.block);
    assert!(
        reads[0].data.is_none(),
        "a damaged block is never handed out"
    );
    assert_eq!(reads[1].data.as_deref(), Some(&written[0].1[..]));
    assert_eq!(start.failed.take(), [FailedRead { slot: 2, block: 7 }]);
}
