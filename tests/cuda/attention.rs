//! Paged attention and KV-cache writes on the GPU against the CPU kernels.
//!
//! Every test draws fresh random data (the seed is printed), rounds it to bf16 once, and
//! gives the GPU the bf16 values and the CPU the same values widened to f32. Outputs are
//! poisoned (NaN) before the kernels run and followed by a sentinel tail that must come back
//! untouched; caches are compared bit for bit after the writes.

use super::{assert_close, random_f32, rng, setup, setup_cuda_cores, to_bf16, to_f32, Setup};
use cudarc::driver::CudaSlice;
use half::bf16;
use peregrine_kernels::cpu::{self, AttentionSeq, KvLayout};
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_kernels::cuda::{attention as kernel, kv_write};
use peregrine_ops::cuda::attention::{
    write_kv, AttentionError, DeviceAttentionPlan, GpuPagedAttention, RotaryTable,
};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::{AttentionPlan, PlanError, SeqSpec};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

/// Tolerance of the bf16 GPU output against the f32 CPU reference computed on the same
/// bf16-rounded inputs. Rounding the output to bf16 costs at most 2^-8 (0.4 %) of its
/// value, hence RTOL; the f32 work differs only in summation order and `exp` (~1e-6), hence
/// the small ATOL for outputs near zero. Tight enough that one key too many or too few
/// (a mask off by one) shows in the short and chunked rows.
const ATOL: f32 = 2e-3;
const RTOL: f32 = 1e-2;
/// Queries are drawn from [-Q_SCALE, Q_SCALE) (keys and values from [-1, 1)), so that the
/// softmax is peaked rather than flat and a wrong key or position moves the output.
const Q_SCALE: f32 = 4.0;
/// Rows after the real ones in q and o; o's must come back untouched.
const TAIL: usize = 5;

fn sentinel() -> bf16 {
    bf16::from_f32(12_345.0)
}

/// Asserts two bf16 buffers are bit-identical, naming the first difference.
fn assert_same_bits(what: &str, got: &[bf16], want: &[bf16]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i}: got {}, want {}", got[i], want[i]);
    }
}

/// Bf16 values held in f32.
fn rounded(values: Vec<f32>) -> Vec<f32> {
    to_f32(&to_bf16(&values))
}

/// Heads and cache geometry of a test.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
}

impl Geometry {
    fn layout(&self, num_blocks: usize) -> KvLayout {
        KvLayout {
            num_blocks: num_blocks as u64,
            block_size: self.block_size as u64,
            num_kv_heads: self.kv_heads as u64,
            head_dim: self.head_dim as u64,
        }
    }

    /// Width of q and o rows.
    fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of one token's K (or V).
    fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Row stride of the fused qkv activation: q, then k, then v.
    fn stride(&self) -> usize {
        self.width() + 2 * self.kv_width()
    }

    fn attention(&self) -> GpuPagedAttention {
        GpuPagedAttention {
            num_heads: self.heads,
            num_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
        }
    }
}

/// One sequence of a step: the K and V of its cached tokens (placed in the pool before the
/// step; empty when an earlier step wrote them) and its new rows of qkv.
#[derive(Clone)]
struct Seq {
    cached: usize,
    new: usize,
    past_k: Vec<f32>,
    past_v: Vec<f32>,
    qkv: Vec<f32>,
}

fn random_seq(rng: &mut ChaCha8Rng, g: &Geometry, cached: usize, new: usize) -> Seq {
    let mut qkv = random_f32(rng, new * g.stride(), 1.0);
    for row in qkv.chunks_mut(g.stride()) {
        row[..g.width()].iter_mut().for_each(|x| *x *= Q_SCALE);
    }
    Seq {
        cached,
        new,
        past_k: rounded(random_f32(rng, cached * g.kv_width(), 1.0)),
        past_v: rounded(random_f32(rng, cached * g.kv_width(), 1.0)),
        qkv: rounded(qkv),
    }
}

fn random_seqs(rng: &mut ChaCha8Rng, g: &Geometry, shape: &[(usize, usize)]) -> Vec<Seq> {
    shape
        .iter()
        .map(|&(cached, new)| random_seq(rng, g, cached, new))
        .collect()
}

/// Block tables for `seqs` drawn from a shuffled pool with `spare` blocks left over, so
/// that every table is scattered and out of order. Returns the pool's size and the tables.
fn scattered_tables(
    rng: &mut ChaCha8Rng,
    g: &Geometry,
    seqs: &[Seq],
    spare: usize,
) -> (usize, Vec<Vec<u32>>) {
    let needs: Vec<usize> = seqs
        .iter()
        .map(|s| (s.cached + s.new).div_ceil(g.block_size))
        .collect();
    let num_blocks = needs.iter().sum::<usize>() + spare;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let mut ids = ids.into_iter();
    let tables = needs
        .iter()
        .map(|&n| ids.by_ref().take(n).collect())
        .collect();
    (num_blocks, tables)
}

/// The caches a step runs over: on the device with the real block ids, and on the host (for
/// the CPU reference) where block `b` sits at `host_ids[b]` (the same id when `None`).
struct Caches<'a> {
    k_dev: &'a mut CudaSlice<bf16>,
    v_dev: &'a mut CudaSlice<bf16>,
    layout: KvLayout,
    k_host: Vec<f32>,
    v_host: Vec<f32>,
    host_layout: KvLayout,
    host_ids: Option<HashMap<u32, u32>>,
}

impl Caches<'_> {
    fn host_table(&self, table: &[u32]) -> Vec<u32> {
        match &self.host_ids {
            None => table.to_vec(),
            Some(map) => table.iter().map(|b| map[b]).collect(),
        }
    }

    /// Checks the device caches against the host ones, bit for bit: all of them when the
    /// ids are the same, else every block of `tables`.
    fn assert_same(&self, s: &Setup, label: &str, tables: &[Vec<u32>]) {
        let block = (self.layout.block_size * self.layout.slot_elems()) as usize;
        for (name, dev, host) in [
            ("K", &*self.k_dev, &self.k_host),
            ("V", &*self.v_dev, &self.v_host),
        ] {
            match &self.host_ids {
                None => {
                    let got = s.gpu.download(dev).unwrap();
                    assert_same_bits(&format!("{label}: {name} cache"), &got, &to_bf16(host));
                }
                Some(map) => {
                    for &b in tables.iter().flatten() {
                        let at = b as usize * block;
                        let got = s.gpu.download(&dev.slice(at..at + block)).unwrap();
                        let h = map[&b] as usize * block;
                        let want = to_bf16(&host[h..h + block]);
                        assert_same_bits(&format!("{label}: {name} block {b}"), &got, &want);
                    }
                }
            }
        }
    }
}

/// Places every sequence's cached tokens into host caches laid out as `layout`.
fn place_past(
    k_host: &mut [f32],
    v_host: &mut [f32],
    layout: &KvLayout,
    seqs: &[Seq],
    tables: &[Vec<u32>],
) {
    let w = layout.slot_elems() as usize;
    for (seq, table) in seqs.iter().zip(tables) {
        for t in 0..seq.past_k.len() / w {
            let at = layout.token_offset(table, t as u64, 0) as usize;
            k_host[at..at + w].copy_from_slice(&seq.past_k[t * w..(t + 1) * w]);
            v_host[at..at + w].copy_from_slice(&seq.past_v[t * w..(t + 1) * w]);
        }
    }
}

/// The GPU's o rows of one step: with decode rows (and sequences of up to SPLIT_MAX_ROWS
/// rows) through the split kernel, as by default, and with every sequence through the
/// prefill kernel, as under --deterministic.
struct StepRows {
    split: Vec<bf16>,
    prefill: Vec<bf16>,
}

/// One step: write the new K/V and run attention on the GPU and on the CPU over the same
/// data; check the caches bit for bit, o's sentinel tail, and o against the CPU. Returns
/// the GPU's o rows of both kernels.
fn run_step(
    s: &Setup,
    label: &str,
    g: &Geometry,
    caches: &mut Caches,
    seqs: &[Seq],
    tables: &[Vec<u32>],
) -> StepRows {
    let (gpu, stream) = (&s.gpu, s.gpu.stream());
    let specs: Vec<SeqSpec> = seqs
        .iter()
        .zip(tables)
        .map(|(q, t)| SeqSpec {
            num_cached: q.cached,
            num_new: q.new,
            block_table: t,
        })
        .collect();
    let plan = AttentionPlan::new(&specs, g.block_size, caches.layout.num_blocks).unwrap();
    let rows = plan.rows();
    let (stride, width, kv_width) = (g.stride(), g.width(), g.kv_width());
    let qkv: Vec<f32> = seqs.iter().flat_map(|q| q.qkv.iter().copied()).collect();
    assert_eq!(qkv.len(), rows * stride);

    // GPU: q and o with a tail after the planned rows; o poisoned.
    let mut qkv_host = to_bf16(&qkv);
    qkv_host.extend(vec![bf16::NAN; TAIL * stride]);
    let mut qkv_dev = gpu.upload(&qkv_host).unwrap();
    let mut o_host = vec![bf16::NAN; rows * width];
    o_host.extend(vec![sentinel(); TAIL * width]);
    let device_plan = DeviceAttentionPlan::upload(gpu, &plan, DecodeKernel::Split).unwrap();
    assert_eq!(device_plan.rows(), rows);
    let (k_col, v_col) = (width, width + kv_width);
    write_kv(
        &s.kernels,
        stream,
        &mut qkv_dev.slice_mut(..),
        stride,
        g.heads,
        None,
        caches.k_dev,
        caches.v_dev,
        &caches.layout,
        &device_plan,
    )
    .unwrap();
    // The attention of `plan`'s rows into a fresh o, poisoned: its rows and the tail.
    let mut attend = |plan: &DeviceAttentionPlan| -> Vec<bf16> {
        let mut o_dev = gpu.upload(&o_host).unwrap();
        g.attention()
            .forward(
                &s.kernels,
                stream,
                &qkv_dev.slice(..),
                stride,
                caches.k_dev,
                caches.v_dev,
                &caches.layout,
                plan,
                &mut o_dev.slice_mut(..),
            )
            .unwrap();
        gpu.download(&o_dev).unwrap()
    };
    let o_gpu = attend(&device_plan);
    // The same attention with every multi-row sequence through the prefill kernel (the
    // split plan cut those of up to SPLIT_MAX_ROWS rows into one-row sequences).
    let o_tiles = attend(&DeviceAttentionPlan::upload(gpu, &plan, DecodeKernel::Prefill).unwrap());

    // CPU, on the host caches (ids mapped) and the same bf16 values.
    let host_tables: Vec<Vec<u32>> = tables.iter().map(|t| caches.host_table(t)).collect();
    let host_specs: Vec<SeqSpec> = specs
        .iter()
        .zip(&host_tables)
        .map(|(spec, t)| SeqSpec {
            block_table: t,
            ..*spec
        })
        .collect();
    let host_plan =
        AttentionPlan::new(&host_specs, g.block_size, caches.host_layout.num_blocks).unwrap();
    let column = |from: usize, len: usize| -> Vec<f32> {
        qkv.chunks(stride)
            .flat_map(|row| row[from..from + len].iter().copied())
            .collect()
    };
    let (q, k_new, v_new) = (
        column(0, width),
        column(k_col, kv_width),
        column(v_col, kv_width),
    );
    cpu::write_kv(
        &mut caches.k_host,
        &mut caches.v_host,
        &caches.host_layout,
        host_plan.slot_mapping(),
        &k_new,
        &v_new,
    );
    let cpu_seqs: Vec<AttentionSeq> = host_plan
        .seqs()
        .iter()
        .map(|p| AttentionSeq {
            q_start: p.q_start,
            q_len: p.q_len,
            context_len: p.context_len,
            block_table: &p.block_table,
        })
        .collect();
    let mut o_cpu = vec![f32::NAN; rows * width];
    cpu::paged_attention(
        &q,
        g.heads,
        &caches.k_host,
        &caches.v_host,
        &caches.host_layout,
        &cpu_seqs,
        g.attention().scale,
        &mut o_cpu,
    );

    caches.assert_same(s, label, tables);
    assert_same_bits(
        &format!("{label}: o's tail"),
        &o_gpu[rows * width..],
        &vec![sentinel(); TAIL * width],
    );
    let o_rows = &o_gpu[..rows * width];
    assert_close(&format!("{label}: o"), &to_f32(o_rows), &o_cpu, ATOL, RTOL);
    assert_same_bits(
        &format!("{label}: o's tail, prefill kernel"),
        &o_tiles[rows * width..],
        &vec![sentinel(); TAIL * width],
    );
    let tiles = to_f32(&o_tiles[..rows * width]);
    assert_close(
        &format!("{label}: o, prefill kernel"),
        &tiles,
        &o_cpu,
        ATOL,
        RTOL,
    );
    StepRows {
        split: o_rows.to_vec(),
        prefill: o_tiles[..rows * width].to_vec(),
    }
}

/// Runs `seqs` over a small pool (`num_blocks`, random everywhere so that a wrong slot
/// reads wrong data) holding their cached tokens; returns the GPU's o rows of both kernels.
fn run_small(
    s: &Setup,
    rng: &mut ChaCha8Rng,
    label: &str,
    g: &Geometry,
    num_blocks: usize,
    seqs: &[Seq],
    tables: &[Vec<u32>],
) -> StepRows {
    let layout = g.layout(num_blocks);
    let elems = layout.layer_elems() as usize;
    let mut k_host = rounded(random_f32(rng, elems, 1.0));
    let mut v_host = rounded(random_f32(rng, elems, 1.0));
    place_past(&mut k_host, &mut v_host, &layout, seqs, tables);
    let mut k_dev = s.gpu.upload(&to_bf16(&k_host)).unwrap();
    let mut v_dev = s.gpu.upload(&to_bf16(&v_host)).unwrap();
    let mut caches = Caches {
        k_dev: &mut k_dev,
        v_dev: &mut v_dev,
        layout,
        k_host,
        v_host,
        host_layout: layout,
        host_ids: None,
    };
    run_step(s, label, g, &mut caches, seqs, tables)
}

/// `shape` as (cached, new) pairs with random data over scattered tables.
fn random_case(
    s: &Setup,
    rng: &mut ChaCha8Rng,
    label: &str,
    g: &Geometry,
    shape: &[(usize, usize)],
) {
    let seqs = random_seqs(rng, g, shape);
    let (num_blocks, tables) = scattered_tables(rng, g, &seqs, 11);
    run_small(s, rng, label, g, num_blocks, &seqs, &tables);
}

const GQA_128: Geometry = Geometry {
    heads: 8,
    kv_heads: 2,
    head_dim: 128,
    block_size: 16,
};
const MHA_64: Geometry = Geometry {
    heads: 4,
    kv_heads: 4,
    head_dim: 64,
    block_size: 16,
};

#[test]
fn kv_write_matches_the_cpu_and_skips_negative_slots() {
    let Some(s) = setup() else { return };
    let mut rng = rng("kv_write_matches_the_cpu_and_skips_negative_slots");
    let g = GQA_128;
    let layout = g.layout(50);
    let (rows, max_pos) = (40, 5000u32);
    // Without rotary K and V are copied bit for bit; with it q is rotated in place and K on
    // its way into the cache, within bf16 rounding of the CPU's rotation.
    for mode in [None, Some(false), Some(true)] {
        let mut slots: Vec<i64> = (0..(layout.num_blocks * layout.block_size) as i64).collect();
        slots.shuffle(&mut rng);
        slots.truncate(rows);
        for slot in slots.iter_mut().step_by(5) {
            *slot = -1;
        }
        let positions: Vec<u32> = (0..rows).map(|_| rng.random_range(0..max_pos)).collect();
        let qkv = rounded(random_f32(&mut rng, rows * g.stride(), 1.0));
        let elems = layout.layer_elems() as usize;
        let mut k_host = rounded(random_f32(&mut rng, elems, 1.0));
        let mut v_host = rounded(random_f32(&mut rng, elems, 1.0));
        let mut k_dev = s.gpu.upload(&to_bf16(&k_host)).unwrap();
        let mut v_dev = s.gpu.upload(&to_bf16(&v_host)).unwrap();
        let mut qkv_dev = s.gpu.upload(&to_bf16(&qkv)).unwrap();
        let slots_dev = s.gpu.upload(&slots).unwrap();
        let rotary = peregrine_ops::Rotary::new(
            g.head_dim,
            500_000.0,
            &peregrine_ops::RopeScaling::None,
            match mode {
                Some(true) => cpu::RotaryLayout::Interleaved,
                _ => cpu::RotaryLayout::HalfSplit,
            },
        );
        let table_dev = s.gpu.upload(&rotary.cos_sin_table(max_pos)).unwrap();
        let positions_dev = s
            .gpu
            .upload(&positions.iter().map(|&p| p as i32).collect::<Vec<_>>())
            .unwrap();
        let (positions_view, table_view) = (positions_dev.slice(..), table_dev.slice(..));
        kv_write::write_kv(
            &s.kernels,
            s.gpu.stream(),
            &mut qkv_dev.slice_mut(..),
            g.stride(),
            g.heads,
            mode.map(|interleaved| kv_write::RotaryInput {
                positions: &positions_view,
                cos_sin: &table_view,
                interleaved,
            }),
            &slots_dev.slice(..),
            rows,
            &mut k_dev,
            &mut v_dev,
            &layout,
        )
        .unwrap();
        let column = |from: usize, len: usize| -> Vec<f32> {
            qkv.chunks(g.stride())
                .flat_map(|row| row[from..from + len].iter().copied())
                .collect()
        };
        let (w, kw) = (g.width(), g.kv_width());
        let (mut q_want, mut k_new) = (column(0, w), column(w, kw));
        if mode.is_some() {
            let tables = rotary.tables(&positions);
            rotary.apply(&mut q_want, &tables);
            rotary.apply(&mut k_new, &tables);
        }
        cpu::write_kv(
            &mut k_host,
            &mut v_host,
            &layout,
            &slots,
            &k_new,
            &column(w + kw, kw),
        );
        let k_got = s.gpu.download(&k_dev).unwrap();
        let v_got = s.gpu.download(&v_dev).unwrap();
        let qkv_got = to_f32(&s.gpu.download(&qkv_dev).unwrap());
        let q_got: Vec<f32> = qkv_got
            .chunks(g.stride())
            .flat_map(|row| row[..w].iter().copied())
            .collect();
        let kv_got: Vec<f32> = qkv_got
            .chunks(g.stride())
            .flat_map(|row| row[w..].iter().copied())
            .collect();
        assert_eq!(kv_got, column(w, 2 * kw), "{mode:?}: qkv's K and V changed");
        assert_same_bits("V cache", &v_got, &to_bf16(&v_host));
        if mode.is_some() {
            assert_close("rotated q", &q_got, &q_want, 2e-2, 1e-2);
            assert_close("rotated K cache", &to_f32(&k_got), &k_host, 2e-2, 1e-2);
        } else {
            assert_eq!(q_got, q_want, "q changed without rotary");
            assert_same_bits("K cache", &k_got, &to_bf16(&k_host));
        }
    }
}

#[test]
fn decode_batches_of_different_lengths_match_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("decode_batches_of_different_lengths_match_the_cpu");
    // Contexts 1, 17, 500, 512, 513, 1024 and 1500 tokens: one to three partitions of 512,
    // on both sides of each partition boundary.
    let shape = [
        (0, 1),
        (16, 1),
        (499, 1),
        (511, 1),
        (512, 1),
        (1023, 1),
        (1499, 1),
    ];
    random_case(s, &mut rng, "decode gqa d128", &GQA_128, &shape);
    random_case(s, &mut rng, "decode mha d64", &MHA_64, &shape);
    let block_32 = Geometry {
        block_size: 32,
        ..GQA_128
    };
    random_case(
        s,
        &mut rng,
        "decode gqa d128 block 32",
        &block_32,
        &shape[3..],
    );
    // Query heads per KV head of 3 (SmolLM2: 9 over 3), 8, and 16 (two blocks per KV head).
    for (label, heads, kv_heads, head_dim) in [
        ("decode 9/3 d64", 9, 3, 64),
        ("decode 8/1 d128", 8, 1, 128),
        ("decode 16/1 d64", 16, 1, 64),
    ] {
        let g = Geometry {
            heads,
            kv_heads,
            head_dim,
            block_size: 16,
        };
        random_case(s, &mut rng, label, &g, &shape[2..]);
    }
}

/// Query tiles of 64 rows (on tensor cores, a warp's 16 rows at a time; on CUDA cores two
/// passes of 32): one short tile, rows either side of a warp's and a pass's end, exact
/// tiles, one row past a tile, and 300 rows; prompts after cached keys whose count is not
/// a multiple of the key tile (64).
const PREFILL_SHAPES: [(usize, usize); 12] = [
    (0, 300),
    (0, 2),
    (0, 16),
    (0, 17),
    (0, 32),
    (0, 33),
    (0, 64),
    (0, 65),
    (0, 128),
    (63, 70),
    (64, 64),
    (130, 129),
];

#[test]
fn prefill_up_to_300_tokens_matches_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("prefill_up_to_300_tokens_matches_the_cpu");
    random_case(s, &mut rng, "prefill gqa d128", &GQA_128, &PREFILL_SHAPES);
    random_case(s, &mut rng, "prefill mha d64", &MHA_64, &PREFILL_SHAPES);
}

/// The portable prefill kernel (CUDA cores), which devices without tensor cores and HIP
/// run, on the same shapes.
#[test]
fn prefill_on_cuda_cores_matches_the_cpu() {
    let Some(s) = setup_cuda_cores() else { return };
    let mut rng = rng("prefill_on_cuda_cores_matches_the_cpu");
    random_case(
        s,
        &mut rng,
        "cuda-core prefill gqa d128",
        &GQA_128,
        &PREFILL_SHAPES,
    );
    random_case(
        s,
        &mut rng,
        "cuda-core prefill mha d64",
        &MHA_64,
        &PREFILL_SHAPES,
    );
}

/// Verification steps: the last token and 1 to 16 drafts of sequences whose contexts
/// cross a split partition (512 tokens) or end inside one, and 32 rows (the most the split
/// kernel takes, a row at a time) beside 33 (the prefill kernel's), all in one batch with a
/// decode row; each row as the decode row at its position would be.
#[test]
fn verification_rows_match_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("verification_rows_match_the_cpu");
    assert_eq!(kernel::SPLIT_MAX_ROWS, 32);
    let shape = [
        (600, 4),
        (509, 4),
        (100, 17),
        (3, 32),
        (40, 33),
        (700, 1),
        (1023, 2),
    ];
    random_case(s, &mut rng, "verification gqa d128", &GQA_128, &shape);
    random_case(s, &mut rng, "verification mha d64", &MHA_64, &shape);
}

/// Under --deterministic every row goes through the prefill kernel, and a verification
/// step's rows must get the bits of one-row steps at their positions. The kernel walks key
/// tiles of 64 up to its warp's last row, so a step whose first rows sit just before a
/// multiple of 64 and whose drafts reach past it walks a tile wholly past those rows: the
/// tile must leave them exactly as they were, its rescale exactly 1. A fused rescale once
/// left a product's rounding error there (scaling a row's sums and its softmax total
/// alike, so only now and then did an output move by a bf16 step), and greedy tokens with
/// drafts parted from those without; so 60 sequences of 32 heads are checked.
#[test]
fn verification_rows_get_the_bits_of_one_row_steps_past_a_key_tile() {
    let Some(s) = setup() else { return };
    let mut rng = rng("verification_rows_get_the_bits_of_one_row_steps_past_a_key_tile");
    for head_dim in [128, 64] {
        let g = Geometry {
            heads: 32,
            kv_heads: 8,
            head_dim,
            block_size: 16,
        };
        let (width, kv_width, rows) = (g.width(), g.kv_width(), 4);
        let firsts = [63, 127, 191, 62, 126, 61];
        let steps: Vec<Seq> = (0..60)
            .map(|i| random_seq(&mut rng, &g, firsts[i % firsts.len()], rows))
            .collect();
        let label = format!("d{head_dim} verification steps");
        let (num_blocks, tables) = scattered_tables(&mut rng, &g, &steps, 3);
        let verified = run_small(s, &mut rng, &label, &g, num_blocks, &steps, &tables).prefill;
        for r in 0..rows {
            // Each step's row r alone: the rows before it are cached tokens.
            let alone: Vec<Seq> = steps
                .iter()
                .map(|step| {
                    let mut one = Seq {
                        cached: step.cached + r,
                        new: 1,
                        past_k: step.past_k.clone(),
                        past_v: step.past_v.clone(),
                        qkv: step.qkv[r * g.stride()..(r + 1) * g.stride()].to_vec(),
                    };
                    for before in step.qkv.chunks(g.stride()).take(r) {
                        one.past_k.extend(&before[width..width + kv_width]);
                        one.past_v.extend(&before[width + kv_width..]);
                    }
                    one
                })
                .collect();
            let label = format!("d{head_dim} row {r} of each alone");
            let (num_blocks, tables) = scattered_tables(&mut rng, &g, &alone, 3);
            let one_row = run_small(s, &mut rng, &label, &g, num_blocks, &alone, &tables).prefill;
            for (i, step) in steps.iter().enumerate() {
                let at = (i * rows + r) * width;
                assert_same_bits(
                    &format!("{label}: the step after {} tokens, row {r}", step.cached),
                    &verified[at..at + width],
                    &one_row[i * width..(i + 1) * width],
                );
            }
        }
    }
}

#[test]
fn chunked_prefill_after_cached_tokens_matches_the_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rng("chunked_prefill_after_cached_tokens_matches_the_cpu");
    // Chunks after cached tokens (not multiples of the block or tile sizes), mixed with
    // decode rows in one batch.
    let shape = [
        (100, 150),
        (600, 40),
        (15, 17),
        (31, 2),
        (700, 1),
        (1, 5),
        (47, 1),
    ];
    random_case(s, &mut rng, "chunked gqa d128", &GQA_128, &shape);
    random_case(s, &mut rng, "chunked mha d64", &MHA_64, &shape);
}

#[test]
fn a_sequence_gets_the_same_bits_alone_and_in_a_batch_of_64() {
    let Some(s) = setup() else { return };
    let mut rng = rng("a_sequence_gets_the_same_bits_alone_and_in_a_batch_of_64");
    let g = GQA_128;
    let decode = random_seq(&mut rng, &g, 1499, 1);
    let prefill = random_seq(&mut rng, &g, 30, 100);
    let mut alone = Vec::new();
    for (label, seq) in [("decode alone", &decode), ("prefill alone", &prefill)] {
        let seqs = [seq.clone()];
        let (num_blocks, tables) = scattered_tables(&mut rng, &g, &seqs, 7);
        alone.push(run_small(s, &mut rng, label, &g, num_blocks, &seqs, &tables).split);
    }
    // 62 other sequences, decode and prefill, around the two (at 17 and 40), in a pool
    // where they land on other blocks.
    let mut seqs: Vec<Seq> = (0..62)
        .map(|i| {
            if i % 2 == 0 {
                let cached = rng.random_range(0..800);
                random_seq(&mut rng, &g, cached, 1)
            } else {
                let (cached, new) = (rng.random_range(0..300), rng.random_range(2..50));
                random_seq(&mut rng, &g, cached, new)
            }
        })
        .collect();
    seqs.insert(17, decode.clone());
    seqs.insert(40, prefill.clone());
    let (num_blocks, tables) = scattered_tables(&mut rng, &g, &seqs, 29);
    let batch = run_small(s, &mut rng, "batch of 64", &g, num_blocks, &seqs, &tables).split;
    let width = g.width();
    for (index, want) in [(17, &alone[0]), (40, &alone[1])] {
        let row = seqs[..index].iter().map(|q| q.new).sum::<usize>();
        let got = &batch[row * width..(row + seqs[index].new) * width];
        assert_same_bits(&format!("sequence {index} in the batch"), got, want);
    }
}

/// The split kernel serves 1, 2 or 4 query heads per block, chosen by how many blocks the
/// batch launches: a decode row alone (one head per block) and in a batch of 200 (four)
/// gets the same bits, for a context of one partition (finished by the split kernel) and
/// of three (merged by the combine).
#[test]
fn decode_gets_the_same_bits_whatever_the_heads_per_block() {
    let Some(s) = setup() else { return };
    let mut rng = rng("decode_gets_the_same_bits_whatever_the_heads_per_block");
    let g = GQA_128;
    let short = random_seq(&mut rng, &g, 299, 1);
    let long = random_seq(&mut rng, &g, 1499, 1);
    let mut alone = Vec::new();
    for (label, seq) in [("short alone", &short), ("long alone", &long)] {
        let seqs = [seq.clone()];
        let (num_blocks, tables) = scattered_tables(&mut rng, &g, &seqs, 3);
        alone.push(run_small(s, &mut rng, label, &g, num_blocks, &seqs, &tables).split);
    }
    let mut seqs: Vec<Seq> = (0..198)
        .map(|_| {
            let cached = rng.random_range(0..600);
            random_seq(&mut rng, &g, cached, 1)
        })
        .collect();
    seqs.insert(50, short.clone());
    seqs.insert(150, long.clone());
    let (num_blocks, tables) = scattered_tables(&mut rng, &g, &seqs, 11);
    let batch = run_small(s, &mut rng, "batch of 200", &g, num_blocks, &seqs, &tables).split;
    let width = g.width();
    for (index, want) in [(50, &alone[0]), (150, &alone[1])] {
        let got = &batch[index * width..(index + 1) * width];
        assert_same_bits(&format!("decode row {index} in the batch"), got, want);
    }
}

#[test]
fn a_plan_past_its_buffers_or_pool_is_refused_before_launch() {
    let Some(s) = setup() else { return };
    let mut rng = rng("a_plan_past_its_buffers_or_pool_is_refused_before_launch");
    let g = GQA_128;
    let seqs = random_seqs(&mut rng, &g, &[(20, 10)]);
    let (num_blocks, tables) = scattered_tables(&mut rng, &g, &seqs, 3);
    let layout = g.layout(num_blocks);
    let spec = SeqSpec {
        num_cached: 20,
        num_new: 10,
        block_table: &tables[0],
    };
    let plan = AttentionPlan::new(&[spec], g.block_size, num_blocks as u64).unwrap();
    let device_plan = DeviceAttentionPlan::upload(&s.gpu, &plan, DecodeKernel::Split).unwrap();
    let (stride, width) = (g.stride(), g.width());
    let elems = layout.layer_elems() as usize;
    let pool = to_bf16(&random_f32(&mut rng, elems, 1.0));
    let mut k_dev = s.gpu.upload(&pool).unwrap();
    let mut v_dev = s.gpu.upload(&pool).unwrap();
    let mut qkv_dev = s.gpu.upload(&to_bf16(&seqs[0].qkv)).unwrap();
    let untouched = vec![sentinel(); 10 * width];
    let mut o_dev = s.gpu.upload(&untouched).unwrap();
    let stream = s.gpu.stream();
    let attention = g.attention();
    let refused = |err: AttentionError, buffer: &str, rows: usize| match err {
        AttentionError::Plan(PlanError::RowsExceedBuffer {
            planned: 10,
            buffer: b,
            rows: r,
        }) if b == buffer && r == rows => {}
        other => panic!("expected 10 rows refused by {buffer} of {rows}, got {other}"),
    };

    // o one row short.
    let err = attention
        .forward(
            &s.kernels,
            stream,
            &qkv_dev.slice(..),
            stride,
            &mut k_dev,
            &mut v_dev,
            &layout,
            &device_plan,
            &mut o_dev.slice_mut(..9 * width),
        )
        .unwrap_err();
    refused(err, "o", 9);
    // q one row short.
    let err = attention
        .forward(
            &s.kernels,
            stream,
            &qkv_dev.slice(..9 * stride),
            stride,
            &mut k_dev,
            &mut v_dev,
            &layout,
            &device_plan,
            &mut o_dev.slice_mut(..),
        )
        .unwrap_err();
    refused(err, "q", 9);
    // qkv one row short for the cache write.
    let err = write_kv(
        &s.kernels,
        stream,
        &mut qkv_dev.slice_mut(..9 * stride),
        stride,
        g.heads,
        None,
        &mut k_dev,
        &mut v_dev,
        &layout,
        &device_plan,
    )
    .unwrap_err();
    refused(err, "qkv", 9);
    // A pool that does not hold the plan's largest block.
    let largest = *tables[0].iter().max().unwrap();
    let smaller = g.layout(largest as usize);
    let err = attention
        .forward(
            &s.kernels,
            stream,
            &qkv_dev.slice(..),
            stride,
            &mut k_dev,
            &mut v_dev,
            &smaller,
            &device_plan,
            &mut o_dev.slice_mut(..),
        )
        .unwrap_err();
    assert!(
        matches!(err, AttentionError::OutsidePool { what: "block", index, .. } if index == largest as u64),
        "{err}"
    );
    // Nothing ran: o and the caches are as they were.
    assert_same_bits("o", &s.gpu.download(&o_dev).unwrap(), &untouched);
    assert_same_bits("K cache", &s.gpu.download(&k_dev).unwrap(), &pool);
    assert_same_bits("V cache", &s.gpu.download(&v_dev).unwrap(), &pool);
}

/// The KV pool of the incident: one layer of 140,000 blocks of 16 tokens x 8 KV heads x 128
/// (32 KiB a block in bf16, 4.6 GB for K and as much for V). Blocks around id 65,535 / 65,536
/// and the blocks holding byte offsets 2^31 and 2^32 are written, read back and attended
/// over, against a CPU reference that holds only the used blocks under small ids.
#[test]
fn a_pool_past_4_gib_is_addressed_exactly() {
    let Some(s) = setup() else { return };
    let mut rng = rng("a_pool_past_4_gib_is_addressed_exactly");
    let g = Geometry {
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        block_size: 16,
    };
    let layout = g.layout(140_000);
    let audit = kernel::audit(&layout, 2).unwrap();
    assert!(audit.largest_byte_offset > 1 << 32, "{audit:?}");
    let block_bytes = layout.block_size * layout.slot_elems() * 2;
    assert_eq!(block_bytes, 32 * 1024);
    let at_2_31 = ((1u64 << 31) / block_bytes) as u32;
    let at_2_32 = ((1u64 << 32) / block_bytes) as u32;
    assert_eq!((at_2_31, at_2_32), (65_536, 131_072));

    // Zeroed on the device: nothing of the 9 GB travels from the host.
    let mut cache = GpuKvCache::new(&s.gpu, 1, layout).unwrap();
    let (k_dev, v_dev) = cache.layer_mut(0);
    let table_a = vec![65_535, at_2_31, 131_071, at_2_32];
    let table_b = vec![0, 65_534, 139_999];
    let used = [0u32, 65_534, 65_535, at_2_31, 131_071, at_2_32, 139_999];
    let host_ids: HashMap<u32, u32> = used
        .iter()
        .enumerate()
        .map(|(i, &b)| (b, i as u32))
        .collect();
    let host_layout = g.layout(used.len());
    let block = (layout.block_size * layout.slot_elems()) as usize;
    let mut k_host = vec![0f32; used.len() * block];
    let mut v_host = k_host.clone();

    // Every used block: random bits written straight into it and read back exactly; the
    // host copy gets the same bits.
    for (dev, host) in [(&mut *k_dev, &mut k_host), (&mut *v_dev, &mut v_host)] {
        for (i, &b) in used.iter().enumerate() {
            let data = to_bf16(&random_f32(&mut rng, block, 1.0));
            let at = b as usize * block;
            s.gpu
                .stream()
                .memcpy_htod(&data, &mut dev.slice_mut(at..at + block))
                .unwrap();
            let back = s.gpu.download(&dev.slice(at..at + block)).unwrap();
            assert_same_bits(&format!("block {b} read back"), &back, &data);
            host[i * block..(i + 1) * block].copy_from_slice(&to_f32(&data));
        }
    }
    let mut caches = Caches {
        k_dev,
        v_dev,
        layout,
        k_host,
        v_host,
        host_layout,
        host_ids: Some(host_ids),
    };
    let tables = [table_a, table_b];

    // Prefill: 60 tokens over blocks 65,535 .. 131,072, 40 over 0, 65,534, 139,999.
    let step1 = random_seqs(&mut rng, &g, &[(0, 60), (0, 40)]);
    run_step(s, "past 4 GiB: prefill", &g, &mut caches, &step1, &tables);
    // Then a decode row after the 60 and a chunk of 5 after the 40 (their cached tokens are
    // the ones the prefill wrote).
    let mut step2 = random_seqs(&mut rng, &g, &[(0, 1), (0, 5)]);
    step2[0].cached = 60;
    step2[1].cached = 40;
    run_step(s, "past 4 GiB: decode", &g, &mut caches, &step2, &tables);

    // The blocks next to the used ones were never written.
    let zeros = vec![bf16::ZERO; block];
    for b in [1usize, 65_533, 65_537, 131_070, 131_073, 139_998] {
        let got = s
            .gpu
            .download(&caches.k_dev.slice(b * block..(b + 1) * block))
            .unwrap();
        assert_same_bits(&format!("untouched K block {b}"), &got, &zeros);
        let got = s
            .gpu
            .download(&caches.v_dev.slice(b * block..(b + 1) * block))
            .unwrap();
        assert_same_bits(&format!("untouched V block {b}"), &got, &zeros);
    }
}

#[test]
fn the_fused_kv_write_gives_the_bits_of_write_kv_then_attention() {
    let Some(s) = setup() else { return };
    let mut rng = rng("the_fused_kv_write_gives_the_bits_of_write_kv_then_attention");
    let stream = s.gpu.stream();
    for (heads, kv_heads, d, rotary) in [
        (8, 2, 64, Some(false)),
        (4, 4, 128, Some(true)),
        (6, 3, 64, None),
    ] {
        let (width, kv_width) = (heads * d, kv_heads * d);
        let stride = width + 2 * kv_width + 8; // a row with spare columns after V
        let (block_size, per_seq, seqs) = (16usize, 80usize, 9usize);
        let num_blocks = (seqs * per_seq) as u64;
        let layout = KvLayout {
            num_blocks,
            block_size: block_size as u64,
            num_kv_heads: kv_heads as u64,
            head_dim: d as u64,
        };
        // Contexts of one partition and of several (up to 1,280 tokens), scattered tables;
        // decode rows and verification steps of 2 to 5 rows (cut into the decode rows they
        // would be), two of them across a partition's end.
        let tables: Vec<Vec<u32>> = (0..seqs)
            .map(|q| (0..per_seq).map(|i| (i * seqs + q) as u32).rev().collect())
            .collect();
        let specs: Vec<SeqSpec> = tables
            .iter()
            .enumerate()
            .map(|(q, t)| {
                let num_new = [1, 4, 2, 1, 5, 3, 1, 4, 3][q];
                let num_cached = match q {
                    1 => kernel::PARTITION_TOKENS - 2,
                    4 => 2 * kernel::PARTITION_TOKENS - 3,
                    _ if q % 3 == 0 => rng.random_range(600..per_seq * block_size - 6),
                    _ => rng.random_range(0..500),
                };
                SeqSpec {
                    num_cached,
                    num_new,
                    block_table: t,
                }
            })
            .collect();
        let plan = AttentionPlan::new(&specs, block_size, num_blocks).unwrap();
        let rows = plan.rows();
        let dplan = DeviceAttentionPlan::upload(&s.gpu, &plan, DecodeKernel::Split).unwrap();
        let qkv = to_bf16(&random_f32(&mut rng, rows * stride, Q_SCALE));
        let cache = to_bf16(&random_f32(&mut rng, layout.layer_elems() as usize, 1.0));
        let positions = 2048usize;
        let table = random_f32(&mut rng, positions * d, 1.0);
        let table_d = s.gpu.upload(&table).unwrap();
        let cos_sin = table_d.slice(..);
        let rot = rotary.map(|interleaved| RotaryTable {
            cos_sin: &cos_sin,
            positions,
            interleaved,
        });
        let attention = GpuPagedAttention {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
        };
        let mut o_host = vec![bf16::NAN; rows * width];
        o_host.extend(vec![sentinel(); TAIL * width]);
        // Two launches: write_kv (rotating q in place), then attention.
        let mut qkv_a = s.gpu.upload(&qkv).unwrap();
        let (mut k_a, mut v_a) = (s.gpu.upload(&cache).unwrap(), s.gpu.upload(&cache).unwrap());
        let mut o_a = s.gpu.upload(&o_host).unwrap();
        let q_a = &mut qkv_a.slice_mut(..);
        write_kv(
            &s.kernels, stream, q_a, stride, heads, rot, &mut k_a, &mut v_a, &layout, &dplan,
        )
        .unwrap();
        let o_rows = &mut o_a.slice_mut(..rows * width);
        let q = qkv_a.slice(..);
        attention
            .forward(
                &s.kernels, stream, &q, stride, &mut k_a, &mut v_a, &layout, &dplan, o_rows,
            )
            .unwrap();
        // One launch.
        let qkv_b = s.gpu.upload(&qkv).unwrap();
        let (mut k_b, mut v_b) = (s.gpu.upload(&cache).unwrap(), s.gpu.upload(&cache).unwrap());
        let mut o_b = s.gpu.upload(&o_host).unwrap();
        let o_rows = &mut o_b.slice_mut(..rows * width);
        let q = qkv_b.slice(..);
        attention
            .forward_writing_kv(
                &s.kernels, stream, &q, stride, rot, &mut k_b, &mut v_b, &layout, &dplan, o_rows,
            )
            .unwrap();
        // One launch again, through a graph's fixed plan padded by 3 rows (random ones in
        // qkv): the padded rows write no KV and no row of o.
        let padded = rows + 3;
        let capacity = PlanCapacity {
            rows: 64,
            decode_only: false,
            max_context: per_seq * block_size,
            block_size,
            scratch_slot: 0,
        };
        let mut fixed =
            DeviceAttentionPlan::fixed(&s.gpu, DecodeKernel::Split, capacity, heads, d).unwrap();
        let logit_rows: Vec<usize> = (0..rows).collect();
        let tokens = vec![0u32; rows];
        let class = capacity.max_context;
        fixed
            .stage_padded(&tokens, &plan, &logit_rows, padded, class)
            .unwrap();
        // A decode graph's plan refuses the step: its kernel holds one step token a
        // sequence.
        let decode_only = PlanCapacity {
            decode_only: true,
            ..capacity
        };
        let mut decode_only =
            DeviceAttentionPlan::fixed(&s.gpu, DecodeKernel::Split, decode_only, heads, d).unwrap();
        let refused = decode_only.stage_padded(&tokens, &plan, &logit_rows, padded, class);
        assert!(matches!(refused, Err(AttentionError::Shape(_))));
        let mut qkv_c = qkv.clone();
        qkv_c.extend(to_bf16(&random_f32(&mut rng, 3 * stride, Q_SCALE)));
        let qkv_c = s.gpu.upload(&qkv_c).unwrap();
        let (mut k_c, mut v_c) = (s.gpu.upload(&cache).unwrap(), s.gpu.upload(&cache).unwrap());
        let mut o_c = s.gpu.upload(&o_host).unwrap();
        let o_rows = &mut o_c.slice_mut(..padded * width);
        let q = qkv_c.slice(..);
        attention
            .forward_writing_kv(
                &s.kernels, stream, &q, stride, rot, &mut k_c, &mut v_c, &layout, &fixed, o_rows,
            )
            .unwrap();
        // Refused, with nothing launched: a step with a sequence too long to cut (its rows
        // go to the prefill kernel), and a plan whose one-row sequences go to the prefill
        // kernel.
        let long = [SeqSpec {
            num_new: kernel::SPLIT_MAX_ROWS + 1,
            ..specs[1]
        }];
        let long = AttentionPlan::new(&long, block_size, num_blocks).unwrap();
        let long = DeviceAttentionPlan::upload(&s.gpu, &long, DecodeKernel::Split).unwrap();
        let prefill = DeviceAttentionPlan::upload(&s.gpu, &plan, DecodeKernel::Prefill).unwrap();
        for (what, plan) in [
            ("a step of the prefill kernel", &long),
            ("a plan of the prefill kernel", &prefill),
        ] {
            assert!(!plan.fuses_kv_write(), "{what}");
            let mut o_d = s.gpu.upload(&o_host).unwrap();
            let o_rows = &mut o_d.slice_mut(..padded * width);
            let refused = attention.forward_writing_kv(
                &s.kernels, stream, &q, stride, rot, &mut k_c, &mut v_c, &layout, plan, o_rows,
            );
            assert!(matches!(refused, Err(AttentionError::Shape(_))), "{what}");
            let o_after = s.gpu.download(&o_d).unwrap();
            assert_same_bits(&format!("{what}: o untouched"), &o_after, &o_host);
        }
        assert!(dplan.fuses_kv_write() && fixed.fuses_kv_write());
        let label = format!("{heads}/{kv_heads} d{d} rotary {rotary:?}");
        for (what, a, b, c) in [
            ("o", &o_a, &o_b, &o_c),
            ("K cache", &k_a, &k_b, &k_c),
            ("V cache", &v_a, &v_b, &v_c),
        ] {
            let (a, b) = (s.gpu.download(a).unwrap(), s.gpu.download(b).unwrap());
            let c = s.gpu.download(c).unwrap();
            assert_same_bits(&format!("{label}: {what}"), &b, &a);
            assert_same_bits(&format!("{label}: {what}, padded"), &c, &a);
        }
    }
}
