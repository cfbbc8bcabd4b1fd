//! Captures one graph per batch size at start-up (and again when the sizes change) and
//! finds the graph a batch replays through.

use super::{is_decode_step, CaptureSizes};
use anyhow::Context;
use peregrine_models::progress;
use peregrine_ops::AttentionPlan;
use tracing::info;

/// The captured graphs, one per size, of any graph type `G` (the CPU's recorded graph, a
/// CUDA graph with its buffers). Dropping the manager drops every graph, and with them the
/// buffers only they held.
pub struct GraphCaptureManager<G> {
    sizes: CaptureSizes,
    /// `graphs[i]` serves `sizes.sizes()[i]`.
    graphs: Vec<G>,
}

impl<G> GraphCaptureManager<G> {
    /// Captures a graph for every size with `capture`, largest first (so that buffers
    /// sized for the largest are allocated once and the smaller graphs view them), with a
    /// progress bar; logs the total capture time. The first failure refuses the whole set.
    pub fn capture(
        sizes: CaptureSizes,
        mut capture: impl FnMut(usize) -> anyhow::Result<G>,
    ) -> anyhow::Result<GraphCaptureManager<G>> {
        let bar = progress::bar(sizes.sizes().len() as u64, "capturing graphs", "batch");
        let mut graphs = Vec::with_capacity(sizes.sizes().len());
        for &size in sizes.sizes().iter().rev() {
            bar.set_message(size.to_string());
            let graph =
                capture(size).with_context(|| format!("capturing the graph of batch {size}"))?;
            graphs.push(graph);
            bar.inc(1);
        }
        bar.finish_and_clear();
        graphs.reverse();
        info!(
            sizes = ?sizes.sizes(),
            seconds = bar.elapsed().as_secs_f64(),
            "captured {} graphs",
            graphs.len()
        );
        Ok(GraphCaptureManager { sizes, graphs })
    }

    /// The graph a batch of `n` sequences replays through, with the size it is padded to;
    /// `None` when `n` is past the largest size (the batch runs eagerly).
    pub fn graph_for(&self, n: usize) -> Option<(usize, &G)> {
        let size = self.sizes.padded(n)?;
        let at = self.sizes.sizes().partition_point(|&s| s < size);
        Some((size, &self.graphs[at]))
    }

    /// The graph a step replays through, with the size it is padded to: `None` unless the
    /// step is pure decode (one token and one logit row per sequence, in order), its block
    /// tables fit the `max_blocks` entries the graphs stage, and a captured size holds it.
    pub fn graph_for_step(
        &self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        max_blocks: usize,
    ) -> Option<(usize, &G)> {
        let fits = plan
            .seqs()
            .iter()
            .all(|s| s.block_table.len() <= max_blocks);
        if !fits || !is_decode_step(tokens, plan, logit_rows) {
            return None;
        }
        self.graph_for(plan.seqs().len())
    }

    /// The captured sizes.
    pub fn sizes(&self) -> &CaptureSizes {
        &self.sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_largest_first_and_pads_batches_up() {
        let mut order = Vec::new();
        let sizes = CaptureSizes::for_max_num_seqs(32);
        let manager = GraphCaptureManager::capture(sizes, |size| {
            order.push(size);
            Ok(format!("graph {size}"))
        })
        .unwrap();
        assert_eq!(order, [32, 24, 16, 8, 4, 2, 1]);
        assert_eq!(manager.graph_for(3), Some((4, &"graph 4".to_string())));
        assert_eq!(manager.graph_for(17).map(|(s, _)| s), Some(24));
        assert_eq!(manager.graph_for(33), None);
        assert_eq!(manager.sizes().largest(), 32);
    }

    #[test]
    fn one_failed_capture_refuses_the_set() {
        let sizes = CaptureSizes::from_list(&[1, 2, 4], 4).unwrap();
        let err = GraphCaptureManager::capture(sizes, |size| match size {
            2 => anyhow::bail!("out of memory"),
            _ => Ok(size),
        })
        .err()
        .unwrap();
        assert_eq!(
            format!("{err:#}"),
            "capturing the graph of batch 2: out of memory"
        );
    }
}
