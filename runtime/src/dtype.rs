//! Element types of tensors.

use std::fmt;

/// The element type of a buffer. `U8` holds raw bytes, such as quantized blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
    I32,
    I64,
    U8,
}

impl DType {
    /// Bytes per element.
    pub const fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::I64 => 8,
            DType::U8 => 1,
        }
    }

    /// The name used in configuration and Hugging Face's `torch_dtype`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
