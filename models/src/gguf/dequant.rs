//! Decoding ggml tensor data to f32: F32, F16, BF16 and every block quantization the
//! kernels read (layouts as in ggml; the decoding is `BlockFormat::dequantize`).

use anyhow::{anyhow, bail, Result};
use half::{bf16, f16};

use super::reader::supported_list;
use super::types::GgmlType;

/// Decodes the bytes of a tensor stored as `ty` to f32; an error for any other type or for a
/// length that is not a whole number of blocks.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    let (elems, block_bytes) = ty.block_layout().ok_or_else(|| {
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
        other => {
            let format = other
                .block_format()
                .ok_or_else(|| anyhow!("cannot dequantize type {other}"))?;
            let mut out = vec![0.0; bytes.len() / block_bytes as usize * elems as usize];
            format.dequantize(bytes, &mut out);
            out
        }
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
        let err = dequantize(GgmlType(16), &[0; 66]).unwrap_err().to_string();
        assert!(err.contains("IQ2_XXS"), "{err}");
        assert!(dequantize(GgmlType::Q8_0, &[0; 33]).is_err());
    }
}
