//! Graph capture for the whole engine: the target runner's decode graphs and the draft
//! proposer's, for one set of sizes, at start-up and on every reload that changes them.

use super::CaptureSizes;
use crate::draft::DraftProposerHandle;
use crate::target_runner::TargetRunnerHandle;
use anyhow::Context;
use std::sync::Arc;
use tokio::sync::Mutex;
use tracing::warn;

/// Captures the target's and the draft's graphs as one. Cloning shares the same actors
/// and the sizes last captured.
#[derive(Clone)]
pub struct GraphCapture {
    runner: TargetRunnerHandle,
    proposer: Option<DraftProposerHandle>,
    /// The sizes both hold graphs for (`None`: neither holds any). Held across a capture,
    /// so two captures never interleave.
    captured: Arc<Mutex<Option<CaptureSizes>>>,
}

impl GraphCapture {
    /// Capture for `runner` and, when speculating, `proposer`; neither holds graphs yet.
    pub fn new(runner: TargetRunnerHandle, proposer: Option<DraftProposerHandle>) -> GraphCapture {
        GraphCapture {
            runner,
            proposer,
            captured: Arc::new(Mutex::new(None)),
        }
    }

    /// Captures graphs for `sizes` (`None`: drops them and runs eagerly), the draft's
    /// first, then the target's, each on its own thread between two of its steps, so no
    /// request in flight is lost. On failure both keep the graphs they held: a failed
    /// draft capture leaves the draft's in place and the target untouched; after a
    /// failed target capture the draft captures its previous sizes again.
    pub async fn capture(&self, sizes: Option<CaptureSizes>) -> anyhow::Result<()> {
        let mut captured = self.captured.lock().await;
        if let Some(proposer) = &self.proposer {
            proposer
                .capture_graphs(sizes.clone())
                .await
                .context("the draft's graphs")?;
        }
        if let Err(e) = self.runner.capture_graphs(sizes.clone()).await {
            if let Some(proposer) = &self.proposer {
                if let Err(undo) = proposer.capture_graphs(captured.clone()).await {
                    warn!("the draft keeps the graphs of the refused sizes: {undo:#}");
                }
            }
            return Err(e.context("the target's graphs"));
        }
        *captured = sizes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor_thread::Spin;
    use crate::backend::{ModelBackend, PoolInfo, RowMasks, RowSampling, StepInput, StepOutput};
    use crate::draft::{spawn_proposer, DraftMethod};
    use crate::messages::GeneratedToken;
    use crate::messages::{Drafted, ProposeSeq, RequestId};
    use crate::target_runner::DecodeAhead;
    use crate::target_runner::TargetRunner;
    use peregrine_kernels::cpu::KvLayout;
    use peregrine_models::ModelConfig;
    use peregrine_ops::AttentionPlan;

    /// The sizes of every capture asked, in order.
    type Log = Arc<std::sync::Mutex<Vec<Option<Vec<usize>>>>>;

    /// Logs every capture asked of it, and refuses sizes that hold `refuse`.
    struct Capturer {
        log: Log,
        refuse: usize,
    }

    impl Capturer {
        fn capture(&self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
            let sizes = sizes.map(|s| s.sizes().to_vec());
            self.log.lock().unwrap().push(sizes.clone());
            match sizes {
                Some(s) if s.contains(&self.refuse) => anyhow::bail!("no room for {}", self.refuse),
                _ => Ok(()),
            }
        }
    }

    /// A target that captures and runs nothing else.
    struct Target {
        capturer: Capturer,
        config: ModelConfig,
        pool: PoolInfo,
    }

    impl ModelBackend for Target {
        fn config(&self) -> &ModelConfig {
            &self.config
        }

        fn pool(&self) -> &PoolInfo {
            &self.pool
        }

        fn run(&mut self, _: StepInput) -> anyhow::Result<StepOutput> {
            anyhow::bail!("no steps")
        }

        fn sampled(
            &mut self,
            _: &[u32],
            _: &AttentionPlan,
            _: &[usize],
            _: &mut [RowSampling],
            _: RowMasks,
        ) -> anyhow::Result<Vec<GeneratedToken>> {
            anyhow::bail!("no forwards")
        }

        fn logits(
            &mut self,
            _: &[u32],
            _: &AttentionPlan,
            _: &[usize],
        ) -> anyhow::Result<Vec<f32>> {
            anyhow::bail!("no forwards")
        }

        fn vocab(&self) -> usize {
            self.config.vocab_size
        }

        fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
            self.capturer.capture(sizes)
        }
    }

    impl DraftMethod for Capturer {
        fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>> {
            Ok(vec![Drafted::default(); seqs.len()])
        }

        fn release(&mut self, _: RequestId) {}

        fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
            self.capture(sizes)
        }
    }

    /// Capture for a target that refuses sizes holding 5 and a draft that refuses sizes
    /// holding 7, with their logs.
    fn capture() -> (GraphCapture, Log, Log) {
        let (target_log, draft_log) = (Log::default(), Log::default());
        let config = ModelConfig::from_json(
            r#"{"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":8,
            "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
            "max_position_embeddings":64}"#,
        )
        .unwrap();
        let layout = KvLayout {
            num_blocks: 2,
            block_size: 16,
            num_kv_heads: 2,
            head_dim: 4,
        };
        let pool = PoolInfo {
            layout,
            bytes_per_layer: 0,
            audit: layout.audit(4).unwrap(),
            kernels: "none",
            computed_in: "u64",
            device: "test".into(),
            scratch_block: Some(1),
        };
        let target = Target {
            capturer: Capturer {
                log: target_log.clone(),
                refuse: 5,
            },
            config,
            pool,
        };
        let draft = Capturer {
            log: draft_log.clone(),
            refuse: 7,
        };
        let (runner, _) = TargetRunner::spawn(Box::new(target), 16, Spin::NONE, DecodeAhead::OFF);
        let (proposer, _) = spawn_proposer(Box::new(draft), Spin::NONE);
        (
            GraphCapture::new(runner, Some(proposer)),
            target_log,
            draft_log,
        )
    }

    fn sizes(list: &[usize]) -> Option<CaptureSizes> {
        Some(CaptureSizes::from_list(list, 64).unwrap())
    }

    fn logged(log: &Log) -> Vec<Option<Vec<usize>>> {
        log.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn a_refused_target_capture_puts_the_drafts_graphs_back() {
        let (capture, target, draft) = capture();
        capture.capture(sizes(&[1, 2])).await.unwrap();
        let err = capture.capture(sizes(&[1, 5])).await.unwrap_err();
        assert_eq!(format!("{err:#}"), "the target's graphs: no room for 5");
        let (old, refused) = (Some(vec![1, 2]), Some(vec![1, 5]));
        assert_eq!(logged(&target), [old.clone(), refused.clone()]);
        assert_eq!(logged(&draft), [old.clone(), refused, old]);
    }

    #[tokio::test]
    async fn a_refused_draft_capture_leaves_the_target_alone() {
        let (capture, target, draft) = capture();
        let err = capture.capture(sizes(&[1, 7])).await.unwrap_err();
        assert_eq!(format!("{err:#}"), "the draft's graphs: no room for 7");
        assert_eq!(logged(&target), []);
        capture.capture(None).await.unwrap();
        capture.capture(sizes(&[4])).await.unwrap();
        assert_eq!(logged(&target), [None, Some(vec![4])]);
        assert_eq!(logged(&draft), [Some(vec![1, 7]), None, Some(vec![4])]);
    }
}
