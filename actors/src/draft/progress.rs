//! What a draft model has seen of each sequence, and the greedy drafting loop over it,
//! whichever device runs the model: each step the draft first catches up over the tokens
//! it has not seen (the whole sequence after a preemption or a block-table change, else the
//! tokens accepted last step), then decodes one row per sequence until each has its drafts.
//! Draft KV written for drafts the target rejects is simply overwritten by the next
//! catch-up, which starts at the first position the draft has not verified.

use crate::messages::{ProposeSeq, RequestId};
use peregrine_ops::SeqSpec;
use std::collections::HashMap;

/// What the draft holds for one sequence.
struct DraftSeq {
    /// Tokens of the sequence whose draft KV is in the cache.
    computed: usize,
    /// The block table those tokens were written through.
    table: Vec<u32>,
}

/// One forward of the draft model over `specs` and their `tokens`, giving the greedy token
/// of each row of `rows` (the last token of each spec, in order); `decode` says the step
/// is pure decode (one token per sequence), which a graph may serve.
pub type DraftForward<'a> =
    dyn FnMut(&[SeqSpec], &[u32], &[usize], bool) -> anyhow::Result<Vec<u32>> + 'a;

/// The draft's progress over every sequence it drafts for.
pub struct DraftProgress {
    block_size: usize,
    seqs: HashMap<RequestId, DraftSeq>,
}

impl DraftProgress {
    /// No sequence seen yet, over KV blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> DraftProgress {
        DraftProgress {
            block_size,
            seqs: HashMap::new(),
        }
    }

    /// Forgets `id` (it ended or was preempted).
    pub fn release(&mut self, id: RequestId) {
        self.seqs.remove(&id);
    }

    /// Up to `max_drafts` greedy drafts of each sequence of `seqs`, through `forward`.
    pub fn propose(
        &mut self,
        seqs: &[ProposeSeq],
        forward: &mut DraftForward,
    ) -> anyhow::Result<Vec<Vec<u32>>> {
        // Step 0: catch up over every unseen token; its last row gives the first draft.
        let mut starts = Vec::with_capacity(seqs.len());
        for s in seqs {
            let state = self.seqs.entry(s.id).or_insert(DraftSeq {
                computed: 0,
                table: Vec::new(),
            });
            let blocks_seen = state.computed.div_ceil(self.block_size);
            let same_blocks = s.block_table.get(..blocks_seen) == state.table.get(..blocks_seen);
            if !same_blocks || state.computed >= s.tokens.len() {
                state.computed = 0;
            }
            starts.push(state.computed);
        }
        let live: Vec<usize> = (0..seqs.len())
            .filter(|&i| seqs[i].max_drafts > 0)
            .collect();
        let mut drafts = vec![Vec::new(); seqs.len()];
        if live.is_empty() {
            return Ok(drafts);
        }
        let mut specs = Vec::new();
        let mut tokens = Vec::new();
        let mut rows = Vec::new();
        for &i in &live {
            let s = &seqs[i];
            specs.push(SeqSpec {
                num_cached: starts[i],
                num_new: s.tokens.len() - starts[i],
                block_table: &s.block_table,
            });
            tokens.extend_from_slice(&s.tokens[starts[i]..]);
            rows.push(tokens.len() - 1);
        }
        let first = forward(&specs, &tokens, &rows, false)?;
        for (&i, d) in live.iter().zip(first) {
            drafts[i].push(d);
            let state = self.seqs.get_mut(&seqs[i].id).expect("entered above");
            state.computed = seqs[i].tokens.len();
            state.table.clone_from(&seqs[i].block_table);
        }
        // Steps 1..: one row per sequence that wants more, at the next position (a pure
        // decode step, replayed through a graph where one serves it).
        loop {
            let more: Vec<usize> = live
                .iter()
                .copied()
                .filter(|&i| drafts[i].len() < seqs[i].max_drafts)
                .collect();
            if more.is_empty() {
                return Ok(drafts);
            }
            let specs: Vec<SeqSpec> = more
                .iter()
                .map(|&i| SeqSpec {
                    num_cached: seqs[i].tokens.len() + drafts[i].len() - 1,
                    num_new: 1,
                    block_table: &seqs[i].block_table,
                })
                .collect();
            let tokens: Vec<u32> = more.iter().map(|&i| *drafts[i].last().unwrap()).collect();
            let rows: Vec<usize> = (0..more.len()).collect();
            let next = forward(&specs, &tokens, &rows, true)?;
            for (&i, d) in more.iter().zip(next) {
                drafts[i].push(d);
            }
        }
    }
}
