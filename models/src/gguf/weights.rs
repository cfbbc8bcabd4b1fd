//! A GGUF file's tensors read as a Llama checkpoint, under their Hugging Face names: 2-D
//! weights kept as they are stored (block-quantized, f16, bf16 or f32), the rows llama.cpp
//! permuted put back in Hugging Face's order.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use peregrine_kernels::cpu::quant::Half;
use peregrine_kernels::cpu::Matrix;

use super::dequant::dequantize;
use super::hf_config::LlamaConfig;
use super::names::{hf_name, Permuted};
use super::permute::{check_permutable, unpermute_rows};
use super::reader::{GgufFile, TensorInfo};
use super::types::GgmlType;

/// An open GGUF file whose tensors are looked up by Hugging Face name.
pub struct GgufWeights {
    file: GgufFile,
    /// Hugging Face name → (index in the file's tensors, heads to unpermute by).
    names: HashMap<String, (usize, Option<usize>)>,
}

impl GgufWeights {
    /// Opens the Llama GGUF file at `path`; an error for another architecture.
    pub fn open(path: &Path) -> Result<GgufWeights> {
        let file = GgufFile::open(path)?;
        let config = LlamaConfig::from_gguf(&file)?;
        let mut names = HashMap::new();
        for (i, info) in file.tensors().iter().enumerate() {
            if let Some((hf, permuted)) = hf_name(&info.name) {
                let heads = match permuted {
                    Permuted::No => None,
                    Permuted::Query => Some(config.num_heads),
                    Permuted::Key => Some(config.num_kv_heads),
                };
                names.insert(hf, (i, heads));
            }
        }
        Ok(GgufWeights { file, names })
    }

    /// Whether the file holds the tensor Hugging Face calls `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// Tensor `name` dequantized to float32, checked to have `shape` (Hugging Face order).
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (info, heads) = self.find(name, shape)?;
        let values = dequantize(info.ggml_type, self.file.tensor_bytes(info)?)
            .with_context(|| format!("tensor `{name}`"))?;
        Ok(match heads {
            Some(heads) => unpermute_rows(&values, shape[0], heads),
            None => values,
        })
    }

    /// The 2-D tensor `name` (`[rows, cols]`) as a matrix in its stored form.
    pub fn matrix(&self, name: &str, shape: [usize; 2]) -> Result<Matrix> {
        let (info, heads) = self.find(name, &shape)?;
        let bytes = self.file.tensor_bytes(info)?;
        let rows = |data: &[u8]| -> Vec<u8> {
            match heads {
                Some(heads) => {
                    unpermute_rows(&row_chunks(data, shape[0]), shape[0], heads).concat()
                }
                None => data.to_vec(),
            }
        };
        let cols = shape[1];
        let matrix = match info.ggml_type {
            GgmlType::F32 => Matrix::f32(self.f32(name, &shape)?.into(), cols),
            GgmlType::F16 => Matrix::half_bytes(Half::F16, &rows(bytes), cols),
            GgmlType::BF16 => Matrix::half_bytes(Half::Bf16, &rows(bytes), cols),
            ty => match ty.block_format() {
                Some(format) => Matrix::blocks(format, rows(bytes).into(), cols),
                None => bail!("tensor `{name}` has type {ty}, which Peregrine cannot read"),
            },
        };
        matrix.with_context(|| format!("tensor `{name}` ({})", info.ggml_type))
    }

    fn find(&self, name: &str, shape: &[usize]) -> Result<(&TensorInfo, Option<usize>)> {
        let &(i, heads) = self
            .names
            .get(name)
            .with_context(|| format!("tensor `{name}` is missing from the GGUF file"))?;
        let info = &self.file.tensors()[i];
        if info.hf_shape() != shape {
            bail!(
                "tensor `{name}` ({}) has shape {:?}, expected {shape:?}",
                info.name,
                info.hf_shape()
            );
        }
        if let Some(heads) = heads {
            check_permutable(&info.name, shape[0], heads)?;
        }
        Ok((info, heads))
    }
}

/// `data` cut into `rows` equal rows.
fn row_chunks(data: &[u8], rows: usize) -> Vec<&[u8]> {
    data.chunks_exact(data.len() / rows.max(1)).collect()
}
