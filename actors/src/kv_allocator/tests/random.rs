//! A seeded random scheduler drives many steps of admit / grow / free / computed. After
//! each step the invariants hold, every grant keeps its promises, and every prefix hit
//! serves blocks whose (simulated) KV content is exactly the sequence's tokens.

use super::{step, BlockManager};
use crate::messages::{AdmitSeq, AllocateStep, ComputedSeq, GrowSeq, RequestId, StepGrant};
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

/// The simulated KV cache. A slot's real content depends on every token up to it (through
/// attention), so each slot holds the whole prefix that produced it.
struct Kv(Vec<Vec<Option<Vec<u32>>>>);

impl Kv {
    fn new() -> Kv {
        Kv(vec![vec![None; BLOCK]; POOL as usize])
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

fn run(seed: u64, prefix_caching: bool) -> (u64, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut m = BlockManager::new(POOL, BLOCK, prefix_caching);
    let mut kv = Kv::new();
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
    for _ in 0..400 {
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
    (m.usage().prefix_hits, preemptions)
}

#[test]
fn random_steps_keep_the_invariants_and_serve_correct_prefixes() {
    let mut hits = 0;
    let mut preemptions = 0;
    for seed in 0..12 {
        let (h, p) = run(0xb10c_0000 + seed, true);
        hits += h;
        preemptions += p;
    }
    assert!(hits > 0, "the workload exercised the prefix cache");
    assert!(preemptions > 0, "the workload exercised preemption");
}

#[test]
fn random_steps_without_prefix_caching_never_hit() {
    for seed in 0..4 {
        let (hits, _) = run(0xcafe_0000 + seed, false);
        assert_eq!(hits, 0);
    }
}
