//! ggml's block formats: their sizes, and each block unpacked into small integers with
//! per-16 scales and per-32 offsets, the one description both dequantization and the
//! portable dot products read.

use half::f16;

/// A ggml block quantization a weight matrix can be stored in, with ggml's byte layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// 32 values: f16 `d`, 32 `i8`; value `q * d`.
    Q8_0,
    /// 32 values: f16 `d`, 16 bytes of nibbles; value `(q - 8) * d`.
    Q4_0,
    /// 32 values: f16 `d`, f16 `m`, 16 bytes of nibbles; value `q * d + m`.
    Q4_1,
    /// 32 values: f16 `d`, 32 high bits, 16 bytes of nibbles; value `(q - 16) * d`.
    Q5_0,
    /// 32 values: f16 `d`, f16 `m`, 32 high bits, 16 bytes of nibbles; value `q * d + m`.
    Q5_1,
    /// 256 values in 8 sub-blocks of 32 with 6-bit scales and minimums.
    Q4K,
    /// 256 values like Q4_K with a fifth bit per value.
    Q5K,
    /// 256 values of 6 bits in 16 sub-blocks of 16 with `i8` scales.
    Q6K,
}

/// The largest number of values one block holds.
pub(crate) const MAX_BLOCK: usize = 256;

/// One block unpacked: value `i` is `scale[i / 16] * q[i] - offset[i / 32]`.
pub(crate) struct Unpacked {
    /// The integer of each value.
    pub q: [i8; MAX_BLOCK],
    /// The scale of each 16 values.
    pub scale: [f32; MAX_BLOCK / 16],
    /// What each 32 values have subtracted.
    pub offset: [f32; MAX_BLOCK / 32],
}

impl BlockFormat {
    /// Every format, in ggml's type-id order.
    pub const ALL: [BlockFormat; 8] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
    ];

    /// Values in one block.
    pub const fn block_elems(self) -> usize {
        match self {
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
            _ => 32,
        }
    }

    /// Bytes in one block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 34,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }

    /// ggml's name of the format.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "Q8_0",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
        }
    }

    /// Bytes of a row of `cols` values, or `None` when `cols` is not whole blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block_elems())
            .then(|| cols / self.block_elems() * self.block_bytes())
    }

    /// Unpacks one block (`block.len()` is [`block_bytes`](Self::block_bytes)); only the
    /// first [`block_elems`](Self::block_elems) values are written.
    pub(crate) fn unpack(self, block: &[u8], u: &mut Unpacked) {
        debug_assert_eq!(block.len(), self.block_bytes());
        let h = |at: usize| f16_at(block, at);
        match self {
            Self::Q8_0 => {
                for (q, &b) in u.q.iter_mut().zip(&block[2..34]) {
                    *q = b as i8;
                }
                simple(u, h(0), 0.0);
            }
            Self::Q4_0 => {
                nibbles(&block[2..18], 0, u);
                simple(u, h(0), 8.0 * h(0));
            }
            Self::Q4_1 => {
                nibbles(&block[4..20], 0, u);
                simple(u, h(0), -h(2));
            }
            Self::Q5_0 => {
                nibbles(&block[6..22], u32_at(block, 2), u);
                simple(u, h(0), 16.0 * h(0));
            }
            Self::Q5_1 => {
                nibbles(&block[8..24], u32_at(block, 4), u);
                simple(u, h(0), -h(2));
            }
            Self::Q4K | Self::Q5K => unpack_q45k(self == Self::Q5K, block, u),
            Self::Q6K => unpack_q6k(block, u),
        }
    }

    /// Dequantizes whole blocks of `bytes` into `out` (`out.len()` values, a whole number
    /// of blocks that `bytes` holds).
    pub fn dequantize(self, bytes: &[u8], out: &mut [f32]) {
        let (elems, size) = (self.block_elems(), self.block_bytes());
        assert!(
            out.len().is_multiple_of(elems) && bytes.len() >= out.len() / elems * size,
            "dequantize {}: {} bytes for {} values",
            self.name(),
            bytes.len(),
            out.len()
        );
        let mut u = Unpacked::new();
        for (values, block) in out.chunks_exact_mut(elems).zip(bytes.chunks_exact(size)) {
            self.unpack(block, &mut u);
            for (i, v) in values.iter_mut().enumerate() {
                *v = u.scale[i / 16] * f32::from(u.q[i]) - u.offset[i / 32];
            }
        }
    }
}

impl Unpacked {
    /// An unpacked block of zeros.
    pub fn new() -> Unpacked {
        Unpacked {
            q: [0; MAX_BLOCK],
            scale: [0.0; MAX_BLOCK / 16],
            offset: [0.0; MAX_BLOCK / 32],
        }
    }
}

impl Default for Unpacked {
    fn default() -> Self {
        Self::new()
    }
}

/// The f16 at `b[at..at + 2]`, widened.
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A 32-value block with one scale and one offset.
fn simple(u: &mut Unpacked, scale: f32, offset: f32) {
    u.scale[..2].fill(scale);
    u.offset[0] = offset;
}

/// Low nibbles are values 0..16, high nibbles 16..32; bit `i` of `high` is value `i`'s
/// fifth bit.
fn nibbles(qs: &[u8], high: u32, u: &mut Unpacked) {
    for (j, &b) in qs.iter().enumerate() {
        let fifth = |i: usize| (((high >> i) & 1) << 4) as u8;
        u.q[j] = ((b & 0x0f) | fifth(j)) as i8;
        u.q[j + 16] = ((b >> 4) | fifth(j + 16)) as i8;
    }
}

/// Scale and minimum `j` (of 8) of a Q4_K / Q5_K block's 12 packed 6-bit values.
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K (`d`, `dmin`, 12 scale bytes, 128 nibble bytes) and Q5_K (the same with 32 bytes of
/// fifth bits before the nibbles). Each 64 values are 32 bytes: low nibbles first.
fn unpack_q45k(five: bool, b: &[u8], u: &mut Unpacked) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let (qh, qs) = if five {
        (&b[16..48], &b[48..176])
    } else {
        (&b[0..0], &b[16..144])
    };
    for chunk in 0..4 {
        for half in 0..2 {
            let sub = 2 * chunk + half;
            let (sc, m) = scale_min_k4(sub, scales);
            u.scale[2 * sub] = d * f32::from(sc);
            u.scale[2 * sub + 1] = d * f32::from(sc);
            u.offset[sub] = dmin * f32::from(m);
            for l in 0..32 {
                let byte = qs[32 * chunk + l];
                let low = if half == 0 { byte & 0x0f } else { byte >> 4 };
                let high = if five { ((qh[l] >> sub) & 1) << 4 } else { 0 };
                u.q[32 * sub + l] = (low | high) as i8;
            }
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 `i8` scales, f16 `d` last.
fn unpack_q6k(b: &[u8], u: &mut Unpacked) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (s, &x) in u.scale.iter_mut().zip(sc) {
        *s = d * f32::from(x as i8);
    }
    u.offset = [0.0; MAX_BLOCK / 32];
    for n in 0..2 {
        let (ql, qh, q) = (&ql[64 * n..], &qh[32 * n..], &mut u.q[128 * n..]);
        for l in 0..32 {
            let v = |low: u8, shift: u32| ((low | (((qh[l] >> shift) & 3) << 4)) as i8) - 32;
            q[l] = v(ql[l] & 0x0f, 0);
            q[l + 32] = v(ql[l + 32] & 0x0f, 2);
            q[l + 64] = v(ql[l] >> 4, 4);
            q[l + 96] = v(ql[l + 32] >> 4, 6);
        }
    }
}
