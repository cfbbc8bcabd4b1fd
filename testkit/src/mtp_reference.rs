//! A float64 forward of a DeepSeek-V3 multi-token prediction layer, written from the
//! DeepSeek-V3 technical report (arXiv 2412.19437: multi-token prediction, section 2.2; latent
//! attention, section 2.1.1) apart from Peregrine's: latent attention decompressed (each head's
//! keys and values expanded by `kv_b_proj`, plain attention over them), YaRN's frequencies
//! computed here, the sigmoid `noaux_tc` routing, the shared expert.

pub use crate::reference::argmax;
use crate::reference::{dot, matvec, rms, widen};
use safetensors::SafeTensors;
use serde_json::Value;
use std::collections::HashMap;
use std::f64::consts::PI;
use std::path::Path;

/// The MTP layer of a checkpoint, widened to float64.
pub struct MtpReference {
    config: Value,
    tensors: HashMap<String, Vec<f64>>,
}

/// One row the layer runs: its token, position and feature (the target's normed output at
/// the row before, or the layer's own previous output).
pub struct Row {
    pub token: u32,
    pub position: usize,
    pub feature: Vec<f64>,
}

impl MtpReference {
    /// Reads config.json and every `*.safetensors` file of `dir`.
    pub fn load(dir: &Path) -> MtpReference {
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let mut tensors = HashMap::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "safetensors") {
                let bytes = std::fs::read(&path).unwrap();
                let st = SafeTensors::deserialize(&bytes).unwrap();
                for (name, view) in st.tensors() {
                    tensors.insert(name, widen(view.dtype(), view.data()));
                }
            }
        }
        MtpReference { config, tensors }
    }

    fn n(&self, key: &str) -> usize {
        self.config[key].as_u64().unwrap() as usize
    }

    fn t(&self, name: &str) -> &[f64] {
        let layer = self.n("num_hidden_layers");
        let full = name.replace("{L}", &format!("model.layers.{layer}"));
        self.tensors
            .get(&full)
            .unwrap_or_else(|| panic!("reference: missing {full}"))
    }

    /// The logits and output `y` of each row, the rows one sequence in order, each
    /// attending to itself and the rows before it.
    pub fn forward(&self, rows: &[Row]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let h = self.n("hidden_size");
        let eps = self.config["rms_norm_eps"].as_f64().unwrap();
        let embed = self.t("model.embed_tokens.weight");
        let z: Vec<Vec<f64>> = rows
            .iter()
            .map(|r| {
                let t = r.token as usize;
                let e = if r.position == 0 {
                    vec![0.0; h]
                } else {
                    embed[t * h..(t + 1) * h].to_vec()
                };
                let mut u = rms(&e, self.t("{L}.enorm.weight"), eps);
                u.extend(rms(&r.feature, self.t("{L}.hnorm.weight"), eps));
                matvec(self.t("{L}.eh_proj.weight"), &u, h)
            })
            .collect();
        let x: Vec<Vec<f64>> = z
            .iter()
            .map(|z| rms(z, self.t("{L}.input_layernorm.weight"), eps))
            .collect();
        let positions: Vec<usize> = rows.iter().map(|r| r.position).collect();
        let attn = self.attention(&x, &positions);
        let mut logits = Vec::new();
        let mut ys = Vec::new();
        for (z, a) in z.iter().zip(&attn) {
            let h1: Vec<f64> = z.iter().zip(a).map(|(z, a)| z + a).collect();
            let n = rms(&h1, self.t("{L}.post_attention_layernorm.weight"), eps);
            let mlp = self.moe(&n);
            let y: Vec<f64> = h1.iter().zip(&mlp).map(|(a, b)| a + b).collect();
            let normed = rms(&y, self.t("{L}.shared_head.norm.weight"), eps);
            let vocab = self.n("vocab_size");
            logits.push(matvec(
                self.t("{L}.shared_head.head.weight"),
                &normed,
                vocab,
            ));
            ys.push(y);
        }
        (logits, ys)
    }

    /// Latent attention, decompressed: `o_proj` of each head's causal attention.
    fn attention(&self, x: &[Vec<f64>], positions: &[usize]) -> Vec<Vec<f64>> {
        let (h, heads) = (self.n("hidden_size"), self.n("num_attention_heads"));
        let (l, r) = (self.n("kv_lora_rank"), self.n("qk_rope_head_dim"));
        let (p, v) = (self.n("qk_nope_head_dim"), self.n("v_head_dim"));
        let eps = self.config["rms_norm_eps"].as_f64().unwrap();
        let (inv_freq, magnitude, mscale) = self.yarn(r);
        let scale = ((p + r) as f64).powf(-0.5) * mscale * mscale;
        // Per row: each head's [q_nope | q_pe] (rotated), each head's k_nope and v, one k_pe.
        let mut q = Vec::new();
        let mut k_nope = Vec::new();
        let mut values = Vec::new();
        let mut k_pe = Vec::new();
        for (row, &pos) in x.iter().zip(positions) {
            let rank = self.n("q_lora_rank");
            let qa = matvec(self.t("{L}.self_attn.q_a_proj.weight"), row, rank);
            let qa = rms(&qa, self.t("{L}.self_attn.q_a_layernorm.weight"), eps);
            let mut qr = matvec(
                self.t("{L}.self_attn.q_b_proj.weight"),
                &qa,
                heads * (p + r),
            );
            for head in qr.chunks_mut(p + r) {
                rotate_pairs(&mut head[p..], pos, &inv_freq, magnitude);
            }
            q.push(qr);
            let kv = matvec(
                self.t("{L}.self_attn.kv_a_proj_with_mqa.weight"),
                row,
                l + r,
            );
            let c = rms(&kv[..l], self.t("{L}.self_attn.kv_a_layernorm.weight"), eps);
            let mut pe = kv[l..].to_vec();
            rotate_pairs(&mut pe, pos, &inv_freq, magnitude);
            k_pe.push(pe);
            let kvb = matvec(
                self.t("{L}.self_attn.kv_b_proj.weight"),
                &c,
                heads * (p + v),
            );
            k_nope.push(
                kvb.chunks(p + v)
                    .map(|hd| hd[..p].to_vec())
                    .collect::<Vec<_>>(),
            );
            values.push(
                kvb.chunks(p + v)
                    .map(|hd| hd[p..].to_vec())
                    .collect::<Vec<_>>(),
            );
        }
        (0..x.len())
            .map(|i| {
                let mut out = Vec::with_capacity(heads * v);
                for head in 0..heads {
                    let qh = &q[i][head * (p + r)..(head + 1) * (p + r)];
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            (dot(&qh[..p], &k_nope[j][head]) + dot(&qh[p..], &k_pe[j])) * scale
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = e.iter().sum();
                    let mut o = vec![0.0; v];
                    for (j, weight) in e.iter().enumerate() {
                        o.iter_mut()
                            .zip(&values[j][head])
                            .for_each(|(o, x)| *o += weight * x);
                    }
                    out.extend(o.iter().map(|o| o / total));
                }
                matvec(self.t("{L}.self_attn.o_proj.weight"), &out, h)
            })
            .collect()
    }

    /// YaRN's inverse frequencies over `dim`, the factor cos and sin are scaled by, and the
    /// softmax's `mscale` (of `mscale_all_dim`).
    fn yarn(&self, dim: usize) -> (Vec<f64>, f64, f64) {
        let rope = &self.config["rope_parameters"];
        let rope = if rope.is_object() {
            rope
        } else {
            &self.config["rope_scaling"]
        };
        let theta = rope["rope_theta"]
            .as_f64()
            .or(self.config["rope_theta"].as_f64())
            .unwrap();
        let factor = rope["factor"].as_f64().unwrap();
        let old = rope["original_max_position_embeddings"].as_f64().unwrap();
        let (fast, slow) = (
            rope["beta_fast"].as_f64().unwrap(),
            rope["beta_slow"].as_f64().unwrap(),
        );
        let m = |s: f64| 0.1 * s * factor.ln() + 1.0;
        let (ms, all) = (
            rope["mscale"].as_f64().unwrap(),
            rope["mscale_all_dim"].as_f64().unwrap(),
        );
        let d = dim as f64;
        let correction = |turns: f64| d * (old / (turns * 2.0 * PI)).ln() / (2.0 * theta.ln());
        let low = correction(fast).floor().max(0.0);
        let high = correction(slow).ceil().min(d - 1.0);
        let inv = (0..dim / 2)
            .map(|i| {
                let f = theta.powf(-2.0 * i as f64 / d);
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                f / factor * ramp + f * (1.0 - ramp)
            })
            .collect();
        (inv, m(ms) / m(all), m(all))
    }

    /// The mixture: sigmoid scores, the best groups by their best two (bias added), the
    /// best experts in them, their scores normalised and scaled, plus the shared expert.
    fn moe(&self, x: &[f64]) -> Vec<f64> {
        let h = self.n("hidden_size");
        let experts = self.n("n_routed_experts");
        let (groups, top_groups, k) = (
            self.n("n_group"),
            self.n("topk_group"),
            self.n("num_experts_per_tok"),
        );
        let logits = matvec(self.t("{L}.mlp.gate.weight"), x, experts);
        let scores: Vec<f64> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
        let bias = self.t("{L}.mlp.gate.e_score_correction_bias");
        let choice: Vec<f64> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
        let per = experts / groups;
        let group_score = |g: usize| {
            let mut s: Vec<f64> = choice[g * per..(g + 1) * per].to_vec();
            s.sort_by(|a, b| b.partial_cmp(a).unwrap());
            s[0] + s[1]
        };
        let mut order: Vec<usize> = (0..groups).collect();
        order.sort_by(|&a, &b| group_score(b).partial_cmp(&group_score(a)).unwrap());
        let allowed: Vec<usize> = order[..top_groups]
            .iter()
            .flat_map(|&g| g * per..(g + 1) * per)
            .collect();
        let mut picked = allowed.clone();
        picked.sort_by(|&a, &b| choice[b].partial_cmp(&choice[a]).unwrap());
        picked.truncate(k);
        let total: f64 = picked.iter().map(|&e| scores[e]).sum();
        let scaling = self.config["routed_scaling_factor"].as_f64().unwrap();
        let mut out = self.expert("{L}.mlp.shared_experts", x, h);
        for &e in &picked {
            let w = scores[e] / total * scaling;
            let y = self.expert(&format!("{{L}}.mlp.experts.{e}"), x, h);
            out.iter_mut().zip(&y).for_each(|(o, y)| *o += w * y);
        }
        out
    }

    /// `down(silu(gate(x)) * up(x))` of the MLP at `prefix`.
    fn expert(&self, prefix: &str, x: &[f64], h: usize) -> Vec<f64> {
        let gate = self.t(&format!("{prefix}.gate_proj.weight"));
        let inter = gate.len() / h;
        let g = matvec(gate, x, inter);
        let u = matvec(self.t(&format!("{prefix}.up_proj.weight")), x, inter);
        let act: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        matvec(self.t(&format!("{prefix}.down_proj.weight")), &act, h)
    }
}

/// Rotates interleaved pairs `(2i, 2i + 1)` of `x` by `pos * inv_freq[i]`, scaled.
fn rotate_pairs(x: &mut [f64], pos: usize, inv_freq: &[f64], magnitude: f64) {
    for (i, f) in inv_freq.iter().enumerate() {
        let (s, c) = (pos as f64 * f).sin_cos();
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        x[2 * i] = (a * c - b * s) * magnitude;
        x[2 * i + 1] = (b * c + a * s) * magnitude;
    }
}

/// Largest |ours - theirs| relative to the largest |theirs|.
pub fn relative_error(ours: &[f32], theirs: &[f64]) -> f64 {
    assert_eq!(ours.len(), theirs.len());
    let scale = theirs.iter().fold(0f64, |m, v| m.max(v.abs()));
    let diff = ours
        .iter()
        .zip(theirs)
        .fold(0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
    diff / scale
}
