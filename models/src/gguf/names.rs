//! GGUF (llama.cpp) tensor names to Hugging Face Llama names.

/// Which llama.cpp row permutation a tensor carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Permuted {
    /// Stored as in the Hugging Face checkpoint.
    No,
    /// `attn_q`: permuted per query head.
    Query,
    /// `attn_k`: permuted per key/value head.
    Key,
}

/// Per-layer tensors: GGUF suffix after `blk.N.`, Hugging Face suffix after `model.layers.N.`.
const LAYER_TENSORS: &[(&str, &str, Permuted)] = &[
    ("attn_q.weight", "self_attn.q_proj.weight", Permuted::Query),
    ("attn_k.weight", "self_attn.k_proj.weight", Permuted::Key),
    ("attn_v.weight", "self_attn.v_proj.weight", Permuted::No),
    (
        "attn_output.weight",
        "self_attn.o_proj.weight",
        Permuted::No,
    ),
    ("ffn_gate.weight", "mlp.gate_proj.weight", Permuted::No),
    ("ffn_up.weight", "mlp.up_proj.weight", Permuted::No),
    ("ffn_down.weight", "mlp.down_proj.weight", Permuted::No),
    ("attn_norm.weight", "input_layernorm.weight", Permuted::No),
    (
        "ffn_norm.weight",
        "post_attention_layernorm.weight",
        Permuted::No,
    ),
];

/// Whole-model tensors.
const MODEL_TENSORS: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The GGUF name of the output projection; absent when embeddings are tied.
pub(crate) const OUTPUT: &str = "output.weight";

/// The Hugging Face name of GGUF tensor `gguf` and its permutation, or `None` if the name is
/// not part of a Llama model.
pub(crate) fn hf_name(gguf: &str) -> Option<(String, Permuted)> {
    if let Some((_, hf)) = MODEL_TENSORS.iter().find(|(g, _)| *g == gguf) {
        return Some((hf.to_string(), Permuted::No));
    }
    let (layer, suffix) = gguf.strip_prefix("blk.")?.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let layer: usize = layer.parse().ok()?;
    let (_, hf, permuted) = LAYER_TENSORS.iter().find(|(g, _, _)| *g == suffix)?;
    Some((format!("model.layers.{layer}.{hf}"), *permuted))
}

/// The GGUF names a Llama model with `n_layers` layers must have (the output projection is
/// optional and not listed).
pub(crate) fn required(n_layers: usize) -> Vec<String> {
    let layers = (0..n_layers).flat_map(|n| {
        LAYER_TENSORS
            .iter()
            .map(move |(g, _, _)| format!("blk.{n}.{g}"))
    });
    MODEL_TENSORS
        .iter()
        .map(|(g, _)| g.to_string())
        .filter(|g| g != OUTPUT)
        .chain(layers)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_names() {
        assert_eq!(
            hf_name("blk.12.attn_q.weight"),
            Some((
                "model.layers.12.self_attn.q_proj.weight".into(),
                Permuted::Query
            ))
        );
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight").unwrap().0,
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(hf_name("output.weight").unwrap().0, "lm_head.weight");
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("blk.+1.attn_q.weight"), None);
        assert_eq!(hf_name("blk.0.attn_q.bias"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
        assert_eq!(required(2).len(), 2 + 2 * 9);
    }
}
