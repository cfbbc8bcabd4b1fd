//! Batch invariance on the CPU: a request's logits are bit-identical alone, inside a batch
//! of other requests (prefilling or decoding, before or after it), with its prompt in one
//! piece or in chunks, and wherever its blocks lie in the pool.

use peregrine_models::LlamaModel;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use peregrine_testkit::fixtures;
use peregrine_testkit::tiny_model::{TinyModel, TinySpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BLOCK_SIZE: usize = 16;
const POOL: u64 = 64;

/// A sequence being fed: all its tokens, its blocks, and how many are in the cache.
struct Seq {
    tokens: Vec<u32>,
    blocks: Vec<u32>,
    cached: usize,
}

/// Runs one step that feeds `take[i].1` new tokens of sequence `take[i].0`, in that order,
/// and returns every row's logits per sequence.
fn step(
    model: &LlamaModel,
    cache: &mut KvCache,
    seqs: &mut [Seq],
    take: &[(usize, usize)],
) -> Vec<Vec<Vec<f32>>> {
    let vocab = model.config().vocab_size;
    let specs: Vec<SeqSpec> = take
        .iter()
        .map(|&(s, n)| SeqSpec {
            num_cached: seqs[s].cached,
            num_new: n,
            block_table: &seqs[s].blocks,
        })
        .collect();
    let plan = AttentionPlan::new(&specs, BLOCK_SIZE, POOL).unwrap();
    let tokens: Vec<u32> = take
        .iter()
        .flat_map(|&(s, n)| seqs[s].tokens[seqs[s].cached..seqs[s].cached + n].to_vec())
        .collect();
    let rows: Vec<usize> = (0..tokens.len()).collect();
    let logits = model.forward(&tokens, &plan, cache, &rows).unwrap();
    let mut rows = logits.chunks(vocab).map(<[f32]>::to_vec);
    take.iter()
        .map(|&(s, n)| {
            seqs[s].cached += n;
            rows.by_ref().take(n).collect()
        })
        .collect()
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|v| v.to_bits()).collect())
        .collect()
}

fn random_tokens(rng: &mut ChaCha8Rng, n: usize, vocab: u32) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..vocab)).collect()
}

#[test]
fn a_requests_logits_do_not_depend_on_its_batch_or_blocks() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 7).write_hf(dir.path());
    check(&LlamaModel::load(dir.path()).unwrap());
}

/// The same for latent attention and mixtures of experts: the DeepSeek-V2, DeepSeek-V3 and
/// Qwen3-MoE checkpoints of the transformers fixtures (experts run on the rows routed to
/// them, gathered from the whole batch).
#[test]
fn latent_attention_and_experts_do_not_depend_on_the_batch_either() {
    for name in ["deepseek_v2", "deepseek_v3", "qwen3_moe"] {
        let dir = fixtures::deepseek(name);
        check(&LlamaModel::load(&dir).unwrap());
    }
}

/// One request's logits alone, in batches of prefills and decodes, and chunked, with its
/// blocks in different places: bit for bit the same.
fn check(model: &LlamaModel) {
    let vocab = model.config().vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    // The request under test: a 23-token prompt, then 10 teacher-forced decode tokens.
    let r_tokens = random_tokens(&mut rng, 33, vocab);
    let a_tokens = random_tokens(&mut rng, 30, vocab);
    let b_tokens = random_tokens(&mut rng, 60, vocab);

    // Alone, blocks 0..3.
    let mut cache = model.new_cache(POOL, BLOCK_SIZE as u64);
    let mut seqs = vec![Seq {
        tokens: r_tokens.clone(),
        blocks: vec![0, 1, 2],
        cached: 0,
    }];
    let mut alone = step(model, &mut cache, &mut seqs, &[(0, 23)]).remove(0);
    for _ in 0..10 {
        alone.extend(step(model, &mut cache, &mut seqs, &[(0, 1)]).remove(0));
    }

    // In a batch: prefilled between two other prefills, then decoded in the middle of the
    // batch, with scattered blocks in a cache that other requests have already written.
    let mut cache = model.new_cache(POOL, BLOCK_SIZE as u64);
    let mut seqs = vec![
        Seq {
            tokens: a_tokens.clone(),
            blocks: vec![5, 6],
            cached: 0,
        },
        Seq {
            tokens: r_tokens.clone(),
            blocks: vec![50, 13, 33],
            cached: 0,
        },
        Seq {
            tokens: b_tokens.clone(),
            blocks: vec![60, 2, 17, 40],
            cached: 0,
        },
    ];
    let mut batched = step(model, &mut cache, &mut seqs, &[(0, 9), (1, 23), (2, 40)]).remove(1);
    for _ in 0..10 {
        batched.extend(step(model, &mut cache, &mut seqs, &[(0, 1), (1, 1), (2, 1)]).remove(1));
    }

    // Chunked prefill at the end of batches of decodes, blocks at the top of the pool.
    let mut cache = model.new_cache(POOL, BLOCK_SIZE as u64);
    let mut seqs = vec![
        Seq {
            tokens: b_tokens,
            blocks: vec![1, 2, 3, 4],
            cached: 0,
        },
        Seq {
            tokens: r_tokens,
            blocks: vec![63, 62, 61],
            cached: 0,
        },
    ];
    step(model, &mut cache, &mut seqs, &[(0, 37)]);
    let mut chunked = step(model, &mut cache, &mut seqs, &[(0, 1), (1, 16)]).remove(1);
    chunked.extend(step(model, &mut cache, &mut seqs, &[(0, 1), (1, 7)]).remove(1));
    for _ in 0..10 {
        chunked.extend(step(model, &mut cache, &mut seqs, &[(1, 1), (0, 1)]).remove(0));
    }

    assert_eq!(alone.len(), 33);
    assert_eq!(bits(&alone), bits(&batched), "alone vs batched");
    assert_eq!(bits(&alone), bits(&chunked), "alone vs chunked");
}
