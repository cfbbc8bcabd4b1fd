//! Mixture-of-experts fields of DeepSeek-V2/V3 and Qwen3-MoE config.json files.

use super::{field_error, required, Architecture, ConfigError};

/// How a router's logits become expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// Softmax over all experts (DeepSeek-V2, Qwen3-MoE).
    Softmax,
    /// An independent sigmoid per expert (DeepSeek-V3).
    Sigmoid,
}

/// How a group of experts is scored when routing picks groups first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupScore {
    /// The group's best expert (DeepSeek-V2's `group_limited_greedy`).
    Max,
    /// The sum of the group's two best (DeepSeek-V3's `noaux_tc`).
    TopTwoSum,
}

/// A mixture-of-experts MLP: which layers have one and how tokens are routed.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Routed experts.
    pub num_experts: usize,
    /// Experts each token is sent to.
    pub experts_per_token: usize,
    /// Inner width of one routed expert.
    pub expert_intermediate_size: usize,
    /// Inner width of the shared experts, run for every token (0: none).
    pub shared_intermediate_size: usize,
    /// How router logits become scores.
    pub scoring: Scoring,
    /// Expert groups (1: no group selection).
    pub groups: usize,
    /// Groups a token's experts may come from.
    pub top_groups: usize,
    /// How a group is scored.
    pub group_score: GroupScore,
    /// Whether the router has `e_score_correction_bias`, added to the scores for choosing
    /// experts only (DeepSeek-V3).
    pub score_bias: bool,
    /// Whether the chosen experts' weights are divided by their sum.
    pub normalize: bool,
    /// What the routed experts' sum is multiplied by (`routed_scaling_factor`).
    pub routed_scaling: f64,
    /// For each layer (the decoder's, then the multi-token prediction layers after them),
    /// whether its MLP is the mixture (else the dense MLP).
    pub layers: Vec<bool>,
}

/// The raw MoE fields of a config.json.
pub(super) struct RawMoe {
    /// DeepSeek's `n_routed_experts`, Qwen's `num_experts` or `num_local_experts`.
    pub num_experts: Option<usize>,
    pub experts_per_token: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub n_shared_experts: Option<usize>,
    pub first_k_dense_replace: Option<usize>,
    pub moe_layer_freq: Option<usize>,
    pub n_group: Option<usize>,
    pub topk_group: Option<usize>,
    pub topk_method: Option<String>,
    pub scoring_func: Option<String>,
    pub norm_topk_prob: Option<bool>,
    pub routed_scaling_factor: Option<f64>,
    pub decoder_sparse_step: Option<usize>,
    pub mlp_only_layers: Option<Vec<usize>>,
}

impl MoeConfig {
    /// The mixture of an architecture that has one, for a model of `num_layers` (its
    /// decoder's and its multi-token prediction layers); `None`
    /// when the config names no routed experts (a dense model).
    pub(super) fn parse(
        architecture: Architecture,
        raw: RawMoe,
        num_layers: usize,
    ) -> Result<Option<MoeConfig>, ConfigError> {
        if raw.num_experts.unwrap_or(0) == 0 {
            return Ok(None);
        }
        let num_experts = required(raw.num_experts, "n_routed_experts")?;
        let experts_per_token = required(raw.experts_per_token, "num_experts_per_tok")?;
        if experts_per_token > num_experts {
            return Err(field_error(
                "num_experts_per_tok",
                format!("({experts_per_token}) exceeds the {num_experts} experts"),
            ));
        }
        let expert_intermediate_size =
            required(raw.moe_intermediate_size, "moe_intermediate_size")?;
        let moe = match architecture {
            Architecture::Qwen3Moe => {
                let step = required(raw.decoder_sparse_step.or(Some(1)), "decoder_sparse_step")?;
                let dense = raw.mlp_only_layers.unwrap_or_default();
                MoeConfig {
                    num_experts,
                    experts_per_token,
                    expert_intermediate_size,
                    shared_intermediate_size: 0,
                    scoring: Scoring::Softmax,
                    groups: 1,
                    top_groups: 1,
                    group_score: GroupScore::Max,
                    score_bias: false,
                    normalize: raw.norm_topk_prob.unwrap_or(false),
                    routed_scaling: 1.0,
                    layers: (0..num_layers)
                        .map(|l| !dense.contains(&l) && (l + 1).is_multiple_of(step))
                        .collect(),
                }
            }
            _ => {
                let sizes = (num_experts, experts_per_token, expert_intermediate_size);
                deepseek(architecture, raw, num_layers, sizes)?
            }
        };
        Ok(Some(moe))
    }
}

/// DeepSeek-V2/V3 routing: `topk_method` `greedy`, `group_limited_greedy` (V2) or
/// `noaux_tc` (V3); dense layers before `first_k_dense_replace` and off `moe_layer_freq`.
fn deepseek(
    architecture: Architecture,
    raw: RawMoe,
    num_layers: usize,
    (num_experts, experts_per_token, expert_intermediate_size): (usize, usize, usize),
) -> Result<MoeConfig, ConfigError> {
    let v3 = architecture == Architecture::DeepseekV3;
    let method = raw
        .topk_method
        .unwrap_or_else(|| if v3 { "noaux_tc" } else { "greedy" }.into());
    let (grouped, group_score, score_bias) = match method.as_str() {
        "greedy" => (false, GroupScore::Max, false),
        "group_limited_greedy" => (true, GroupScore::Max, false),
        "noaux_tc" => (true, GroupScore::TopTwoSum, true),
        other => {
            return Err(field_error(
                "topk_method",
                format!(
                    "{other:?} is not supported (supported: greedy, group_limited_greedy, noaux_tc)"
                ),
            ))
        }
    };
    let scoring =
        match raw
            .scoring_func
            .as_deref()
            .unwrap_or(if v3 { "sigmoid" } else { "softmax" })
        {
            "softmax" => Scoring::Softmax,
            "sigmoid" => Scoring::Sigmoid,
            other => {
                return Err(field_error(
                    "scoring_func",
                    format!("{other:?} is not supported (supported: softmax, sigmoid)"),
                ))
            }
        };
    let (groups, top_groups) = if grouped {
        let groups = required(raw.n_group, "n_group")?;
        let top = required(raw.topk_group, "topk_group")?;
        if !num_experts.is_multiple_of(groups) || top > groups {
            return Err(field_error(
                "n_group",
                format!(
                    "({groups}) must divide n_routed_experts ({num_experts}) and be at least \
                     topk_group ({top})"
                ),
            ));
        }
        let per_group = num_experts / groups;
        if group_score == GroupScore::TopTwoSum && per_group < 2 {
            return Err(field_error(
                "n_group",
                "leaves fewer than two experts a group, which noaux_tc scores by its best two",
            ));
        }
        if top * per_group < experts_per_token {
            return Err(field_error(
                "topk_group",
                format!("({top}) groups of {per_group} hold fewer than num_experts_per_tok"),
            ));
        }
        (groups, top)
    } else {
        (1, 1)
    };
    let scaling = raw.routed_scaling_factor.unwrap_or(1.0);
    if scaling.is_nan() || scaling <= 0.0 {
        return Err(field_error("routed_scaling_factor", "must be positive"));
    }
    let first_dense = raw.first_k_dense_replace.unwrap_or(0);
    let freq = required(raw.moe_layer_freq.or(Some(1)), "moe_layer_freq")?;
    Ok(MoeConfig {
        num_experts,
        experts_per_token,
        expert_intermediate_size,
        shared_intermediate_size: expert_intermediate_size * raw.n_shared_experts.unwrap_or(0),
        scoring,
        groups,
        top_groups,
        group_score,
        score_bias,
        normalize: raw.norm_topk_prob.unwrap_or(false),
        routed_scaling: scaling,
        layers: (0..num_layers)
            .map(|l| l >= first_dense && l.is_multiple_of(freq))
            .collect(),
    })
}
