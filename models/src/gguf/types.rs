//! ggml tensor types: their names and, for the types Peregrine reads, their block layout.

use peregrine_kernels::cpu::quant::BlockFormat;
use std::fmt;

/// A ggml tensor type, as stored in a GGUF tensor info (the raw type id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// Names of the ggml type ids, so an error can say `Q6_K` rather than `14`.
const NAMES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

impl GgmlType {
    /// 32-bit float.
    pub const F32: Self = Self(0);
    /// IEEE half precision.
    pub const F16: Self = Self(1);
    /// Blocks of 32: f16 scale, 16 bytes of 4-bit values, value `(q - 8) * d`.
    pub const Q4_0: Self = Self(2);
    /// Blocks of 32: f16 scale, f16 min, 16 bytes of 4-bit values, value `q * d + m`.
    pub const Q4_1: Self = Self(3);
    /// Blocks of 32 of 5-bit values, value `(q - 16) * d`.
    pub const Q5_0: Self = Self(6);
    /// Blocks of 32 of 5-bit values, value `q * d + m`.
    pub const Q5_1: Self = Self(7);
    /// Blocks of 32: f16 scale and 32 signed bytes, value `q * d`.
    pub const Q8_0: Self = Self(8);
    /// Super-blocks of 256 of 4-bit values with 6-bit sub-block scales and minimums.
    pub const Q4_K: Self = Self(12);
    /// Super-blocks of 256 of 5-bit values with 6-bit sub-block scales and minimums.
    pub const Q5_K: Self = Self(13);
    /// Super-blocks of 256 of 6-bit values with 8-bit sub-block scales.
    pub const Q6_K: Self = Self(14);
    /// bfloat16.
    pub const BF16: Self = Self(30);

    /// The types Peregrine can read, in the order error messages list them.
    pub const SUPPORTED: [Self; 11] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
    ];

    /// The ggml name of this type (`"Q6_K"`), or `None` for an id ggml never defined.
    pub fn name(self) -> Option<&'static str> {
        NAMES
            .iter()
            .find(|(id, _)| *id == self.0)
            .map(|(_, name)| *name)
    }

    /// The block quantization this type is, if it is one Peregrine reads.
    pub fn block_format(self) -> Option<BlockFormat> {
        Some(match self {
            Self::Q8_0 => BlockFormat::Q8_0,
            Self::Q4_0 => BlockFormat::Q4_0,
            Self::Q4_1 => BlockFormat::Q4_1,
            Self::Q5_0 => BlockFormat::Q5_0,
            Self::Q5_1 => BlockFormat::Q5_1,
            Self::Q4_K => BlockFormat::Q4K,
            Self::Q5_K => BlockFormat::Q5K,
            Self::Q6_K => BlockFormat::Q6K,
            _ => return None,
        })
    }

    /// `(elements per block, bytes per block)` for the types Peregrine can read.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        match self {
            Self::F32 => Some((1, 4)),
            Self::F16 | Self::BF16 => Some((1, 2)),
            other => other
                .block_format()
                .map(|f| (f.block_elems() as u64, f.block_bytes() as u64)),
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "unknown ggml type {}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_layouts() {
        assert_eq!(GgmlType(14).to_string(), "Q6_K");
        assert_eq!(GgmlType(99).to_string(), "unknown ggml type 99");
        assert_eq!(GgmlType::Q8_0.block_layout(), Some((32, 34)));
        assert_eq!(GgmlType(14).block_layout(), Some((256, 210)));
        assert_eq!(GgmlType(16).block_layout(), None);
        assert!(GgmlType::SUPPORTED
            .iter()
            .all(|t| t.block_layout().is_some()));
    }
}
