//! A seeded random scheduler drives many steps of admit / grow / free / computed. After
//! each step the invariants hold, every grant keeps its promises, and every prefix hit
//! serves blocks whose (simulated) KV content is exactly the sequence's tokens, also when
//! blocks went down to a host tier or to disk and came back (their copies made as a backend
//! would), and after a restart over the disk tier's blocks.

use super::{step, BlockManager};
use crate::kv_disk::{chain_hash, FoundBlock};
use crate::messages::{
    AdmitSeq, AllocateStep, ComputedSeq, GrowSeq, KvMove, KvSource, KvUsage, RequestId, StepGrant,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

const BLOCK: usize = 4;
const POOL: u32 = 48;

/// A sequence as the simulated scheduler sees it.
struct Seq {
    id: RequestId,
    tokens: Vec<u32>,
    num_computed: usize,
    table: Vec<u32>,
}

/// What one block's slots hold: per slot, the whole prefix that produced it.
type Block = Vec<Option<Vec<u32>>>;

/// What a disk slot holds: its record (as `kv_disk` writes it) and the block.
type DiskSlot = Option<(FoundBlock, Block)>;

/// The simulated KV cache, host tier and disk tier. A slot's real content depends on every
/// token up to it (through attention), so each slot holds the whole prefix that produced
/// it.
struct Kv(Vec<Block>, Vec<Block>, Vec<DiskSlot>);

impl Kv {
    fn new(host_slots: u32, disk_slots: u64) -> Kv {
        Kv(
            vec![vec![None; BLOCK]; POOL as usize],
            vec![vec![None; BLOCK]; host_slots as usize],
            vec![None; disk_slots as usize],
        )
    }

    /// Makes a grant's copies, in order, as the backend does before the next forward; a
    /// disk read checks the record names the chain asked for, as the file does.
    fn apply(&mut self, moves: &[KvMove]) {
        for m in moves {
            match m {
                KvMove::Spill { block, slot } => {
                    self.1[*slot as usize] = self.0[*block as usize].clone()
                }
                KvMove::Load { slot, block } => {
                    self.0[*block as usize] = self.1[*slot as usize].clone()
                }
                KvMove::DiskWrite {
                    from,
                    slot,
                    parent,
                    tokens,
                } => {
                    let data = match *from {
                        KvSource::Pool(b) => self.0[b as usize].clone(),
                        KvSource::Host(h) => self.1[h as usize].clone(),
                    };
                    let record = FoundBlock {
                        slot: *slot,
                        chain: chain_hash(parent, tokens),
                        parent: *parent,
                        tokens: tokens.to_vec(),
                    };
                    self.2[*slot as usize] = Some((record, data));
                }
                KvMove::DiskRead { slot, chain, block } => {
                    let (record, data) = self.2[*slot as usize].as_ref().expect("a written slot");
                    assert_eq!(&record.chain, chain, "a disk read of another block");
                    self.0[*block as usize] = data.clone();
                }
            }
        }
    }

    /// A restart: memory is gone, the disk's records are what the file's scan finds.
    fn restart(&mut self) -> Vec<FoundBlock> {
        for b in self.0.iter_mut().chain(self.1.iter_mut()) {
            *b = vec![None; BLOCK];
        }
        self.2.iter().flatten().map(|(r, _)| r.clone()).collect()
    }

    /// Writes `seq`'s tokens `from..to` through its block table, checking that no other
    /// sequence shares a block written to.
    fn write(&mut self, m: &BlockManager, seq: &Seq, from: usize, to: usize) {
        for pos in from..to {
            let block = seq.table[pos / BLOCK];
            assert_eq!(m.ref_count(block), Some(1), "a write into a shared block");
            self.0[block as usize][pos % BLOCK] = Some(seq.tokens[..=pos].to_vec());
        }
    }

    /// Forgets what fresh blocks held, so a stale hit shows up as a mismatch.
    fn clear(&mut self, blocks: &[u32]) {
        for &b in blocks {
            self.0[b as usize] = vec![None; BLOCK];
        }
    }

    /// Whether the first `n` slots of `seq` hold exactly its first `n` tokens' KV.
    fn holds(&self, seq: &Seq, n: usize) -> bool {
        (0..n).all(|pos| {
            self.0[seq.table[pos / BLOCK] as usize][pos % BLOCK].as_deref()
                == Some(&seq.tokens[..=pos])
        })
    }
}

fn random_prompt(rng: &mut ChaCha8Rng, stems: &[Vec<u32>]) -> Vec<u32> {
    let stem = &stems[rng.random_range(0..stems.len())];
    let keep = rng.random_range(0..=stem.len());
    let extra = rng.random_range(1..12);
    let mut prompt = stem[..keep].to_vec();
    prompt.extend((0..extra).map(|_| rng.random_range(0..3)));
    prompt
}

/// Checks what `grant` promises about the step it answers.
fn check_grant(m: &BlockManager, step: &AllocateStep, grant: &StepGrant) {
    let mut answered: Vec<RequestId> = grant.grown.iter().map(|(id, _)| *id).collect();
    answered.extend(&grant.preempted);
    answered.sort_unstable();
    let mut asked: Vec<RequestId> = step.grow.iter().map(|g| g.id).collect();
    asked.sort_unstable();
    assert_eq!(
        answered, asked,
        "every growing sequence is grown or preempted"
    );
    for (g, (id, table)) in step
        .grow
        .iter()
        .filter(|g| !grant.preempted.contains(&g.id))
        .zip(&grant.grown)
    {
        assert_eq!(g.id, *id, "grown in grow order");
        assert!(table.len() >= g.tokens_after_step.div_ceil(BLOCK));
    }
    for id in &grant.preempted {
        assert_eq!(
            m.block_table(*id),
            None,
            "a preempted sequence holds nothing"
        );
    }
    let mut scheduled = 0;
    for (a, s) in grant.admitted.iter().zip(&step.admit) {
        assert_eq!(a.id, s.id, "admitted in admit order");
        assert_eq!(a.num_cached % BLOCK, 0);
        assert!(a.num_cached < s.tokens.len().max(1), "never the last token");
        assert!(a.num_cached + a.num_scheduled <= s.tokens.len());
        assert_eq!(
            a.block_table.len(),
            (a.num_cached + a.num_scheduled).div_ceil(BLOCK)
        );
        scheduled += a.num_scheduled;
    }
    assert!(scheduled <= step.token_budget);
    assert_eq!(grant.usage.used_blocks, POOL as usize - m.num_free_blocks());
}

/// Tiers below the pool: host slots, disk slots, and the step a restart comes at (after
/// which the manager is built anew over what the disk holds).
#[derive(Clone, Copy)]
struct Tiers {
    host: u32,
    disk: u64,
    restart_at: Option<usize>,
}

fn host_only(host: u32) -> Tiers {
    Tiers {
        host,
        disk: 0,
        restart_at: None,
    }
}

fn manager(prefix_caching: bool, tiers: Tiers, found: &[FoundBlock]) -> BlockManager {
    BlockManager::new(POOL, BLOCK, prefix_caching)
        .with_host_tier(tiers.host)
        .with_disk_tier(tiers.disk, found)
}

fn run(seed: u64, prefix_caching: bool, tiers: Tiers) -> (KvUsage, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut m = manager(prefix_caching, tiers, &[]);
    let mut kv = Kv::new(tiers.host, tiers.disk);
    // Usage before a restart, which starts the counts again.
    let mut before = KvUsage::default();
    let stems: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..rng.random_range(8..40))
                .map(|_| rng.random_range(0..3))
                .collect()
        })
        .collect();
    let mut waiting: Vec<Seq> = Vec::new();
    let mut running: Vec<Seq> = Vec::new();
    let mut next_id = 0;
    let mut preemptions = 0;
    for step_no in 0..400 {
        if tiers.restart_at == Some(step_no) {
            before = m.usage();
            let found = kv.restart();
            m = manager(prefix_caching, tiers, &found);
            m.check_invariants().unwrap();
            assert_eq!(m.usage().disk_blocks, found.len());
            for mut s in running.drain(..).rev() {
                s.num_computed = 0;
                s.table.clear();
                waiting.insert(0, s);
            }
        }
        for _ in 0..rng.random_range(0..2) {
            next_id += 1;
            let tokens = random_prompt(&mut rng, &stems);
            waiting.push(Seq {
                id: RequestId(next_id),
                tokens,
                num_computed: 0,
                table: Vec::new(),
            });
        }
        let mut msg = AllocateStep {
            token_budget: rng.random_range(0..48),
            ..AllocateStep::default()
        };
        msg.computed = running
            .iter()
            .filter(|_| rng.random_bool(0.8))
            .map(|s| ComputedSeq {
                id: s.id,
                first_block: 0,
                tokens: s.tokens[..s.num_computed].to_vec(),
            })
            .collect();
        let mut i = 0;
        while i < running.len() {
            if rng.random_bool(0.1) {
                msg.free.push(running.remove(i).id);
            } else {
                i += 1;
            }
        }
        msg.grow = running
            .iter()
            .map(|s| {
                let left = s.tokens.len() - s.num_computed;
                GrowSeq {
                    id: s.id,
                    tokens_after_step: s.num_computed + rng.random_range(1..=left.min(6)),
                }
            })
            .collect();
        msg.admit = waiting
            .iter()
            .take(4)
            .map(|s| AdmitSeq {
                id: s.id,
                tokens: Arc::from(&s.tokens[..]),
                scores_prompt: false,
            })
            .collect();

        let grant = step(&mut m, msg.clone());
        check_grant(&m, &msg, &grant);
        kv.apply(&grant.moves);

        for a in &grant.admitted {
            let mut s = waiting.remove(0);
            assert_eq!(s.id, a.id);
            s.table = a.block_table.clone();
            kv.clear(&s.table[a.num_cached / BLOCK..]);
            assert!(
                kv.holds(&s, a.num_cached),
                "a prefix hit served blocks holding other tokens"
            );
            kv.write(&m, &s, a.num_cached, a.num_cached + a.num_scheduled);
            s.num_computed = a.num_cached + a.num_scheduled;
            running.push(s);
        }
        for (g, (_, table)) in msg
            .grow
            .iter()
            .filter(|g| !grant.preempted.contains(&g.id))
            .zip(&grant.grown)
        {
            let Some(s) = running.iter_mut().find(|s| s.id == g.id) else {
                continue;
            };
            kv.clear(&table[s.table.len()..]);
            s.table = table.clone();
            kv.write(&m, s, s.num_computed, g.tokens_after_step);
            s.num_computed = g.tokens_after_step;
        }
        preemptions += grant.preempted.len();
        for id in &grant.preempted {
            if let Some(pos) = running.iter().position(|s| s.id == *id) {
                let mut s = running.remove(pos);
                s.num_computed = 0;
                s.table.clear();
                waiting.insert(0, s);
            }
        }
        // A sequence that computed all it holds samples its next token.
        for s in &mut running {
            if s.num_computed == s.tokens.len() {
                s.tokens.push(rng.random_range(0..3));
            }
        }
    }
    eprintln!(
        "seed {seed}: {:?} preemptions {preemptions} ids {next_id} running {} waiting {}",
        m.usage(),
        running.len(),
        waiting.len()
    );
    let mut usage = m.usage();
    usage.prefix_hits += before.prefix_hits;
    usage.disk_written += before.disk_written;
    usage.disk_read += before.disk_read;
    usage.disk_dropped += before.disk_dropped;
    (usage, preemptions)
}

#[test]
fn random_steps_keep_the_invariants_and_serve_correct_prefixes() {
    let mut hits = 0;
    let mut preemptions = 0;
    for seed in 0..12 {
        let (usage, p) = run(0xb10c_0000 + seed, true, host_only(0));
        assert_eq!(usage.host_spilled, 0);
        hits += usage.prefix_hits;
        preemptions += p;
    }
    assert!(hits > 0, "the workload exercised the prefix cache");
    assert!(preemptions > 0, "the workload exercised preemption");
}

#[test]
fn random_steps_without_prefix_caching_never_hit() {
    for seed in 0..4 {
        let tiers = Tiers {
            host: 16,
            disk: 16,
            restart_at: None,
        };
        let (usage, _) = run(0xcafe_0000 + seed, false, tiers);
        assert_eq!(usage.prefix_hits, 0);
        assert_eq!(
            usage.host_spilled + usage.host_loaded + usage.disk_written + usage.disk_read,
            0,
            "no tier without a cache"
        );
    }
}

#[test]
fn random_steps_through_a_host_tier_keep_the_accounting_and_serve_correct_prefixes() {
    // Tiers of 6 to 96 blocks under a pool of 48: full tiers drop leaves, large ones keep
    // every chain; the invariants (every slot free, given up or held once; leaves exactly
    // the entries nothing continues) are checked after every step.
    let (mut spilled, mut loaded, mut dropped, mut hits) = (0, 0, 0, 0);
    for (seed, slots) in (0..12).zip([6, 12, 24, 48, 96, 7].iter().cycle()) {
        let (usage, _) = run(0x7e1e_0000 + seed, true, host_only(*slots));
        assert!(usage.host_blocks <= *slots as usize);
        spilled += usage.host_spilled;
        loaded += usage.host_loaded;
        dropped += usage.host_dropped;
        hits += usage.prefix_hits;
    }
    eprintln!("spilled {spilled} loaded {loaded} dropped {dropped} hits {hits}");
    assert!(
        spilled > 100 && loaded > 20 && dropped > 20,
        "the tier was exercised"
    );
}

#[test]
fn random_steps_through_a_disk_tier_and_a_restart_serve_correct_prefixes() {
    // Disk tiers of 5 to 200 blocks, under host tiers of 0 to 24 (entries leave memory from
    // the pool or from the host tier), with a restart halfway through every other run: the
    // invariants hold after every step, and every hit, from disk too, serves exactly its
    // tokens' KV.
    let (mut written, mut read, mut dropped, mut hits) = (0, 0, 0, 0);
    let shapes = [(0, 5), (0, 40), (6, 24), (12, 200), (24, 8), (0, 200)];
    for (seed, (host, disk)) in (0..12).zip(shapes.iter().cycle()) {
        let tiers = Tiers {
            host: *host,
            disk: *disk,
            restart_at: (seed % 2 == 1).then_some(200),
        };
        let (usage, _) = run(0xd15c_0000 + seed, true, tiers);
        assert!(usage.disk_blocks <= *disk as usize);
        written += usage.disk_written;
        read += usage.disk_read;
        dropped += usage.disk_dropped;
        hits += usage.prefix_hits;
    }
    eprintln!("written {written} read {read} dropped {dropped} hits {hits}");
    assert!(
        written > 100 && read > 20 && dropped > 20,
        "the tier was exercised"
    );
}
