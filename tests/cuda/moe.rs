//! The mixture-of-experts kernels (`cuda/moe.cu`) against a float64 reference written here,
//! on fresh random inputs with every output poisoned first: DeepSeek-V2-style routing
//! (softmax, the best 3 of 8 groups by their best expert, scaled), V3-style (sigmoid with a
//! score bias, the best 4 of 8 groups by their best two, normalised and scaled) and
//! Qwen-style (softmax over all experts, normalised), for 1, 7 and 64 rows: the expert ids
//! exactly, the weights, the sort exactly, and each row's mixture; and a row alone giving
//! the same bits as inside a batch of 37.

use super::{assert_close, random_f32, rng, setup, to_bf16, to_f32, Setup};
use cudarc::driver::CudaSlice;
use half::bf16;
use peregrine_kernels::cuda::moe::{
    moe_combine, moe_down, moe_gate_up_act, moe_route, moe_sort, MoeRouting,
};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// One layer's shape and routing.
struct Case {
    name: &'static str,
    routing: MoeRouting,
    bias: bool,
    shared: bool,
    h: usize,
    inter: usize,
}

fn case(
    name: &'static str,
    routing: MoeRouting,
    bias: bool,
    shared: bool,
    h: usize,
    inter: usize,
) -> Case {
    Case {
        name,
        routing,
        bias,
        shared,
        h,
        inter,
    }
}

/// Softmax over all 32 experts, four a token, unscaled: what the cases change.
const PLAIN: MoeRouting = MoeRouting {
    num_experts: 32,
    experts_per_token: 4,
    sigmoid: false,
    groups: 1,
    top_groups: 1,
    group_top_two: false,
    normalize: false,
    routed_scaling: 1.0,
};

/// inter 352 = 44 pieces of 8: lanes with one piece and with two.
fn v2() -> Case {
    let routing = MoeRouting {
        num_experts: 64,
        experts_per_token: 6,
        groups: 8,
        top_groups: 3,
        routed_scaling: 1.5,
        ..PLAIN
    };
    case("v2", routing, false, true, 512, 352)
}

/// Partial column tiles of both products (120 of 16, 264 of 32).
fn v3() -> Case {
    let routing = MoeRouting {
        num_experts: 256,
        experts_per_token: 8,
        sigmoid: true,
        groups: 8,
        top_groups: 4,
        group_top_two: true,
        normalize: true,
        routed_scaling: 2.5,
    };
    case("v3", routing, true, true, 264, 120)
}

/// Eight rows of 2880 pass the staging limit: a pass of eight reads x in place.
fn qwen() -> Case {
    let routing = MoeRouting {
        normalize: true,
        ..PLAIN
    };
    case("qwen", routing, false, false, 2880, 200)
}

/// A layer's experts on the device and widened on the host.
struct Layer {
    gate_up: CudaSlice<bf16>,
    down: CudaSlice<bf16>,
    gate_up_host: Vec<f32>,
    down_host: Vec<f32>,
    bias: Option<Vec<f32>>,
}

fn layer(s: &Setup, rng: &mut ChaCha8Rng, c: &Case) -> Layer {
    let (e, h, inter) = (c.routing.num_experts, c.h, c.inter);
    let gate_up = to_bf16(&random_f32(rng, e * 2 * inter * h, 2.0 / (h as f32).sqrt()));
    let down = to_bf16(&random_f32(rng, e * h * inter, 1.7 / (inter as f32).sqrt()));
    Layer {
        gate_up: s.gpu.upload(&gate_up).unwrap(),
        down: s.gpu.upload(&down).unwrap(),
        gate_up_host: to_f32(&gate_up),
        down_host: to_f32(&down),
        bias: c.bias.then(|| random_f32(rng, e, 0.1)),
    }
}

/// A route: the experts, best first, and their weights.
type Route = (Vec<usize>, Vec<f64>);

/// The indices of `v` largest first (ties to the lower index), the first `k` of them, or
/// `None` where two of the first `k + 1` are too close for f32 and f64 to agree surely.
fn ranked(v: &[f64], k: usize) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    let clear = order.windows(2).take(k).all(|w| v[w[0]] - v[w[1]] > 1e-5);
    order.truncate(k);
    clear.then_some(order)
}

/// One row's route from its f32 logits, in f64 (`None`: too close to call, see [`ranked`]).
fn route_ref(r: &MoeRouting, logits: &[f32], bias: Option<&[f32]>) -> Option<Route> {
    let x: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    let scores: Vec<f64> = if r.sigmoid {
        x.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect()
    } else {
        let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = x.iter().map(|v| (v - max).exp()).sum();
        x.iter().map(|v| (v - max).exp() / total).collect()
    };
    let choice: Vec<f64> = (0..x.len())
        .map(|i| scores[i] + bias.map_or(0.0, |b| b[i] as f64))
        .collect();
    let per = r.num_experts / r.groups;
    let mut allowed = vec![r.groups == 1; r.num_experts];
    if r.groups > 1 {
        let group_scores: Vec<f64> = choice
            .chunks(per)
            .map(|g| {
                let mut g = g.to_vec();
                g.sort_by(|a, b| b.total_cmp(a));
                let take = if r.group_top_two { 2 } else { 1 };
                g.iter().take(take).sum()
            })
            .collect();
        for g in ranked(&group_scores, r.top_groups)? {
            allowed[g * per..(g + 1) * per].fill(true);
        }
    }
    let masked: Vec<f64> = choice
        .iter()
        .zip(&allowed)
        .map(|(&c, &ok)| if ok { c } else { f64::NEG_INFINITY })
        .collect();
    let experts = ranked(&masked, r.experts_per_token)?;
    let mut weights: Vec<f64> = experts.iter().map(|&e| scores[e]).collect();
    let total = weights.iter().sum::<f64>() + 1e-20;
    for w in &mut weights {
        if r.normalize {
            *w /= total;
        }
        *w *= r.routed_scaling as f64;
    }
    Some((experts, weights))
}

/// A step's inputs: logits `[n, E]` (each row drawn again until its route is clear), x and
/// the shared experts' output `[n, h]`.
struct Rows {
    logits: Vec<f32>,
    x: Vec<bf16>,
    shared: Option<Vec<bf16>>,
}

fn rows(rng: &mut ChaCha8Rng, c: &Case, l: &Layer, n: usize) -> Rows {
    let e = c.routing.num_experts;
    let mut logits = Vec::with_capacity(n * e);
    for _ in 0..n {
        let row = (0..100)
            .map(|_| random_f32(rng, e, 3.0))
            .find(|row| route_ref(&c.routing, row, l.bias.as_deref()).is_some())
            .expect("a clear route in 100 draws");
        logits.extend(row);
    }
    let shared = c.shared.then(|| to_bf16(&random_f32(rng, n * c.h, 1.0)));
    let x = to_bf16(&random_f32(rng, n * c.h, 1.0));
    Rows { logits, x, shared }
}

impl Rows {
    /// Row `i` alone.
    fn row(&self, c: &Case, i: usize) -> Rows {
        let (e, h) = (c.routing.num_experts, c.h);
        Rows {
            logits: self.logits[i * e..(i + 1) * e].to_vec(),
            x: self.x[i * h..(i + 1) * h].to_vec(),
            shared: self.shared.as_ref().map(|s| s[i * h..(i + 1) * h].to_vec()),
        }
    }
}

/// What the kernels wrote.
struct Got {
    experts: Vec<i32>,
    weights: Vec<f32>,
    offsets: Vec<i32>,
    pair_rows: Vec<i32>,
    slot_pos: Vec<i32>,
    out: Vec<f32>,
    delta: Vec<bf16>,
}

/// The five kernels over `n` rows, every output poisoned first.
fn run(s: &Setup, c: &Case, l: &Layer, rows: &Rows, n: usize) -> Got {
    let (k, gpu, st) = (&*s.kernels, &s.gpu, s.gpu.stream());
    let r = &c.routing;
    let (e, pairs, h, inter) = (r.num_experts, n * r.experts_per_token, c.h, c.inter);
    let up = |v: &[f32]| gpu.upload(v).unwrap();
    let (logits, bias) = (up(&rows.logits), l.bias.as_deref().map(up));
    let up16 = |v: &[bf16]| gpu.upload(v).unwrap();
    let (x, shared) = (up16(&rows.x), rows.shared.as_deref().map(up16));
    let ints = |len: usize| gpu.upload(&vec![-7i32; len]).unwrap();
    let (mut experts, mut offsets) = (ints(pairs), ints(e + 1));
    let (mut pair_rows, mut slot_pos) = (ints(pairs), ints(pairs));
    let mut weights = up(&vec![f32::NAN; pairs]);
    let mut act = up16(&vec![bf16::NAN; pairs * inter]);
    let mut out = up(&vec![f32::NAN; pairs * h]);
    let mut delta = up16(&vec![bf16::NAN; n * h]);
    let (lg, bias) = (logits.slice(..), bias.as_ref().map(|b| b.slice(..)));
    let (mut ex, mut w) = (experts.slice_mut(..), weights.slice_mut(..));
    moe_route(k, st, &lg, bias.as_ref(), r, n, &mut ex, &mut w).unwrap();
    let (ex, mut offs) = (experts.slice(..), offsets.slice_mut(..));
    let (mut pr, mut sp) = (pair_rows.slice_mut(..), slot_pos.slice_mut(..));
    moe_sort(k, st, &ex, n, r, &mut offs, &mut pr, &mut sp).unwrap();
    let (offs, pr, mut a) = (offsets.slice(..), pair_rows.slice(..), act.slice_mut(..));
    let (x, gu, down) = (x.slice(..), l.gate_up.slice(..), l.down.slice(..));
    moe_gate_up_act(k, st, &x, &gu, &offs, &pr, r, h, inter, n, &mut a).unwrap();
    let (a, mut o) = (act.slice(..), out.slice_mut(..));
    moe_down(k, st, &a, &down, &offs, r, h, inter, n, &mut o).unwrap();
    let (o, w, sp) = (out.slice(..), weights.slice(..), slot_pos.slice(..));
    let (shared, mut d) = (shared.as_ref().map(|v| v.slice(..)), delta.slice_mut(..));
    moe_combine(k, st, &o, &ex, &w, &sp, shared.as_ref(), r, h, n, &mut d).unwrap();
    let ints = |v: &CudaSlice<i32>| gpu.download(v).unwrap();
    Got {
        experts: ints(&experts),
        weights: gpu.download(&weights).unwrap(),
        offsets: ints(&offsets),
        pair_rows: ints(&pair_rows),
        slot_pos: ints(&slot_pos),
        out: gpu.download(&out).unwrap(),
        delta: gpu.download(&delta).unwrap(),
    }
}

/// Each row's mixture in f64 over the reference routes: the gate and up sums rounded to
/// bf16, silu(g) * u rounded to bf16, the down projection, the weighted sum plus the
/// shared output.
fn reference(c: &Case, l: &Layer, rows: &Rows, routes: &[Route]) -> Vec<f32> {
    let (h, inter) = (c.h, c.inter);
    let x = to_f32(&rows.x);
    let dot = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(&p, &q)| p as f64 * q as f64)
            .sum::<f64>()
    };
    let round = |v: f64| bf16::from_f64(v).to_f64();
    let mut want = Vec::with_capacity(routes.len() * h);
    for (i, (experts, weights)) in routes.iter().enumerate() {
        let xr = &x[i * h..(i + 1) * h];
        let mut sum = vec![0f64; h];
        for (&e, &w) in experts.iter().zip(weights) {
            let gu = &l.gate_up_host[e * 2 * inter * h..(e + 1) * 2 * inter * h];
            let act: Vec<f32> = (0..inter)
                .map(|j| {
                    let g = round(dot(xr, &gu[j * h..(j + 1) * h]));
                    let u = round(dot(xr, &gu[(inter + j) * h..(inter + j + 1) * h]));
                    round(g / (1.0 + (-g).exp()) * u) as f32
                })
                .collect();
            let down = &l.down_host[e * h * inter..(e + 1) * h * inter];
            for (o, row) in sum.iter_mut().zip(down.chunks(inter)) {
                *o += w * dot(&act, row);
            }
        }
        for (col, o) in sum.iter().enumerate() {
            let shared = rows
                .shared
                .as_ref()
                .map_or(0.0, |s| s[i * h + col].to_f64());
            want.push((shared + o) as f32);
        }
    }
    want
}

/// The sort the kernels should have made of `experts`: offsets, pair rows, slot positions.
fn sorted(experts: &[i32], e: usize, k: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let mut offsets = vec![0i32; e + 1];
    for &x in experts {
        offsets[x as usize + 1] += 1;
    }
    for i in 0..e {
        offsets[i + 1] += offsets[i];
    }
    let mut next = offsets.clone();
    let (mut pair_rows, mut slot_pos) = (vec![0; experts.len()], vec![0; experts.len()]);
    for (p, &x) in experts.iter().enumerate() {
        let pos = next[x as usize];
        next[x as usize] += 1;
        pair_rows[pos as usize] = (p / k) as i32;
        slot_pos[p] = pos;
    }
    (offsets, pair_rows, slot_pos)
}

/// The case for 1, 7 and 64 rows against the reference.
fn check(s: &Setup, c: &Case) {
    let mut rng = rng(&format!("moe {}", c.name));
    let l = layer(s, &mut rng, c);
    let (e, k) = (c.routing.num_experts, c.routing.experts_per_token);
    for n in [1, 7, 64] {
        let what = format!("{} n={n}", c.name);
        let rows = rows(&mut rng, c, &l, n);
        let got = run(s, c, &l, &rows, n);
        let routes: Vec<Route> = rows
            .logits
            .chunks(e)
            .map(|row| route_ref(&c.routing, row, l.bias.as_deref()).unwrap())
            .collect();
        for (i, (experts, _)) in routes.iter().enumerate() {
            let ids: Vec<usize> = got.experts[i * k..(i + 1) * k]
                .iter()
                .map(|&x| x as usize)
                .collect();
            assert_eq!(&ids, experts, "{what}: row {i}'s experts");
        }
        let want_w: Vec<f32> = routes
            .iter()
            .flat_map(|r| r.1.iter().map(|&w| w as f32))
            .collect();
        assert_close(
            &format!("{what} weights"),
            &got.weights,
            &want_w,
            1e-6,
            1e-5,
        );
        let (offsets, pair_rows, slot_pos) = sorted(&got.experts, e, k);
        assert_eq!(got.offsets, offsets, "{what}: offsets");
        assert_eq!(got.pair_rows, pair_rows, "{what}: pair rows");
        assert_eq!(got.slot_pos, slot_pos, "{what}: slot positions");
        assert!(
            got.out.iter().all(|v| v.is_finite()),
            "{what}: an expert output left unwritten"
        );
        let want = reference(c, &l, &rows, &routes);
        assert_close(&what, &to_f32(&got.delta), &want, 2e-3, 1e-2);
    }
}

#[test]
fn v2_style_routing_and_experts_match_the_reference() {
    let Some(s) = setup() else { return };
    check(s, &v2());
}

#[test]
fn v3_style_routing_with_a_bias_and_experts_match_the_reference() {
    let Some(s) = setup() else { return };
    check(s, &v3());
}

#[test]
fn qwen_style_routing_and_experts_match_the_reference() {
    let Some(s) = setup() else { return };
    check(s, &qwen());
}

/// The bits of `v`, to compare exactly.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_row_alone_gives_the_bits_it_gives_in_a_batch_of_37() {
    let Some(s) = setup() else { return };
    // Staged rows in both (v2), read in place in the batch and staged alone (qwen).
    for c in [v2(), qwen()] {
        let mut rng = rng(&format!("moe batch invariance {}", c.name));
        let l = layer(s, &mut rng, &c);
        let (k, h) = (c.routing.experts_per_token, c.h);
        let rows = rows(&mut rng, &c, &l, 37);
        let batch = run(s, &c, &l, &rows, 37);
        for i in [0, rng.random_range(1..36), 36] {
            let alone = run(s, &c, &l, &rows.row(&c, i), 1);
            let what = format!("{} row {i} alone", c.name);
            let (slots, cols) = (i * k..(i + 1) * k, i * h..(i + 1) * h);
            let (experts, weights) = (&batch.experts[slots.clone()], &batch.weights[slots]);
            assert_eq!(alone.experts, experts, "{what}: experts");
            assert_eq!(bits(&alone.weights), bits(weights), "{what}: weights");
            let delta = to_f32(&batch.delta[cols]);
            assert_eq!(bits(&to_f32(&alone.delta)), bits(&delta), "{what}: delta");
        }
    }
}
