//! Host tensors: a typed buffer and a row-major shape, addressed with 64-bit offsets.

use crate::{DType, Device};
use half::{bf16, f16};

/// A tensor operation that cannot be carried out, with what was asked for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TensorError {
    #[error("tensor holds {actual}, not {expected}")]
    DType { expected: DType, actual: DType },
    #[error("shape {shape:?} needs {needed} elements but {given} were given")]
    Size {
        shape: Vec<usize>,
        needed: u64,
        given: u64,
    },
    #[error("elements {offset}..{offset}+{len} are outside a tensor of {numel}")]
    OutOfBounds { offset: u64, len: u64, numel: u64 },
}

/// Typed host storage behind a tensor.
#[derive(Clone, Debug, PartialEq)]
enum Storage {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

/// A dense row-major tensor on a device (the CPU for now).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    storage: Storage,
    shape: Vec<usize>,
    device: Device,
}

fn numel(shape: &[usize]) -> u64 {
    shape.iter().map(|&d| d as u64).product()
}

impl Tensor {
    fn new(storage: Storage, shape: &[usize], given: usize) -> Result<Tensor, TensorError> {
        let needed = numel(shape);
        if needed != given as u64 {
            return Err(TensorError::Size {
                shape: shape.to_vec(),
                needed,
                given: given as u64,
            });
        }
        Ok(Tensor {
            storage,
            shape: shape.to_vec(),
            device: Device::Cpu,
        })
    }

    /// A float32 tensor from row-major values.
    pub fn from_f32(shape: &[usize], values: Vec<f32>) -> Result<Tensor, TensorError> {
        let n = values.len();
        Tensor::new(Storage::F32(values), shape, n)
    }

    /// A bfloat16 tensor from row-major values.
    pub fn from_bf16(shape: &[usize], values: Vec<bf16>) -> Result<Tensor, TensorError> {
        let n = values.len();
        Tensor::new(Storage::BF16(values), shape, n)
    }

    /// A float16 tensor from row-major values.
    pub fn from_f16(shape: &[usize], values: Vec<f16>) -> Result<Tensor, TensorError> {
        let n = values.len();
        Tensor::new(Storage::F16(values), shape, n)
    }

    /// An int32 tensor from row-major values.
    pub fn from_i32(shape: &[usize], values: Vec<i32>) -> Result<Tensor, TensorError> {
        let n = values.len();
        Tensor::new(Storage::I32(values), shape, n)
    }

    /// An int64 tensor from row-major values.
    pub fn from_i64(shape: &[usize], values: Vec<i64>) -> Result<Tensor, TensorError> {
        let n = values.len();
        Tensor::new(Storage::I64(values), shape, n)
    }

    /// Raw bytes (for example quantized blocks) under a byte shape.
    pub fn from_bytes(shape: &[usize], bytes: Vec<u8>) -> Result<Tensor, TensorError> {
        let n = bytes.len();
        Tensor::new(Storage::U8(bytes), shape, n)
    }

    /// A zero-filled tensor of any dtype.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let n = numel(shape) as usize;
        let storage = match dtype {
            DType::F32 => Storage::F32(vec![0.0; n]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n]),
            DType::F16 => Storage::F16(vec![f16::ZERO; n]),
            DType::I32 => Storage::I32(vec![0; n]),
            DType::I64 => Storage::I64(vec![0; n]),
            DType::U8 => Storage::U8(vec![0; n]),
        };
        Tensor {
            storage,
            shape: shape.to_vec(),
            device: Device::Cpu,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self.storage {
            Storage::F32(_) => DType::F32,
            Storage::BF16(_) => DType::BF16,
            Storage::F16(_) => DType::F16,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
            Storage::U8(_) => DType::U8,
        }
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The row-major shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements, in 64 bits.
    pub fn numel(&self) -> u64 {
        numel(&self.shape)
    }

    /// Size of the data in bytes, in 64 bits.
    pub fn size_bytes(&self) -> u64 {
        self.numel() * self.dtype().size_bytes()
    }

    /// The float32 data, or an error if the tensor holds another dtype.
    pub fn as_f32(&self) -> Result<&[f32], TensorError> {
        match &self.storage {
            Storage::F32(v) => Ok(v),
            _ => Err(self.dtype_error(DType::F32)),
        }
    }

    /// The float32 data, mutably.
    pub fn as_f32_mut(&mut self) -> Result<&mut [f32], TensorError> {
        let actual = self.dtype();
        match &mut self.storage {
            Storage::F32(v) => Ok(v),
            _ => Err(TensorError::DType {
                expected: DType::F32,
                actual,
            }),
        }
    }

    /// `len` float32 elements starting at the 64-bit element offset `offset`, bounds-checked.
    pub fn f32_range(&self, offset: u64, len: u64) -> Result<&[f32], TensorError> {
        let data = self.as_f32()?;
        let end = offset.checked_add(len).filter(|&e| e <= self.numel());
        match end {
            Some(end) => Ok(&data[offset as usize..end as usize]),
            None => Err(TensorError::OutOfBounds {
                offset,
                len,
                numel: self.numel(),
            }),
        }
    }

    /// The same values widened (or kept) as float32; integers and raw bytes are refused.
    pub fn to_f32(&self) -> Result<Tensor, TensorError> {
        let values = match &self.storage {
            Storage::F32(v) => v.clone(),
            Storage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            Storage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            _ => return Err(self.dtype_error(DType::F32)),
        };
        Tensor::from_f32(&self.shape, values)
    }

    fn dtype_error(&self, expected: DType) -> TensorError {
        TensorError::DType {
            expected,
            actual: self.dtype(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_must_match_data() {
        let err = Tensor::from_f32(&[2, 3], vec![1.5; 5]).unwrap_err();
        assert!(err.to_string().contains("needs 6 elements but 5"), "{err}");
    }

    #[test]
    fn ranges_are_checked_in_64_bits() {
        let t = Tensor::from_f32(&[4], vec![0.5, 1.5, 2.5, 3.5]).unwrap();
        assert_eq!(t.f32_range(1, 2).unwrap(), &[1.5, 2.5]);
        assert!(t.f32_range(3, 2).is_err());
        // An offset near 2^64 must not wrap around into bounds.
        assert!(t.f32_range(u64::MAX, 2).is_err());
    }

    #[test]
    fn sizes_past_4_gib_do_not_overflow() {
        // The shape alone (no allocation): 2^31 rows of 4 bf16 values is 16 GiB.
        let shape = [1usize << 31, 4];
        assert_eq!(numel(&shape) * DType::BF16.size_bytes(), 1u64 << 34);
    }

    #[test]
    fn widening_keeps_values() {
        let t = Tensor::from_bf16(&[2], vec![bf16::from_f32(1.25), bf16::from_f32(-3.0)]).unwrap();
        assert_eq!(t.to_f32().unwrap().as_f32().unwrap(), &[1.25, -3.0]);
        assert_eq!(
            Tensor::zeros(DType::I32, &[2]).to_f32().unwrap_err(),
            TensorError::DType {
                expected: DType::F32,
                actual: DType::I32
            }
        );
    }
}
