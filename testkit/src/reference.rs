//! A dense float64 reference forward for Llama-family models, written separately from the
//! engine: it reads config.json and the safetensors itself, keeps the whole sequence's K
//! and V in plain vectors (no paging) and shares no attention or rotary code with the
//! engine.

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::collections::HashMap;
use std::f64::consts::PI;
use std::path::Path;

/// Logits (float64) at every position of `tokens` for the model in `model_dir`.
pub fn logits_f64(model_dir: &Path, tokens: &[u32]) -> Vec<Vec<f64>> {
    RefModel::load(model_dir).forward(tokens)
}

/// The reference model: config values and every tensor widened to f64.
pub struct RefModel {
    config: Value,
    tensors: HashMap<String, Vec<f64>>,
}

impl RefModel {
    /// Reads config.json and model.safetensors from `dir`.
    pub fn load(dir: &Path) -> RefModel {
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, widen(view.dtype(), view.data())))
            .collect();
        RefModel { config, tensors }
    }

    fn usize(&self, key: &str) -> usize {
        self.config[key].as_u64().unwrap() as usize
    }

    fn t(&self, name: &str) -> &[f64] {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("reference: missing {name}"))
    }

    /// Logits at every position.
    pub fn forward(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        self.forward_recording(tokens).0
    }

    /// Logits at every position, and the input of every layer (`[layer][position]`): the
    /// embedding for layer 0, the residual stream after layer l-1 for layer l.
    pub fn forward_recording(&self, tokens: &[u32]) -> (Vec<Vec<f64>>, Vec<Vec<Vec<f64>>>) {
        let h = self.usize("hidden_size");
        let heads = self.usize("num_attention_heads");
        let kv_heads = self.usize("num_key_value_heads");
        let d = self.config["head_dim"]
            .as_u64()
            .map(|v| v as usize)
            .unwrap_or(h / heads);
        let inter = self.usize("intermediate_size");
        let vocab = self.usize("vocab_size");
        let eps = self.config["rms_norm_eps"].as_f64().unwrap();
        let model_type = self.config["model_type"]
            .as_str()
            .unwrap_or("llama")
            .to_string();
        let inv_freq = inverse_frequencies(&self.config, d);
        let n = tokens.len();
        let embed = self.t("model.embed_tokens.weight");
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| embed[t as usize * h..(t as usize + 1) * h].to_vec())
            .collect();
        let mut layer_inputs = Vec::new();
        for l in 0..self.usize("num_hidden_layers") {
            layer_inputs.push(x.clone());
            let p = format!("model.layers.{l}");
            let normed: Vec<Vec<f64>> = x
                .iter()
                .map(|r| rms(r, self.t(&format!("{p}.input_layernorm.weight")), eps))
                .collect();
            let proj = |name: &str, rows: usize| -> Vec<Vec<f64>> {
                let w = self.t(&format!("{p}.self_attn.{name}_proj.weight"));
                let bias = self.tensors.get(&format!("{p}.self_attn.{name}_proj.bias"));
                normed
                    .iter()
                    .map(|r| {
                        let mut y = matvec(w, r, rows);
                        if let Some(b) = bias {
                            y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
                        }
                        y
                    })
                    .collect()
            };
            let mut q = proj("q", heads * d);
            let mut k = proj("k", kv_heads * d);
            let v = proj("v", kv_heads * d);
            if model_type == "qwen3" {
                let qn = self.t(&format!("{p}.self_attn.q_norm.weight"));
                let kn = self.t(&format!("{p}.self_attn.k_norm.weight"));
                for row in q.iter_mut() {
                    for hd in row.chunks_mut(d) {
                        hd.copy_from_slice(&rms(hd, qn, eps));
                    }
                }
                for row in k.iter_mut() {
                    for hd in row.chunks_mut(d) {
                        hd.copy_from_slice(&rms(hd, kn, eps));
                    }
                }
            }
            for (pos, (qr, kr)) in q.iter_mut().zip(k.iter_mut()).enumerate() {
                for hd in qr.chunks_mut(d) {
                    rotate_half_split(hd, pos, &inv_freq);
                }
                for hd in kr.chunks_mut(d) {
                    rotate_half_split(hd, pos, &inv_freq);
                }
            }
            let group = heads / kv_heads;
            let scale = 1.0 / (d as f64).sqrt();
            let wo = self.t(&format!("{p}.self_attn.o_proj.weight"));
            for i in 0..n {
                let mut attn = vec![0.0; heads * d];
                for hh in 0..heads {
                    let kvh = hh / group;
                    let qh = &q[i][hh * d..(hh + 1) * d];
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| dot(qh, &k[j][kvh * d..(kvh + 1) * d]) * scale)
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, ej) in e.iter().enumerate() {
                        for c in 0..d {
                            attn[hh * d + c] += ej / z * v[j][kvh * d + c];
                        }
                    }
                }
                let o = matvec(wo, &attn, h);
                x[i].iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            }
            let post = self.t(&format!("{p}.post_attention_layernorm.weight"));
            let gate = self.t(&format!("{p}.mlp.gate_proj.weight"));
            let up = self.t(&format!("{p}.mlp.up_proj.weight"));
            let down = self.t(&format!("{p}.mlp.down_proj.weight"));
            for row in x.iter_mut() {
                let hn = rms(row, post, eps);
                let g = matvec(gate, &hn, inter);
                let u = matvec(up, &hn, inter);
                let act: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let dn = matvec(down, &act, h);
                row.iter_mut().zip(&dn).for_each(|(x, d)| *x += d);
            }
        }
        let head = self
            .tensors
            .get("lm_head.weight")
            .map(|v| v.as_slice())
            .unwrap_or(embed);
        let norm = self.t("model.norm.weight");
        let logits = x
            .iter()
            .map(|r| matvec(head, &rms(r, norm, eps), vocab))
            .collect();
        (logits, layer_inputs)
    }
}

pub fn widen(dtype: Dtype, data: &[u8]) -> Vec<f64> {
    match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        other => panic!("reference: unsupported dtype {other:?}"),
    }
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `w` is `[rows, x.len()]` row-major; returns `w @ x`.
pub fn matvec(w: &[f64], x: &[f64], rows: usize) -> Vec<f64> {
    (0..rows)
        .map(|r| dot(&w[r * x.len()..(r + 1) * x.len()], x))
        .collect()
}

pub fn rms(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(x, w)| x * r * w).collect()
}

/// Per-pair inverse frequencies, with Hugging Face's "linear" and "llama3" scaling.
fn inverse_frequencies(config: &Value, d: usize) -> Vec<f64> {
    let theta = config["rope_theta"].as_f64().unwrap_or(10000.0);
    let base: Vec<f64> = (0..d / 2)
        .map(|i| 1.0 / theta.powf(2.0 * i as f64 / d as f64))
        .collect();
    let scaling = &config["rope_scaling"];
    let kind = scaling["rope_type"]
        .as_str()
        .or(scaling["type"].as_str())
        .unwrap_or("default");
    match kind {
        "default" => base,
        "linear" => {
            let factor = scaling["factor"].as_f64().unwrap();
            base.iter().map(|f| f / factor).collect()
        }
        "llama3" => {
            let factor = scaling["factor"].as_f64().unwrap();
            let low = scaling["low_freq_factor"].as_f64().unwrap();
            let high = scaling["high_freq_factor"].as_f64().unwrap();
            let old = scaling["original_max_position_embeddings"]
                .as_f64()
                .unwrap();
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * PI / f;
                    if wavelen < old / high {
                        f
                    } else if wavelen > old / low {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        other => panic!("reference: rope scaling {other} not modelled"),
    }
}

/// Hugging Face's rotate_half layout: pairs are (i, i + d/2).
fn rotate_half_split(x: &mut [f64], pos: usize, inv_freq: &[f64]) {
    let half = x.len() / 2;
    for (i, f) in inv_freq.iter().enumerate() {
        let angle = pos as f64 * f;
        let (s, c) = angle.sin_cos();
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/// The index of the largest value of `row` (the first among ties).
pub fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as u32
}
