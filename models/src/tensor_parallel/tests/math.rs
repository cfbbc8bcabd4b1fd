//! The float64 pieces of a Llama decoder layer, plainly written, over rows of tokens.

/// `x` (`[tokens, in]`) times `w^T` (`w`: `[out, in]` row-major), plus `bias` if given.
pub fn linear(x: &[Vec<f64>], w: &[f64], bias: Option<&[f64]>) -> Vec<Vec<f64>> {
    x.iter()
        .map(|row| {
            w.chunks_exact(row.len())
                .enumerate()
                .map(|(o, wr)| {
                    let dot: f64 = wr.iter().zip(row).map(|(a, b)| a * b).sum();
                    dot + bias.map_or(0.0, |b| b[o])
                })
                .collect()
        })
        .collect()
}

/// RMSNorm of each row, times `w`.
pub fn rms_norm(x: &[Vec<f64>], w: &[f64], eps: f64) -> Vec<Vec<f64>> {
    x.iter()
        .map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter().zip(w).map(|(v, g)| v * inv * g).collect()
        })
        .collect()
}

/// The rotary embedding (half-split pairs `i`, `i + d/2`) of every `d`-wide head of each
/// row, token `t` at position `t`.
pub fn rope(x: &mut [Vec<f64>], d: usize, theta: f64) {
    for (pos, row) in x.iter_mut().enumerate() {
        for head in row.chunks_exact_mut(d) {
            for i in 0..d / 2 {
                let freq = theta.powf(-2.0 * i as f64 / d as f64);
                let (sin, cos) = (pos as f64 * freq).sin_cos();
                let (a, b) = (head[i], head[i + d / 2]);
                head[i] = a * cos - b * sin;
                head[i + d / 2] = a * sin + b * cos;
            }
        }
    }
}

/// Causal grouped-query attention: `heads` query heads over `kv_heads` key/value heads
/// (query head `h` reads KV head `h / (heads / kv_heads)`), each `d` wide.
pub fn attention(
    q: &[Vec<f64>],
    k: &[Vec<f64>],
    v: &[Vec<f64>],
    heads: usize,
    kv_heads: usize,
    d: usize,
) -> Vec<Vec<f64>> {
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    (0..q.len())
        .map(|t| {
            let mut out = vec![0.0; heads * d];
            for h in 0..heads {
                let (qh, kvh) = (&q[t][h * d..(h + 1) * d], h / group);
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        let ks = &k[s][kvh * d..(kvh + 1) * d];
                        qh.iter().zip(ks).map(|(a, b)| a * b).sum::<f64>() * scale
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exp: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = exp.iter().sum();
                for (s, e) in exp.iter().enumerate() {
                    let vs = &v[s][kvh * d..(kvh + 1) * d];
                    for (o, x) in out[h * d..(h + 1) * d].iter_mut().zip(vs) {
                        *o += e / sum * x;
                    }
                }
            }
            out
        })
        .collect()
}

/// SwiGLU: `silu(gate) * up`, element-wise.
pub fn swiglu(gate: &[Vec<f64>], up: &[Vec<f64>]) -> Vec<Vec<f64>> {
    gate.iter()
        .zip(up)
        .map(|(g, u)| {
            g.iter()
                .zip(u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect()
        })
        .collect()
}

/// `a + b`, row by row.
pub fn add(a: &[Vec<f64>], b: &[Vec<f64>]) -> Vec<Vec<f64>> {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.iter().zip(y).map(|(x, y)| x + y).collect())
        .collect()
}
