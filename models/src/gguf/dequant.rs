//! Decoding ggml tensor data to f32: F32, F16, BF16 and the block quantizations Q8_0, Q4_0
//! and Q4_1 (layouts as in ggml).

use anyhow::{anyhow, bail, Result};
use half::{bf16, f16};

use super::reader::supported_list;
use super::types::GgmlType;

/// Elements in one Q8_0 / Q4_0 / Q4_1 block.
const QK: usize = 32;

/// A block quantization Peregrine can decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Quant {
    /// f16 scale `d`, then 32 `i8`: value `q * d`.
    Q8_0,
    /// f16 scale `d`, then 16 bytes of nibbles: value `(q - 8) * d`.
    Q4_0,
    /// f16 scale `d`, f16 minimum `m`, then 16 bytes of nibbles: value `q * d + m`.
    Q4_1,
}

impl Quant {
    /// The quantization stored as `ty`, if `ty` is one Peregrine decodes.
    pub(crate) fn of(ty: GgmlType) -> Option<Self> {
        match ty {
            GgmlType::Q8_0 => Some(Self::Q8_0),
            GgmlType::Q4_0 => Some(Self::Q4_0),
            GgmlType::Q4_1 => Some(Self::Q4_1),
            _ => None,
        }
    }

    fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 2 + QK,
            Self::Q4_0 => 2 + QK / 2,
            Self::Q4_1 => 4 + QK / 2,
        }
    }

    /// Decodes whole blocks; `bytes.len()` must be a multiple of the block size (a trailing
    /// partial block is ignored).
    pub(crate) fn decode(self, bytes: &[u8]) -> Vec<f32> {
        let blocks = bytes.chunks_exact(self.block_bytes());
        let mut out = Vec::with_capacity(blocks.len() * QK);
        for b in blocks {
            let d = f16_at(b, 0);
            match self {
                Self::Q8_0 => out.extend(b[2..].iter().map(|&q| f32::from(q as i8) * d)),
                Self::Q4_0 => nibbles(&b[2..], |q| (f32::from(q) - 8.0) * d, &mut out),
                Self::Q4_1 => {
                    let m = f16_at(b, 2);
                    nibbles(&b[4..], |q| f32::from(q) * d + m, &mut out)
                }
            }
        }
        out
    }
}

/// The f16 at `b[at..at + 2]`, widened.
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Low nibbles are elements 0..16 of the block, high nibbles elements 16..32.
fn nibbles(qs: &[u8], value: impl Fn(u8) -> f32, out: &mut Vec<f32>) {
    out.extend(qs.iter().map(|&q| value(q & 0x0f)));
    out.extend(qs.iter().map(|&q| value(q >> 4)));
}

/// Decodes the bytes of a tensor stored as `ty` to f32; an error for any other type or for a
/// length that is not a whole number of blocks.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    let (_, block_bytes) = ty.block_layout().ok_or_else(|| {
        anyhow!(
            "cannot dequantize type {ty} (supported: {})",
            supported_list()
        )
    })?;
    if !bytes.len().is_multiple_of(block_bytes as usize) {
        bail!(
            "{} bytes of {ty} data are not whole blocks of {block_bytes} bytes",
            bytes.len()
        );
    }
    let floats = |width: usize, f: fn(&[u8]) -> f32| bytes.chunks_exact(width).map(f).collect();
    Ok(match ty {
        GgmlType::F32 => floats(4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        GgmlType::F16 => floats(2, |b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
        GgmlType::BF16 => floats(2, |b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        other => match Quant::of(other) {
            Some(q) => q.decode(bytes),
            None => bail!("cannot dequantize type {other}"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q8_0_block() {
        let mut b = h(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let v = dequantize(GgmlType::Q8_0, &b).unwrap();
        assert_eq!(v.len(), 32);
        assert_eq!(v[0], -8.0);
        assert_eq!(v[31], 7.5);
    }

    #[test]
    fn q4_0_block_nibble_order() {
        let mut b = h(2.0).to_vec();
        // low nibble j, high nibble 15 - j
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = dequantize(GgmlType::Q4_0, &b).unwrap();
        assert_eq!(v[0], -16.0);
        assert_eq!(v[15], 14.0);
        assert_eq!(v[16], 14.0);
        assert_eq!(v[31], -16.0);
    }

    #[test]
    fn q4_1_block() {
        let mut b = h(0.25).to_vec();
        b.extend(h(-1.0));
        b.extend((0..16u8).map(|j| j | (3 << 4)));
        let v = dequantize(GgmlType::Q4_1, &b).unwrap();
        assert_eq!(v[5], 5.0 * 0.25 - 1.0);
        assert_eq!(v[20], 3.0 * 0.25 - 1.0);
    }

    #[test]
    fn floats_and_errors() {
        let b: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(dequantize(GgmlType::F32, &b).unwrap(), vec![1.5, -2.0]);
        let b = [bf16::from_f32(3.0).to_le_bytes(), h(-0.5)].concat();
        assert_eq!(dequantize(GgmlType::BF16, &b[..2]).unwrap(), vec![3.0]);
        assert_eq!(dequantize(GgmlType::F16, &b[2..]).unwrap(), vec![-0.5]);
        let err = dequantize(GgmlType(14), &[0; 210]).unwrap_err().to_string();
        assert!(err.contains("Q6_K"), "{err}");
        assert!(dequantize(GgmlType::Q8_0, &[0; 33]).is_err());
    }

    #[test]
    fn layouts_agree_with_types() {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
            let q = Quant::of(ty).unwrap();
            let (elems, bytes) = ty.block_layout().unwrap();
            assert_eq!(q.block_bytes() as u64, bytes);
            assert_eq!(q.decode(&vec![0; bytes as usize]).len() as u64, elems);
        }
    }
}
