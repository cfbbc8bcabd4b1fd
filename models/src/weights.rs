//! Memory-mapped checkpoints: one `model.safetensors`, shards listed in
//! `model.safetensors.index.json`, or a GGUF file (`model.gguf`, from `import_gguf`).
//! Tensors are read as float32 whatever their stored dtype, or as a [`Matrix`] kept in its
//! stored form (bf16, f16, a ggml block quantization); integer tensors (EAGLE-3's `d2t`)
//! as int64.

use crate::gguf::{GgufWeights, GGUF_WEIGHTS};
use memmap2::Mmap;
use peregrine_kernels::cpu::quant::Half;
use peregrine_kernels::cpu::{Matrix, MatrixError};
use rayon::prelude::*;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// A tensor that cannot be loaded, named.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid safetensors file: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error("{0} holds none of model.safetensors, model.safetensors.index.json, model.gguf")]
    NoWeights(PathBuf),
    #[error("tensor `{0}` is missing from the checkpoint")]
    Missing(String),
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("tensor `{name}` is stored as {dtype:?}; expected {expected}")]
    DType {
        name: String,
        dtype: Dtype,
        expected: &'static str,
    },
    #[error("{0:#}")]
    Gguf(anyhow::Error),
    #[error("tensor `{name}`: {source}")]
    Matrix { name: String, source: MatrixError },
}

struct Shard {
    path: PathBuf,
    map: Mmap,
    data_start: usize,
    metadata: Metadata,
}

/// A checkpoint: safetensors shards mapped into memory and where each tensor lives, or
/// a GGUF file.
pub struct Weights {
    shards: Vec<Shard>,
    location: HashMap<String, usize>,
    gguf: Option<GgufWeights>,
}

impl Weights {
    /// Maps the checkpoint in `dir`.
    pub fn open(dir: &Path) -> Result<Weights, WeightError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let gguf = dir.join(GGUF_WEIGHTS);
        if !single.exists() && !index.exists() && gguf.exists() {
            return Ok(Weights {
                shards: Vec::new(),
                location: HashMap::new(),
                gguf: Some(GgufWeights::open(&gguf).map_err(WeightError::Gguf)?),
            });
        }
        let files = if single.exists() {
            vec![single]
        } else if index.exists() {
            shard_files(dir, &index)?
        } else {
            return Err(WeightError::NoWeights(dir.to_path_buf()));
        };
        let mut weights = Weights {
            shards: Vec::new(),
            location: HashMap::new(),
            gguf: None,
        };
        for path in files {
            let shard = map_shard(path)?;
            for name in shard.metadata.tensors().keys() {
                weights.location.insert(name.clone(), weights.shards.len());
            }
            weights.shards.push(shard);
        }
        Ok(weights)
    }

    /// Whether the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        match &self.gguf {
            Some(g) => g.contains(name),
            None => self.location.contains_key(name),
        }
    }

    /// Tensor `name` as float32, checked to have `shape`.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightError> {
        if let Some(g) = &self.gguf {
            return g.f32(name, shape).map_err(WeightError::Gguf);
        }
        let (bytes, dtype) = self.raw(name, shape)?;
        let widen: fn(&[u8]) -> f32 = match dtype {
            Dtype::F32 => |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Dtype::F16 => |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            Dtype::BF16 => |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            dtype => {
                return Err(WeightError::DType {
                    name: name.to_string(),
                    dtype,
                    expected: "F32, F16 or BF16",
                })
            }
        };
        let size = dtype.bitsize() / 8;
        Ok(bytes.par_chunks_exact(size).map(widen).collect())
    }

    /// The 2-D tensor `name` (`[rows, cols]`) as a matrix kept in its stored form: F32,
    /// BF16 and F16 safetensors as they are, a GGUF tensor as stored (block-quantized
    /// included).
    pub fn matrix(&self, name: &str, shape: [usize; 2]) -> Result<Matrix, WeightError> {
        if let Some(g) = &self.gguf {
            return g.matrix(name, shape).map_err(WeightError::Gguf);
        }
        let (bytes, dtype) = self.raw(name, &shape)?;
        let matrix = match dtype {
            Dtype::BF16 => Matrix::half_bytes(Half::Bf16, bytes, shape[1]),
            Dtype::F16 => Matrix::half_bytes(Half::F16, bytes, shape[1]),
            _ => Matrix::f32(self.f32(name, &shape)?.into(), shape[1]),
        };
        matrix.map_err(|source| WeightError::Matrix {
            name: name.to_string(),
            source,
        })
    }

    /// Tensor `name` as int64, checked to have `shape` and to be stored as I64.
    pub fn i64(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>, WeightError> {
        if self.gguf.is_some() {
            return Err(WeightError::Gguf(anyhow::anyhow!(
                "tensor `{name}`: GGUF checkpoints hold no int64 tensors Peregrine reads"
            )));
        }
        let (bytes, dtype) = self.raw(name, shape)?;
        if dtype != Dtype::I64 {
            return Err(WeightError::DType {
                name: name.to_string(),
                dtype,
                expected: "I64",
            });
        }
        Ok(bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8-byte chunk")))
            .collect())
    }

    /// The stored bytes and dtype of tensor `name`, checked to have `shape`.
    fn raw(&self, name: &str, shape: &[usize]) -> Result<(&[u8], Dtype), WeightError> {
        let shard = &self.shards[*self
            .location
            .get(name)
            .ok_or_else(|| WeightError::Missing(name.to_string()))?];
        let info = shard
            .metadata
            .info(name)
            .ok_or_else(|| WeightError::Missing(name.to_string()))?;
        if info.shape != shape {
            return Err(WeightError::Shape {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: info.shape.clone(),
            });
        }
        let (start, end) = info.data_offsets;
        let bytes = shard
            .map
            .get(shard.data_start + start..shard.data_start + end)
            .ok_or_else(|| WeightError::Format {
                path: shard.path.clone(),
                reason: format!("tensor `{name}` lies past the end of the file"),
            })?;
        Ok((bytes, info.dtype))
    }
}

fn shard_files(dir: &Path, index: &Path) -> Result<Vec<PathBuf>, WeightError> {
    let format = |reason: String| WeightError::Format {
        path: index.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(index).map_err(|source| WeightError::Open {
        path: index.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| format(e.to_string()))?;
    let map = json["weight_map"]
        .as_object()
        .ok_or_else(|| format("no `weight_map` object".into()))?;
    let mut files: Vec<String> = map
        .values()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<_>>()
        .ok_or_else(|| format("`weight_map` values must be file names".into()))?;
    files.sort();
    files.dedup();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

fn map_shard(path: PathBuf) -> Result<Shard, WeightError> {
    let file = File::open(&path).map_err(|source| WeightError::Open {
        path: path.clone(),
        source,
    })?;
    // SAFETY: the checkpoint is opened read-only and not expected to change while mapped.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| WeightError::Open {
        path: path.clone(),
        source,
    })?;
    let (header, metadata) = SafeTensors::read_metadata(&map).map_err(|e| WeightError::Format {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    Ok(Shard {
        path,
        map,
        data_start: 8 + header,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    #[test]
    fn reads_int64_and_refuses_the_wrong_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<u8> = [-3i64, 0, 1 << 40]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let floats: Vec<u8> = [0.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let views = [
            ("d2t", TensorView::new(Dtype::I64, vec![3], &ids).unwrap()),
            ("w", TensorView::new(Dtype::F32, vec![2], &floats).unwrap()),
        ];
        safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
        let w = Weights::open(dir.path()).unwrap();
        assert_eq!(w.i64("d2t", &[3]).unwrap(), vec![-3, 0, 1 << 40]);
        let e = w.i64("w", &[2]).unwrap_err();
        assert_eq!(e.to_string(), "tensor `w` is stored as F32; expected I64");
        let e = w.f32("d2t", &[3]).unwrap_err();
        assert!(e.to_string().contains("`d2t` is stored as I64"), "{e}");
        let e = w.i64("d2t", &[4]).unwrap_err();
        assert!(
            e.to_string().contains("`d2t` has shape [3], expected [4]"),
            "{e}"
        );
        assert!(matches!(w.i64("t2d", &[3]), Err(WeightError::Missing(n)) if n == "t2d"));
    }
}
