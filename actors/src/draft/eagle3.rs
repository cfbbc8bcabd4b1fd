//! Drafting with an EAGLE-3 head on the CPU (reference §1.6), its one-layer KV cache over
//! the target's block ids in a pool of the head's shape.
//!
//! The target records the inputs of the head's aux layers for every row it runs; they
//! arrive here with each `Propose` and wait, per request, until the token after each
//! position is known. Step 0 then runs every waiting row whose position the target has
//! verified (rows of rejected drafts are dropped): the row at position j pairs the
//! target's features at j with token j + 1 (the last one being the token the target just
//! produced), which also fills the head's KV cache. Its last row gives the first draft;
//! steps 1.. run one row per request at the next position, fed the previous `pre`.
//! Drafting is greedy over the draft vocabulary, mapped to target ids through `d2t`.
//!
//! Steps 1.. replay captured graphs of the head's decode step when graphs are captured
//! and a size holds the batch, padded up to it (the padded rows repeat the last real
//! row's token and `pre`, and write their KV into the target pool's scratch block, which
//! no sequence owns); step 0, and a batch past the largest size, run eagerly.
//!
//! A request whose hidden states have a gap (a prompt prefix served from the prefix cache,
//! which the target did not recompute) gets no drafts; its output is unchanged.

use super::DraftMethod;
use crate::backend::PoolInfo;
use crate::graphs::{CaptureSizes, CpuHeadGraphs};
use crate::messages::{HiddenRows, ProposeSeq, RequestId};
use anyhow::Context;
use peregrine_models::eagle3::{Eagle3Head, HeadInput};
use peregrine_models::ModelConfig;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use std::collections::HashMap;

/// What the head holds for one request.
#[derive(Default)]
struct HeadSeq {
    /// Positions whose step-0 KV is in the head's cache: `0..computed`.
    computed: usize,
    /// Target features of positions `computed..`, one row of the aux width each.
    pending: Vec<f32>,
    /// The features had a gap: no drafts for this request.
    broken: bool,
}

/// The EAGLE-3 method.
pub struct Eagle3 {
    head: Eagle3Head,
    cache: KvCache,
    block_size: usize,
    num_blocks: u64,
    /// Width of one row of target features.
    width: usize,
    seqs: HashMap<RequestId, HeadSeq>,
    /// Where the padded rows of a replayed graph write: the target pool's scratch slot.
    scratch_slot: Option<i64>,
    /// Block-table entries the graphs stage.
    graph_table_width: usize,
    /// The captured graphs of the head's decode step, if any.
    graphs: Option<CpuHeadGraphs>,
}

impl Eagle3 {
    /// The `head` for `target`, with a one-layer cache of as many blocks as the target's
    /// `pool` (its scratch block included), of the same size.
    pub fn new(head: Eagle3Head, target: &ModelConfig, pool: &PoolInfo) -> anyhow::Result<Eagle3> {
        let (num_blocks, block_size) = (pool.layout.num_blocks, pool.layout.block_size);
        let layout = head.kv_layout(num_blocks, block_size);
        layout
            .audit(4)
            .map_err(|e| anyhow::anyhow!("EAGLE-3 KV address audit: {e}"))?;
        let c = head.config();
        let width = head.aux_layers().len() * c.target_hidden_size;
        Ok(Eagle3 {
            head,
            cache: KvCache::new(1, layout),
            block_size: block_size as usize,
            num_blocks,
            width,
            seqs: HashMap::new(),
            scratch_slot: pool.scratch_slot(),
            graph_table_width: pool.graph_table_width(target.max_model_len),
            graphs: None,
        })
    }

    /// The head's KV cache, in the blocks of the target's pool.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// One forward of the head over `specs`; the draft (a target id) of each row in
    /// `rows`, and `pre` of every row. A step fed `pre` replays a captured graph when one
    /// serves it, else runs eagerly.
    fn run(
        &mut self,
        specs: &[SeqSpec],
        tokens: &[u32],
        input: HeadInput,
        rows: &[usize],
    ) -> anyhow::Result<(Vec<u32>, Vec<f32>)> {
        let plan = AttentionPlan::new(specs, self.block_size, self.num_blocks)?;
        let replayed = match (&mut self.graphs, input) {
            (Some(graphs), HeadInput::Pre(pre)) => graphs
                .replay(tokens, pre, &plan, rows, &mut self.cache)
                .context("EAGLE-3 head graph replay")?,
            _ => None,
        };
        let out = match replayed {
            Some(out) => out,
            None => self
                .head
                .forward(tokens, input, &plan, &mut self.cache, rows)
                .context("EAGLE-3 head forward")?,
        };
        Ok((self.head.vocab().greedy(&out.logits), out.pre))
    }
}

impl DraftMethod for Eagle3 {
    fn hidden_layers(&self) -> Option<Vec<usize>> {
        Some(self.head.aux_layers().to_vec())
    }

    fn receive_hidden(&mut self, rows: Vec<HiddenRows>) {
        let w = self.width;
        for r in rows {
            let s = self.seqs.entry(r.id).or_default();
            let end = s.computed + s.pending.len() / w;
            if r.first_pos > end {
                s.broken = true;
            } else if r.first_pos < s.computed {
                // The target ran positions the head has seen again: take them afresh.
                s.computed = r.first_pos;
                s.pending.clear();
            } else {
                // Rows past first_pos are those of rejected drafts.
                s.pending.truncate((r.first_pos - s.computed) * w);
            }
            if r.data.len() % w != 0 {
                s.broken = true;
            }
            s.pending.extend(r.data);
        }
    }

    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Vec<u32>>> {
        let w = self.width;
        let mut drafts = vec![Vec::new(); seqs.len()];
        // Step 0: the rows at positions the target has run, up to the one before the
        // last token (whose successor, the next token, is not known yet).
        let mut live = Vec::new();
        let (mut specs, mut tokens, mut features, mut rows) = (vec![], vec![], vec![], vec![]);
        for (i, s) in seqs.iter().enumerate() {
            let len = s.tokens.len();
            let Some(state) = self.seqs.get_mut(&s.id) else {
                continue;
            };
            let have = state.computed + state.pending.len() / w;
            if s.max_drafts == 0 || state.broken || len < 2 || have < len - 1 {
                continue;
            }
            if state.computed >= len - 1 {
                continue;
            }
            state.pending.truncate((len - 1 - state.computed) * w);
            specs.push(SeqSpec {
                num_cached: state.computed,
                num_new: len - 1 - state.computed,
                block_table: &s.block_table,
            });
            tokens.extend_from_slice(&s.tokens[state.computed + 1..]);
            features.extend_from_slice(&state.pending);
            rows.push(tokens.len() - 1);
            live.push(i);
        }
        if live.is_empty() {
            return Ok(drafts);
        }
        let (first, pre) = self.run(&specs, &tokens, HeadInput::Aux(&features), &rows)?;
        let h = self.head.config().hidden_size;
        let mut last_pre: Vec<Vec<f32>> = rows
            .iter()
            .map(|&r| pre[r * h..(r + 1) * h].to_vec())
            .collect();
        for (&i, d) in live.iter().zip(first) {
            drafts[i].push(d);
            let state = self.seqs.get_mut(&seqs[i].id).expect("live above");
            state.computed = seqs[i].tokens.len() - 1;
            state.pending.clear();
        }
        // Steps 1..: one row per request that wants more, at the next position.
        loop {
            let more: Vec<usize> = (0..live.len())
                .filter(|&k| drafts[live[k]].len() < seqs[live[k]].max_drafts)
                .collect();
            if more.is_empty() {
                return Ok(drafts);
            }
            let specs: Vec<SeqSpec> = more
                .iter()
                .map(|&k| {
                    let s = &seqs[live[k]];
                    SeqSpec {
                        num_cached: s.tokens.len() - 2 + drafts[live[k]].len(),
                        num_new: 1,
                        block_table: &s.block_table,
                    }
                })
                .collect();
            let tokens: Vec<u32> = more
                .iter()
                .map(|&k| *drafts[live[k]].last().expect("step 0 drafted"))
                .collect();
            let input: Vec<f32> = more.iter().flat_map(|&k| last_pre[k].clone()).collect();
            let rows: Vec<usize> = (0..more.len()).collect();
            let (next, pre) = self.run(&specs, &tokens, HeadInput::Pre(&input), &rows)?;
            for (j, (&k, d)) in more.iter().zip(next).enumerate() {
                drafts[live[k]].push(d);
                last_pre[k] = pre[j * h..(j + 1) * h].to_vec();
            }
        }
    }

    fn release(&mut self, id: RequestId) {
        self.seqs.remove(&id);
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        let Some(sizes) = sizes else {
            self.graphs = None;
            return Ok(());
        };
        let scratch_slot = self.scratch_slot.context(
            "the target pool has no scratch block for the padded rows of the head's graphs",
        )?;
        let graphs =
            CpuHeadGraphs::capture(&self.head, sizes, self.graph_table_width, scratch_slot)
                .context("capturing the EAGLE-3 head's graphs")?;
        self.graphs = Some(graphs);
        Ok(())
    }
}
