//! A minimal GGUF writer for tests: metadata of every value type, tensor infos, aligned data,
//! and its own F16/BF16/Q8_0/Q4_0/Q4_1 encoders, written without looking at the reader.

use half::{bf16, f16};
use std::path::Path;

/// ggml type ids.
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q8_0: u32 = 8;
pub const Q2_K: u32 = 10;
pub const BF16: u32 = 30;

/// A GGUF metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Meta {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    /// Elements must share one type; an empty array is written as an array of strings.
    Array(Vec<Meta>),
}

impl Meta {
    /// A string value.
    pub fn str(s: &str) -> Meta {
        Meta::Str(s.to_string())
    }

    /// An array of strings.
    pub fn strs<S: AsRef<str>>(items: &[S]) -> Meta {
        Meta::Array(items.iter().map(|s| Meta::str(s.as_ref())).collect())
    }

    fn type_id(&self) -> u32 {
        match self {
            Meta::U8(_) => 0,
            Meta::I8(_) => 1,
            Meta::U16(_) => 2,
            Meta::I16(_) => 3,
            Meta::U32(_) => 4,
            Meta::I32(_) => 5,
            Meta::F32(_) => 6,
            Meta::Bool(_) => 7,
            Meta::Str(_) => 8,
            Meta::Array(_) => 9,
            Meta::U64(_) => 10,
            Meta::I64(_) => 11,
            Meta::F64(_) => 12,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Meta::U8(v) => out.push(*v),
            Meta::I8(v) => out.extend(v.to_le_bytes()),
            Meta::U16(v) => out.extend(v.to_le_bytes()),
            Meta::I16(v) => out.extend(v.to_le_bytes()),
            Meta::U32(v) => out.extend(v.to_le_bytes()),
            Meta::I32(v) => out.extend(v.to_le_bytes()),
            Meta::U64(v) => out.extend(v.to_le_bytes()),
            Meta::I64(v) => out.extend(v.to_le_bytes()),
            Meta::F32(v) => out.extend(v.to_le_bytes()),
            Meta::F64(v) => out.extend(v.to_le_bytes()),
            Meta::Bool(v) => out.push(*v as u8),
            Meta::Str(s) => write_str(out, s),
            Meta::Array(items) => {
                let elem = items.first().map_or(8, Meta::type_id);
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    assert_eq!(item.type_id(), elem, "mixed-type GGUF array");
                    item.write(out);
                }
            }
        }
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A GGUF file under construction.
pub struct GgufWriter {
    pub version: u32,
    pub alignment: u64,
    meta: Vec<(String, Meta)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            alignment: 32,
            meta: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    /// Adds (or replaces) a metadata entry.
    pub fn meta(&mut self, key: &str, value: Meta) -> &mut Self {
        self.meta.retain(|(k, _)| k != key);
        self.meta.push((key.to_string(), value));
        self
    }

    /// Removes a metadata entry.
    pub fn remove_meta(&mut self, key: &str) -> &mut Self {
        self.meta.retain(|(k, _)| k != key);
        self
    }

    /// Adds a tensor whose PyTorch shape is `shape` (written reversed, as ggml dims) with
    /// already-encoded `data`.
    pub fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        ggml_type: u32,
        data: Vec<u8>,
    ) -> &mut Self {
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push((name.to_string(), dims, ggml_type, data));
        self
    }

    /// Adds a tensor of f32 `values`, encoded as `ggml_type`.
    pub fn tensor_f32(
        &mut self,
        name: &str,
        shape: &[usize],
        ggml_type: u32,
        values: &[f32],
    ) -> &mut Self {
        self.tensor(name, shape, ggml_type, encode(values, ggml_type))
    }

    /// Drops a tensor.
    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|(n, ..)| n != name);
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut meta = self.meta.clone();
        if self.alignment != 32 {
            meta.push(("general.alignment".into(), Meta::U32(self.alignment as u32)));
        }
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((meta.len() as u64).to_le_bytes());
        for (key, value) in &meta {
            write_str(&mut out, key);
            out.extend(value.type_id().to_le_bytes());
            value.write(&mut out);
        }
        let align = |n: usize| n.div_ceil(self.alignment as usize) * self.alignment as usize;
        let mut offset = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            write_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset = align(offset + data.len());
        }
        out.resize(align(out.len()), 0);
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            out.resize(align(out.len()), 0);
        }
        out
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.to_bytes()).unwrap();
    }
}

/// `values` encoded as ggml type `ggml_type` (F32, F16, BF16, Q8_0, Q4_0 or Q4_1).
pub fn encode(values: &[f32], ggml_type: u32) -> Vec<u8> {
    match ggml_type {
        F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        BF16 => values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        Q8_0 => values.chunks(32).flat_map(q8_0_block).collect(),
        Q4_0 => values.chunks(32).flat_map(q4_0_block).collect(),
        Q4_1 => values.chunks(32).flat_map(q4_1_block).collect(),
        other => panic!("the test writer cannot encode ggml type {other}"),
    }
}

/// Scale by the largest magnitude so it maps to +-127.
fn q8_0_block(x: &[f32]) -> Vec<u8> {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let mut out = f16::from_f32(scale).to_le_bytes().to_vec();
    for v in x {
        let q = if scale == 0.0 {
            0.0
        } else {
            (v / scale).round()
        };
        out.push(q.clamp(-127.0, 127.0) as i8 as u8);
    }
    out
}

/// The element of largest magnitude maps to code 0 (value -8 * d); codes are 4 bits with an
/// offset of 8; element i and element i + 16 share byte i (low, high nibble).
fn q4_0_block(x: &[f32]) -> Vec<u8> {
    let extreme = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let scale = extreme / -8.0;
    let code = |v: f32| -> u8 {
        let q = if scale == 0.0 {
            0.0
        } else {
            (v / scale).round()
        };
        (q + 8.0).clamp(0.0, 15.0) as u8
    };
    let mut out = f16::from_f32(scale).to_le_bytes().to_vec();
    out.extend((0..16).map(|i| code(x[i]) | (code(x[i + 16]) << 4)));
    out
}

/// Codes 0..15 span [min, max]: value = code * d + min.
fn q4_1_block(x: &[f32]) -> Vec<u8> {
    let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let scale = (hi - lo) / 15.0;
    let code = |v: f32| -> u8 {
        let q = if scale == 0.0 {
            0.0
        } else {
            ((v - lo) / scale).round()
        };
        q.clamp(0.0, 15.0) as u8
    };
    let mut out = f16::from_f32(scale).to_le_bytes().to_vec();
    out.extend(f16::from_f32(lo).to_le_bytes());
    out.extend((0..16).map(|i| code(x[i]) | (code(x[i + 16]) << 4)));
    out
}

/// llama.cpp's q/k permutation of a `[rows, cols]` row-major matrix:
/// `w.reshape(n_heads, 2, rows / n_heads / 2, cols).swapaxes(1, 2).reshape(rows, cols)`.
pub fn llama_cpp_permute(w: &[f32], rows: usize, n_heads: usize) -> Vec<f32> {
    let cols = w.len() / rows;
    let half = rows / n_heads / 2;
    let mut out = Vec::with_capacity(w.len());
    // Output index order (head, i, j) with j fastest: source row head * 2 * half + j * half + i.
    for head in 0..n_heads {
        for i in 0..half {
            for j in 0..2 {
                let src = head * 2 * half + j * half + i;
                out.extend_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}
