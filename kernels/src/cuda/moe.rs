//! The launchers of the mixture-of-experts kernels (`cuda/moe.cu`): each row's route from
//! its router logits ([`moe_route`]), the (row, slot) pairs sorted by expert
//! ([`moe_sort`]), each expert's gated activation and down projection over its pairs
//! ([`moe_gate_up_act`], [`moe_down`]) and the weighted sum of a row's experts
//! ([`moe_combine`]). Nothing goes through the host and every grid depends on the layer's
//! shape and the row count alone, never on the routing, so a graph captured for `n` rows
//! serves every step of `n` rows. A row's results do not depend on the rest of its batch.

use super::{grid, CudaKernels};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError};
use half::bf16;

/// The most routed experts a layer may have (`MOE_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 512;
/// The most experts a token may go to (`MOE_MAX_K`).
pub const MAX_EXPERTS_PER_TOKEN: usize = 16;

/// Rows (a warp each) per block of `moe_route` (`MOE_ROUTE_WARPS`).
const ROUTE_WARPS: usize = 4;
/// Warps of the one block of `moe_sort` (`MOE_SORT_WARPS`).
const SORT_WARPS: usize = 16;
/// Warps per block of the expert products (`MOE_WARPS`).
const EXPERT_WARPS: usize = 8;
/// Weight rows a warp of the expert products streams at once (`MOE_WARP_ROWS`): two
/// columns of the gated product (gate and up rows each), four of the down projection.
const WARP_ROWS: usize = 4;
/// Threads of a block (one row) of `moe_combine` (`MOE_COMBINE_THREADS`).
const COMBINE_THREADS: u32 = 256;
/// The pass sizes of the expert products: pairs that share one pass over the weights.
const PASS_PAIRS: [usize; 4] = [1, 2, 4, 8];
/// Pair tiles (8 pairs each) of one pass of the tensor-core expert products (`moe_mma.cu`).
const MMA_PASS_TILES: [usize; 3] = [1, 2, 4];
/// Warps of the tensor-core products that share one tile of weight rows (`MOE_MMA_SPLIT`).
const MMA_SPLIT: usize = 4;
/// Output columns a block of the tensor-core products covers: [`EXPERT_WARPS`] warps
/// (`MOE_MMA_WARPS`), [`MMA_SPLIT`] a tile, of 8 gated columns a tile.
const MMA_GATE_UP_COLS: usize = EXPERT_WARPS / MMA_SPLIT * 8;
/// The same for the down projection: 16 columns a tile.
const MMA_DOWN_COLS: usize = EXPERT_WARPS / MMA_SPLIT * 16;
/// The most dynamic shared memory a block of the expert products stages its pass's rows
/// in: within the 48 KiB every device grants without opting in.
const STAGE_MAX_BYTES: usize = 44 * 1024;

/// How router scores choose experts (the routing fields of the model's `MoeConfig`), as
/// `route()` of the CPU's mixture (`models/src/llama/moe.rs`) applies them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRouting {
    /// Routed experts E, 1 to [`MAX_EXPERTS`].
    pub num_experts: usize,
    /// Experts per token K, 1 to [`MAX_EXPERTS_PER_TOKEN`] (and at most E).
    pub experts_per_token: usize,
    /// Scores are sigmoid(logit) rather than the softmax over all E experts.
    pub sigmoid: bool,
    /// Groups of consecutive experts (1: no group selection); divides E.
    pub groups: usize,
    /// Groups whose experts stay candidates (1 to `groups`; unused with one group).
    pub top_groups: usize,
    /// A group is scored by the sum of its best two choice scores (else by its best one).
    pub group_top_two: bool,
    /// The chosen experts' weights are divided by their sum (+1e-20).
    pub normalize: bool,
    /// The weights are multiplied by this.
    pub routed_scaling: f32,
}

impl MoeRouting {
    /// Panics (naming `what`) unless the routing is one the kernels serve.
    fn check(&self, what: &str) {
        let (e, k) = (self.num_experts, self.experts_per_token);
        assert!(
            (1..=MAX_EXPERTS).contains(&e),
            "{what}: {e} experts (1 to {MAX_EXPERTS})"
        );
        assert!(
            (1..=MAX_EXPERTS_PER_TOKEN.min(e)).contains(&k),
            "{what}: {k} experts a token of {e} (at most {MAX_EXPERTS_PER_TOKEN})"
        );
        assert!(
            self.groups >= 1 && e.is_multiple_of(self.groups),
            "{what}: {} groups of {e} experts",
            self.groups
        );
        assert!(
            self.groups == 1 || (1..=self.groups).contains(&self.top_groups),
            "{what}: the best {} of {} groups",
            self.top_groups,
            self.groups
        );
    }
}

/// `value` as a kernel's int, panicking (naming `what`) past `i32::MAX`.
fn int(what: &str, value: usize) -> i32 {
    i32::try_from(value).unwrap_or_else(|_| panic!("{what}: {value} is past i32"))
}

/// Panics (naming `what` and `name`) unless `view` starts on a 16-byte boundary.
fn check_aligned<T>(what: &str, name: &str, stream: &CudaStream, view: &CudaView<T>) {
    let address = view.device_ptr(stream).0;
    assert!(
        address.is_multiple_of(16),
        "{what}: {name} is not 16-byte aligned"
    );
}

/// Each of the `n` rows' route from its router logits (`[n, E]` f32) and, where the model
/// has one, the score bias (`[E]` f32): `experts[row * K + slot]` its K experts, best first,
/// and `weights[row * K + slot]` their weights (`[n * K]` each). The choices are those of
/// the CPU's `route()`: softmax (max-subtracted) or sigmoid scores in f32, choice scores
/// the scores plus the bias, the best `top_groups` groups by their best (or best two)
/// choice scores, the best K experts among theirs, largest first, ties to the lower index
/// (in `f32::total_cmp`'s order); the weights are the chosen experts' scores without the
/// bias, normalised if asked, times `routed_scaling`. One warp per row, four rows a block.
#[allow(clippy::too_many_arguments)]
pub fn moe_route(
    k: &CudaKernels,
    stream: &CudaStream,
    logits: &CudaView<f32>,
    bias: Option<&CudaView<f32>>,
    routing: &MoeRouting,
    n: usize,
    experts: &mut CudaViewMut<i32>,
    weights: &mut CudaViewMut<f32>,
) -> Result<(), DriverError> {
    routing.check("moe_route");
    let (e, kk) = (routing.num_experts, routing.experts_per_token);
    assert!(
        logits.len() >= n * e && experts.len() >= n * kk && weights.len() >= n * kk,
        "moe_route: short buffers for {n} rows"
    );
    assert!(
        bias.is_none_or(|b| b.len() >= e),
        "moe_route: a bias shorter than the experts"
    );
    let n_i = int("moe_route", n);
    if n == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(n.div_ceil(ROUTE_WARPS)).expect("moe_route: grid too large");
    let (e_i, k_i) = (e as i32, kk as i32);
    let (groups, top_groups) = (routing.groups as i32, routing.top_groups as i32);
    let sigmoid = i32::from(routing.sigmoid);
    let top_two = i32::from(routing.group_top_two);
    let normalize = i32::from(routing.normalize);
    // A null pointer where there is no bias (the kernel reads none).
    let null = 0u64;
    let mut launch = k.launch(stream, "moe_route");
    launch.arg(logits);
    match bias {
        Some(b) => launch.arg(b),
        None => launch.arg(&null),
    };
    launch
        .arg(&n_i)
        .arg(&e_i)
        .arg(&k_i)
        .arg(&sigmoid)
        .arg(&groups)
        .arg(&top_groups)
        .arg(&top_two)
        .arg(&normalize)
        .arg(&routing.routed_scaling)
        .arg(&mut *experts)
        .arg(&mut *weights);
    // SAFETY: the parameters are the kernel's, in order; a warp reads row r's E logits and
    // the E biases and writes row r's K experts and weights, for r < n (all checked above).
    unsafe { launch.launch(grid(blocks, (32 * ROUTE_WARPS) as u32, 0)) }?;
    Ok(())
}

/// Experts (a warp each) and rows per block of `moe_router_logits` (`MOE_ROUTER_WARPS`,
/// `MOE_ROUTER_ROWS`).
const ROUTER_WARPS: usize = 8;
const ROUTER_ROWS: usize = 8;

/// The router's logits in f32, `logits[r * E + e] = x[r] · w[e]` for the `n` rows of `x`
/// (`[n, h]` bf16) and a router kept in f32 (`w`, `[E, h]`): each sum in an order fixed by
/// `h`, so a row's logits do not depend on the batch. Requires `h % 4 == 0` and 16-byte
/// aligned buffers.
#[allow(clippy::too_many_arguments)]
pub fn moe_router_logits(
    k: &CudaKernels,
    stream: &CudaStream,
    x: &CudaView<bf16>,
    w: &CudaView<f32>,
    n: usize,
    h: usize,
    num_experts: usize,
    logits: &mut CudaViewMut<f32>,
) -> Result<(), DriverError> {
    const WHAT: &str = "moe_router_logits";
    assert!(
        h > 0 && h.is_multiple_of(4),
        "{WHAT}: hidden {h} is not a multiple of 4"
    );
    assert!(
        x.len() >= n * h && w.len() >= num_experts * h && logits.len() >= n * num_experts,
        "{WHAT}: short buffers for {n} rows"
    );
    let (n_i, h_i, e_i) = (int(WHAT, n), int(WHAT, h), int(WHAT, num_experts));
    if n == 0 || num_experts == 0 {
        return Ok(());
    }
    check_aligned(WHAT, "x", stream, x);
    check_aligned(WHAT, "w", stream, w);
    let tiles = num_experts.div_ceil(ROUTER_WARPS);
    let blocks = u32::try_from(tiles * n.div_ceil(ROUTER_ROWS)).expect("grid too large");
    let mut launch = k.launch(stream, "moe_router_logits");
    launch
        .arg(x)
        .arg(w)
        .arg(&n_i)
        .arg(&h_i)
        .arg(&e_i)
        .arg(&mut *logits);
    // SAFETY: the parameters are the kernel's, in order; a warp reads expert e's row of w
    // and rows below n of x, and writes their logits (all inside the buffers, checked
    // above), with 16-byte aligned vector loads (checked above; h % 4 keeps every row so).
    unsafe { launch.launch(grid(blocks, (32 * ROUTER_WARPS) as u32, 0)) }?;
    Ok(())
}

/// Counting sort of the `n * K` (row, slot) pairs of `experts` (`[n * K]`, from
/// [`moe_route`]) by expert, stable (row order within an expert): `offsets[e] ..
/// offsets[e + 1]` are expert e's sorted positions (`[E + 1]`); `pair_rows[pos]` the row of
/// the pair at sorted position pos; `slot_pos[row * K + slot]` the sorted position of that
/// pair (`[n * K]` each). A pair naming no expert (an id outside `0 .. E`, which a route
/// never writes) is left out, with `slot_pos` -1. One block of 16 warps, integer counts
/// only: the result is deterministic.
#[allow(clippy::too_many_arguments)]
pub fn moe_sort(
    k: &CudaKernels,
    stream: &CudaStream,
    experts: &CudaView<i32>,
    n: usize,
    routing: &MoeRouting,
    offsets: &mut CudaViewMut<i32>,
    pair_rows: &mut CudaViewMut<i32>,
    slot_pos: &mut CudaViewMut<i32>,
) -> Result<(), DriverError> {
    routing.check("moe_sort");
    let (e, kk) = (routing.num_experts, routing.experts_per_token);
    let pairs = n * kk;
    assert!(
        experts.len() >= pairs
            && offsets.len() > e
            && pair_rows.len() >= pairs
            && slot_pos.len() >= pairs,
        "moe_sort: short buffers for {n} rows"
    );
    // Below i32::MAX / 2: the kernel's int segment bounds run up to twice the pairs.
    let pairs_i = int("moe_sort", 2 * pairs) / 2;
    let (e_i, k_i) = (e as i32, kk as i32);
    let mut launch = k.launch(stream, "moe_sort");
    launch
        .arg(experts)
        .arg(&pairs_i)
        .arg(&e_i)
        .arg(&k_i)
        .arg(&mut *offsets)
        .arg(&mut *pair_rows)
        .arg(&mut *slot_pos);
    // SAFETY: the parameters are the kernel's, in order; it reads the n * K experts and
    // writes E + 1 offsets and n * K positions and rows (all checked above); a position is
    // below the count of valid pairs, at most n * K.
    unsafe { launch.launch(grid(1, (32 * SORT_WARPS) as u32, 0)) }?;
    Ok(())
}

/// The kernel of the expert products' `family` for steps of `n` rows of `depth`-deep dot
/// products, and the dynamic shared memory its blocks stage their rows in: the pass size
/// (pairs per pass over the weights) is the smallest of [`PASS_PAIRS`] that holds `n`, since
/// an expert serves at most one pair of each row; the `_staged` kernel where a pass's rows
/// fit [`STAGE_MAX_BYTES`]. Every choice gives a pair the same bits.
fn expert_kernel(family: &str, n: usize, depth: usize) -> (String, u32) {
    let last = PASS_PAIRS[PASS_PAIRS.len() - 1];
    let pass = PASS_PAIRS.into_iter().find(|&p| p >= n).unwrap_or(last);
    let bytes = pass * depth * std::mem::size_of::<bf16>();
    if bytes <= STAGE_MAX_BYTES {
        (format!("{family}_p{pass}_staged"), bytes as u32)
    } else {
        (format!("{family}_p{pass}"), 0)
    }
}

/// The kernel of the expert products' `family` for `n` rows of `depth`-deep dot products,
/// its dynamic shared memory and the output columns a block covers: the tensor-core kernel
/// (`moe_mma.cu`) where the device has bf16 tensor cores and `depth % 32 == 0`, its pass
/// the fewest 8-pair tiles that hold `n`; else the streaming kernel of [`expert_kernel`].
/// The choice depends on the device and the shape, and within a kernel family every pass
/// size gives a pair the same bits, so a row's result does not depend on the batch.
fn expert_launch(
    tensor_cores: bool,
    family: &str,
    n: usize,
    depth: usize,
    columns: (usize, usize),
) -> (String, u32, usize) {
    if tensor_cores && depth.is_multiple_of(32) {
        let last = MMA_PASS_TILES[MMA_PASS_TILES.len() - 1];
        let tiles = MMA_PASS_TILES
            .into_iter()
            .find(|&t| 8 * t >= n)
            .unwrap_or(last);
        (format!("{family}_mma{tiles}"), 0, columns.1)
    } else {
        let (kernel, staged) = expert_kernel(family, n, depth);
        (kernel, staged, columns.0)
    }
}

/// Blocks of an expert product over `e` experts of `ncols` output columns, `cols` columns
/// a block: every expert's every tile, whatever the routing.
fn expert_blocks(what: &str, e: usize, ncols: usize, cols: usize) -> u32 {
    u32::try_from(e * ncols.div_ceil(cols))
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .unwrap_or_else(|| panic!("{what}: grid too large"))
}

/// `act[pos, :] = silu(x[row] · Wg[e]ᵀ) * (x[row] · Wu[e]ᵀ)` for every sorted pair pos of
/// expert e (row = `pair_rows[pos]`, from [`moe_sort`]), into `act` (`[n * K, inter]` bf16):
/// the gate and up sums (f32, in an order fixed by `h`) rounded to bf16, as the gate/up
/// product would round them, then the activation rounded to bf16 (the dense MLP's
/// arithmetic). x is `[n, h]` bf16; w is `[E, 2 * inter, h]` bf16: expert e's gate rows
/// then its up rows. Grid: E times `inter / 16` tiles (rounded up) of 256 threads, a warp
/// per two columns, or on tensor cores (`h % 32 == 0`, see [`expert_launch`]) four warps
/// per eight; the blocks of an expert with no pairs return at once, reading
/// none of its weights. Requires `h % 8 == 0`, `inter % 8 == 0` and 16-byte aligned x and w.
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up_act(
    k: &CudaKernels,
    stream: &CudaStream,
    x: &CudaView<bf16>,
    w: &CudaView<bf16>,
    offsets: &CudaView<i32>,
    pair_rows: &CudaView<i32>,
    routing: &MoeRouting,
    h: usize,
    inter: usize,
    n: usize,
    act: &mut CudaViewMut<bf16>,
) -> Result<(), DriverError> {
    const WHAT: &str = "moe_gate_up_act";
    routing.check(WHAT);
    let (e, kk) = (routing.num_experts, routing.experts_per_token);
    let pairs = n * kk;
    assert!(
        h > 0 && inter > 0 && h.is_multiple_of(8) && inter.is_multiple_of(8),
        "{WHAT}: h {h} and inter {inter} must be multiples of 8"
    );
    assert!(
        x.len() >= n * h
            && w.len() >= e * 2 * inter * h
            && offsets.len() > e
            && pair_rows.len() >= pairs
            && act.len() >= pairs * inter,
        "{WHAT}: short buffers for {n} rows"
    );
    check_aligned(WHAT, "x", stream, x);
    check_aligned(WHAT, "w", stream, w);
    let (n_i, pairs_i, h_i, inter_i) = (
        int(WHAT, n),
        int(WHAT, pairs),
        int(WHAT, h),
        int(WHAT, inter),
    );
    if n == 0 {
        return Ok(());
    }
    let columns = (EXPERT_WARPS * WARP_ROWS / 2, MMA_GATE_UP_COLS);
    let (kernel, staged, cols) = expert_launch(k.tensor_cores(), WHAT, n, h, columns);
    let blocks = expert_blocks(WHAT, e, inter, cols);
    let mut launch = k.launch(stream, &kernel);
    launch
        .arg(x)
        .arg(w)
        .arg(offsets)
        .arg(pair_rows)
        .arg(&mut *act)
        .arg(&n_i)
        .arg(&pairs_i)
        .arg(&h_i)
        .arg(&inter_i);
    // SAFETY: the parameters are the kernel's, in order; it reads E + 1 offsets (clamped to
    // 0 ..= n * K on the device), the pairs' rows (clamped below n), rows of x and expert
    // rows of w inside their buffers and writes the pairs' rows of act (all checked above);
    // x and w are 16-byte aligned with h % 8 == 0 for its 16-byte loads, and the staged
    // rows fit the shared memory asked for.
    unsafe { launch.launch(grid(blocks, (32 * EXPERT_WARPS) as u32, staged)) }?;
    Ok(())
}

/// `out[pos, :] = act[pos] · Wd[e]ᵀ` in f32 (summed in an order fixed by `inter`) for every
/// sorted pair pos of expert e, into `out` (`[n * K, h]` f32); act is `[n * K, inter]` bf16
/// (from [`moe_gate_up_act`]), w is `[E, h, inter]` bf16. Grid: E times `h / 32` tiles
/// (rounded up) of 256 threads, a warp per four columns, or on tensor cores
/// (`inter % 32 == 0`) four warps per sixteen; the blocks of an expert with no
/// pairs return at once, reading none of its weights. Requires `h % 8 == 0`,
/// `inter % 8 == 0` and 16-byte aligned act and w.
#[allow(clippy::too_many_arguments)]
pub fn moe_down(
    k: &CudaKernels,
    stream: &CudaStream,
    act: &CudaView<bf16>,
    w: &CudaView<bf16>,
    offsets: &CudaView<i32>,
    routing: &MoeRouting,
    h: usize,
    inter: usize,
    n: usize,
    out: &mut CudaViewMut<f32>,
) -> Result<(), DriverError> {
    const WHAT: &str = "moe_down";
    routing.check(WHAT);
    let (e, kk) = (routing.num_experts, routing.experts_per_token);
    let pairs = n * kk;
    assert!(
        h > 0 && inter > 0 && h.is_multiple_of(8) && inter.is_multiple_of(8),
        "{WHAT}: h {h} and inter {inter} must be multiples of 8"
    );
    assert!(
        act.len() >= pairs * inter
            && w.len() >= e * h * inter
            && offsets.len() > e
            && out.len() >= pairs * h,
        "{WHAT}: short buffers for {n} rows"
    );
    check_aligned(WHAT, "act", stream, act);
    check_aligned(WHAT, "w", stream, w);
    let (pairs_i, h_i, inter_i) = (int(WHAT, pairs), int(WHAT, h), int(WHAT, inter));
    if n == 0 {
        return Ok(());
    }
    let columns = (EXPERT_WARPS * WARP_ROWS, MMA_DOWN_COLS);
    let (kernel, staged, cols) = expert_launch(k.tensor_cores(), WHAT, n, inter, columns);
    let blocks = expert_blocks(WHAT, e, h, cols);
    let mut launch = k.launch(stream, &kernel);
    launch
        .arg(act)
        .arg(w)
        .arg(offsets)
        .arg(&mut *out)
        .arg(&pairs_i)
        .arg(&h_i)
        .arg(&inter_i);
    // SAFETY: the parameters are the kernel's, in order; it reads E + 1 offsets (clamped to
    // 0 ..= n * K on the device), rows of act and expert rows of w inside their buffers and
    // writes the pairs' rows of out (all checked above); act and w are 16-byte aligned with
    // inter % 8 == 0 for its 16-byte loads, and the staged rows fit the shared memory
    // asked for.
    unsafe { launch.launch(grid(blocks, (32 * EXPERT_WARPS) as u32, staged)) }?;
    Ok(())
}

/// `delta[row] = bf16((shared[row] if given, else 0) + Σ weights[row, slot] *
/// out[slot_pos[row * K + slot]])` for the `n` rows (`[n, h]` bf16): the routed sum
/// accumulated in f32 from 0 in increasing order of expert index (as the CPU's `record()`
/// adds the experts), each term's product and sum rounded separately, then the shared
/// experts' bf16 output (`[n, h]`) added. `out` is [`moe_down`]'s `[n * K, h]`, `experts`
/// and `weights` [`moe_route`]'s, `slot_pos` [`moe_sort`]'s. Grid: one block of 256
/// threads per row.
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(
    k: &CudaKernels,
    stream: &CudaStream,
    out: &CudaView<f32>,
    experts: &CudaView<i32>,
    weights: &CudaView<f32>,
    slot_pos: &CudaView<i32>,
    shared: Option<&CudaView<bf16>>,
    routing: &MoeRouting,
    h: usize,
    n: usize,
    delta: &mut CudaViewMut<bf16>,
) -> Result<(), DriverError> {
    const WHAT: &str = "moe_combine";
    routing.check(WHAT);
    let (e, kk) = (routing.num_experts, routing.experts_per_token);
    let pairs = n * kk;
    assert!(
        out.len() >= pairs * h
            && experts.len() >= pairs
            && weights.len() >= pairs
            && slot_pos.len() >= pairs
            && delta.len() >= n * h,
        "{WHAT}: short buffers for {n} rows"
    );
    assert!(
        shared.is_none_or(|s| s.len() >= n * h),
        "{WHAT}: shared output shorter than {n} rows"
    );
    let (n_i, pairs_i, h_i) = (int(WHAT, n), int(WHAT, pairs), int(WHAT, h));
    if n == 0 || h == 0 {
        return Ok(());
    }
    let stretches = h.div_ceil(COMBINE_THREADS as usize);
    let blocks = u32::try_from(n * stretches).expect("moe_combine: grid too large");
    let (k_i, e_i) = (kk as i32, e as i32);
    // A null pointer where there are no shared experts (the kernel reads none).
    let null = 0u64;
    let mut launch = k.launch(stream, "moe_combine");
    launch.arg(out).arg(experts).arg(weights).arg(slot_pos);
    match shared {
        Some(s) => launch.arg(s),
        None => launch.arg(&null),
    };
    launch
        .arg(&n_i)
        .arg(&k_i)
        .arg(&e_i)
        .arg(&h_i)
        .arg(&pairs_i)
        .arg(&mut *delta);
    // SAFETY: the parameters are the kernel's, in order; the blocks of row r read its K
    // experts, weights and positions, rows of out only at positions below n * K (checked
    // on the device) and row r of shared, and write their columns of row r of delta, for
    // r < n (all checked above).
    unsafe { launch.launch(grid(blocks, COMBINE_THREADS, 0)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_source_agrees_with_the_host_constants() {
        let source = include_str!("../../cuda/moe.cu");
        for (name, value) in [
            ("MOE_MAX_EXPERTS", MAX_EXPERTS),
            ("MOE_MAX_K", MAX_EXPERTS_PER_TOKEN),
            ("MOE_ROUTE_WARPS", ROUTE_WARPS),
            ("MOE_SORT_WARPS", SORT_WARPS),
            ("MOE_WARPS", EXPERT_WARPS),
            ("MOE_WARP_ROWS", WARP_ROWS),
            ("MOE_COMBINE_THREADS", COMBINE_THREADS as usize),
        ] {
            let line = format!("#define {name} {value} ");
            assert!(source.contains(&line), "{name} is not {value} in moe.cu");
        }
        let source = include_str!("../../cuda/moe_mma.cu");
        for (name, value) in [
            ("MOE_MMA_WARPS", EXPERT_WARPS),
            ("MOE_MMA_SPLIT", MMA_SPLIT),
        ] {
            let line = format!("#define {name} {value} ");
            assert!(
                source.contains(&line),
                "{name} is not {value} in moe_mma.cu"
            );
        }
    }

    #[test]
    fn every_kernel_a_launcher_names_is_in_the_source() {
        let names: Vec<&str> = super::super::kernel_names(include_str!("../../cuda/moe.cu"))
            .chain(super::super::kernel_names(include_str!(
                "../../cuda/moe_mma.cu"
            )))
            .collect();
        for family in ["moe_gate_up_act", "moe_down"] {
            for n in [1, 2, 3, 5, 8, 9, 17, 64, 4096] {
                for depth in [8, 24, 1408, 2048, 2880, 7168] {
                    for tensor_cores in [false, true] {
                        let (kernel, bytes, _) =
                            expert_launch(tensor_cores, family, n, depth, (1, 1));
                        assert!(names.contains(&kernel.as_str()), "{kernel}");
                        assert!(bytes as usize <= STAGE_MAX_BYTES);
                    }
                }
            }
        }
        for kernel in ["moe_route", "moe_sort", "moe_combine"] {
            assert!(names.contains(&kernel), "{kernel}");
        }
    }

    #[test]
    fn the_pass_holds_the_rows_up_to_eight_and_stages_what_fits() {
        assert_eq!(expert_kernel("f", 1, 2048), ("f_p1_staged".into(), 4096));
        assert_eq!(expert_kernel("f", 7, 2048), ("f_p8_staged".into(), 32768));
        assert_eq!(expert_kernel("f", 64, 1408), ("f_p8_staged".into(), 22528));
        assert_eq!(expert_kernel("f", 64, 7168), ("f_p8".into(), 0));
        assert_eq!(expert_kernel("f", 2, 7168), ("f_p2_staged".into(), 28672));
    }

    #[test]
    fn tensor_cores_take_depths_of_whole_32_chunks_in_passes_of_8_16_or_32() {
        let launch = |n, depth| expert_launch(true, "f", n, depth, (16, 32));
        assert_eq!(launch(1, 2048), ("f_mma1".into(), 0, 32));
        assert_eq!(launch(8, 1408), ("f_mma1".into(), 0, 32));
        assert_eq!(launch(9, 1408), ("f_mma2".into(), 0, 32));
        assert_eq!(launch(64, 7168), ("f_mma4".into(), 0, 32));
        // 24 is no whole chunk: the streaming kernel and its columns.
        assert_eq!(launch(1, 24), ("f_p1_staged".into(), 48, 16));
        let no_cores = expert_launch(false, "f", 1, 2048, (16, 32));
        assert_eq!(no_cores, ("f_p1_staged".into(), 4096, 16));
    }
}
