//! The mixture-of-experts MLP on the CPU (DeepSeek-V2/V3, Qwen3-MoE): a router scores the
//! experts for each token, the best few (within the best groups, where the model groups
//! them) run on it, their outputs summed with the router's weights, plus the shared
//! experts that run on every token.

use super::mlp::GatedMlp;
use crate::config::{GroupScore, ModelConfig, MoeConfig, Scoring};
use crate::graph::cpu::ops::{Activations, Graph};
use crate::graph::cpu::step_io::StepShape;
use crate::weights::{WeightError, Weights};
use peregrine_ops::Linear;
use peregrine_runtime::cpu::{BufferPool, CpuBuffer};
use std::sync::Arc;

/// One layer's mixture: the router, its score bias, the routed and the shared experts.
pub(crate) struct MoeWeights {
    config: MoeConfig,
    router: Linear,
    score_bias: Option<Vec<f32>>,
    experts: Vec<GatedMlp>,
    shared: Option<GatedMlp>,
}

impl MoeWeights {
    /// Layer `prefix`'s mixture (`mlp.gate`, `mlp.experts.{e}`, `mlp.shared_experts`).
    pub fn load(w: &Weights, c: &ModelConfig, prefix: &str) -> Result<MoeWeights, WeightError> {
        let m = c
            .moe
            .clone()
            .expect("a mixture layer of a model without one");
        let (h, e) = (c.hidden_size, m.num_experts);
        let router = w.matrix(&format!("{prefix}.mlp.gate.weight"), [e, h])?;
        let score_bias = m
            .score_bias
            .then(|| w.f32(&format!("{prefix}.mlp.gate.e_score_correction_bias"), &[e]))
            .transpose()?;
        let experts = (0..e)
            .map(|i| {
                let p = format!("{prefix}.mlp.experts.{i}");
                GatedMlp::load(w, &p, h, m.expert_intermediate_size)
            })
            .collect::<Result<_, _>>()?;
        let shared = (m.shared_intermediate_size > 0)
            .then(|| {
                let p = format!("{prefix}.mlp.shared_experts");
                GatedMlp::load(w, &p, h, m.shared_intermediate_size)
            })
            .transpose()?;
        Ok(MoeWeights {
            config: m,
            router: Linear::of(Arc::new(router), None),
            score_bias,
            experts,
            shared,
        })
    }

    /// The mixture's projections as stored.
    pub fn linears(&self) -> Vec<&Linear> {
        let mlps = self.experts.iter().chain(&self.shared);
        let mut all = vec![&self.router];
        all.extend(mlps.flat_map(|m| [&m.gate_up, &m.down]));
        all
    }
}

/// The experts one token goes to, best first, with the weights their outputs are summed
/// with.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Routes one token from its router logits: scores (softmax or sigmoid), the best
/// `top_groups` groups by their best (or best two, with the score bias added) experts'
/// scores, the best `experts_per_token` experts within them, weighted by their scores
/// (without the bias), normalised if asked and times `routed_scaling`. Ties go to the
/// lower index, so a token's route depends on nothing but its logits.
pub(crate) fn route(m: &MoeConfig, logits: &[f32], bias: Option<&[f32]>) -> Route {
    let scores: Vec<f32> = match m.scoring {
        Scoring::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
            let total: f32 = e.iter().sum();
            e.iter().map(|x| x / total).collect()
        }
        Scoring::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
    };
    let choice: Vec<f32> = match bias {
        Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => scores.clone(),
    };
    let per_group = m.num_experts / m.groups;
    let mut allowed = vec![m.groups == 1; m.num_experts];
    if m.groups > 1 {
        let group_scores: Vec<f32> = choice
            .chunks(per_group)
            .map(|g| match m.group_score {
                GroupScore::Max => g.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                GroupScore::TopTwoSum => best(g, 2).iter().map(|&i| g[i]).sum(),
            })
            .collect();
        for g in best(&group_scores, m.top_groups) {
            allowed[g * per_group..(g + 1) * per_group].fill(true);
        }
    }
    let masked: Vec<f32> = choice
        .iter()
        .zip(&allowed)
        .map(|(&s, &ok)| if ok { s } else { f32::NEG_INFINITY })
        .collect();
    let experts = best(&masked, m.experts_per_token);
    let mut weights: Vec<f32> = experts.iter().map(|&e| scores[e]).collect();
    if m.normalize {
        let total: f32 = weights.iter().sum::<f32>() + 1e-20;
        weights.iter_mut().for_each(|w| *w /= total);
    }
    let scale = m.routed_scaling as f32;
    weights.iter_mut().for_each(|w| *w *= scale);
    Route { experts, weights }
}

/// The indices of the `k` largest of `values`, largest first, ties to the lower index.
fn best(values: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// The activations of a mixture layer at the largest step they serve.
pub(crate) struct MoeActivations {
    /// `[rows, experts]` router logits.
    logits: CpuBuffer<f32>,
    /// `[rows, hidden]` the rows one expert takes, gathered.
    gathered: CpuBuffer<f32>,
    /// `[rows, 2 * inter]`, `[rows, inter]` an expert's inner activations (inter the
    /// widest expert's, shared ones included).
    gate_up: CpuBuffer<f32>,
    act: CpuBuffer<f32>,
    /// `[rows, hidden]` one expert's outputs, then the routed sum.
    expert_out: CpuBuffer<f32>,
    routed: CpuBuffer<f32>,
}

impl MoeActivations {
    /// Buffers for steps up to `capacity` of a model of `c`, from `pool`.
    pub fn new(pool: &BufferPool, c: &ModelConfig, capacity: StepShape) -> MoeActivations {
        let m = c
            .moe
            .as_ref()
            .expect("mixture activations of a model without one");
        let (n, h) = (capacity.rows, c.hidden_size);
        let inter = m.expert_intermediate_size.max(m.shared_intermediate_size);
        let f = |len: usize| pool.alloc::<f32>(len);
        MoeActivations {
            logits: f(n * m.num_experts),
            gathered: f(n * h),
            gate_up: f(n * 2 * inter),
            act: f(n * inter),
            expert_out: f(n * h),
            routed: f(n * h),
        }
    }
}

/// Records the mixture of the first `n` rows of `a.normed` into `a.delta`: each row's
/// routed experts' outputs summed in the order of the experts' indices (whatever else the
/// batch holds), then the shared experts' output added.
pub(crate) fn record(
    graph: &mut Graph,
    a: &Activations,
    m: &MoeActivations,
    w: &Arc<MoeWeights>,
    n: usize,
) {
    let h = a.dims.hidden;
    let (normed, delta, logits) = (a.normed.clone(), a.delta.clone(), m.logits.clone());
    let (gathered, gate_up, act) = (m.gathered.clone(), m.gate_up.clone(), m.act.clone());
    let (expert_out, routed, w) = (m.expert_out.clone(), m.routed.clone(), w.clone());
    let handles = [
        normed.handle(),
        delta.handle(),
        logits.handle(),
        gathered.handle(),
        gate_up.handle(),
        act.handle(),
        expert_out.handle(),
        routed.handle(),
    ];
    graph.record("moe", &handles, move |_| {
        let x = &normed.read()[..n * h];
        let e = w.config.num_experts;
        let mut logits = logits.write();
        w.router.forward(x, &mut logits[..n * e]);
        let routes: Vec<Route> = logits[..n * e]
            .chunks(e)
            .map(|row| route(&w.config, row, w.score_bias.as_deref()))
            .collect();
        let (mut gathered, mut gate_up, mut act) = (gathered.write(), gate_up.write(), act.write());
        let (mut expert_out, mut routed) = (expert_out.write(), routed.write());
        let routed = &mut routed[..n * h];
        routed.fill(0.0);
        for (index, expert) in w.experts.iter().enumerate() {
            let picks: Vec<(usize, f32)> = routes
                .iter()
                .enumerate()
                .filter_map(|(row, r)| {
                    let at = r.experts.iter().position(|&x| x == index)?;
                    Some((row, r.weights[at]))
                })
                .collect();
            if picks.is_empty() {
                continue;
            }
            for (i, &(row, _)) in picks.iter().enumerate() {
                gathered[i * h..(i + 1) * h].copy_from_slice(&x[row * h..(row + 1) * h]);
            }
            let k = picks.len();
            let out = &mut expert_out[..k * h];
            expert.forward(&gathered[..k * h], &mut gate_up, &mut act, out);
            for (i, &(row, weight)) in picks.iter().enumerate() {
                let dst = &mut routed[row * h..(row + 1) * h];
                dst.iter_mut()
                    .zip(&out[i * h..(i + 1) * h])
                    .for_each(|(d, &y)| *d += weight * y);
            }
        }
        let delta = &mut delta.write()[..n * h];
        match &w.shared {
            Some(shared) => {
                shared.forward(x, &mut gate_up, &mut act, delta);
                delta.iter_mut().zip(&*routed).for_each(|(d, &r)| *d += r);
            }
            None => delta.copy_from_slice(routed),
        }
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(scoring: Scoring, groups: usize, top_groups: usize, score: GroupScore) -> MoeConfig {
        MoeConfig {
            num_experts: 8,
            experts_per_token: 2,
            expert_intermediate_size: 4,
            shared_intermediate_size: 0,
            scoring,
            groups,
            top_groups,
            group_score: score,
            score_bias: false,
            normalize: false,
            routed_scaling: 1.0,
            layers: vec![true],
        }
    }

    #[test]
    fn softmax_routing_takes_the_best_experts_with_their_probabilities() {
        let logits = [0.1, 2.0, -1.0, 0.5, 1.5, 0.0, -0.3, 0.2];
        let m = config(Scoring::Softmax, 1, 1, GroupScore::Max);
        let r = route(&m, &logits, None);
        assert_eq!(r.experts, vec![1, 4]);
        let total: f64 = logits.iter().map(|&x: &f32| (x as f64).exp()).sum();
        assert!((r.weights[0] as f64 - 2f64.exp() / total).abs() < 1e-6);
        let normed = MoeConfig {
            normalize: true,
            routed_scaling: 2.5,
            ..m
        };
        let r = route(&normed, &logits, None);
        let (a, b) = (2f64.exp(), 1.5f64.exp());
        assert!((r.weights[0] as f64 - 2.5 * a / (a + b)).abs() < 1e-6);
    }

    #[test]
    fn group_limited_routing_stays_in_the_best_groups() {
        // Groups of two: {0,1} best 0.9, {2,3} best 0.8, {4,5} best 0.85, {6,7} best 0.7.
        // Plain top-2 would take 0 and 2 (0.9, 0.8); from the best two groups ({0,1},
        // {4,5}) it takes 0 and 4.
        let scores = [0.9f32, 0.1, 0.8, 0.75, 0.85, 0.0, 0.7, 0.6];
        let logits: Vec<f32> = scores.iter().map(|&s| (s / (1.0 - s)).ln()).collect();
        let m = config(Scoring::Sigmoid, 4, 2, GroupScore::Max);
        assert_eq!(route(&m, &logits, None).experts, vec![0, 4]);
        // Scored by their best two: {2,3} (1.55) and {6,7} (1.3) beat {0,1} (1.0) and
        // {4,5} (0.85).
        let m = config(Scoring::Sigmoid, 4, 2, GroupScore::TopTwoSum);
        let r = route(&m, &logits, None);
        assert_eq!(r.experts, vec![2, 3]);
        assert!((r.weights[0] - 0.8).abs() < 1e-6 && (r.weights[1] - 0.75).abs() < 1e-6);
        // A bias moves the choice, not the weights: expert 6 is chosen over 3 and weighted
        // by its own score.
        let bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.0];
        let r = route(&m, &logits, Some(&bias));
        assert_eq!(r.experts, vec![6, 2]);
        assert!((r.weights[0] - 0.7).abs() < 1e-6);
    }
}
