//! Opening a GGUF file (v2 and v3, little-endian): header, metadata, tensor infos, and the
//! memory-mapped tensor data.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::Path;

use anyhow::{bail, Context, Result};
use memmap2::Mmap;

use super::cursor::Cursor;
use super::types::GgmlType;
use super::value::Value;

/// Tensor data is aligned to this many bytes unless `general.alignment` says otherwise.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most this many dimensions.
const MAX_DIMS: u32 = 4;

/// One tensor's description from the GGUF header.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// The GGUF tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// ggml dimensions, fastest-varying first (`dims[0]` is the row length).
    pub dims: Vec<u64>,
    /// The storage type.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Size of the data in bytes, known for the types Peregrine can read.
    pub n_bytes: Option<u64>,
}

impl TensorInfo {
    /// The shape in PyTorch / Hugging Face order (slowest-varying first).
    pub fn hf_shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An open GGUF file.
pub struct GgufFile {
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    mmap: Mmap,
}

impl GgufFile {
    /// Opens and validates `path`: every tensor of a readable type must lie inside the file.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: the mapping is read-only; as with every memory-mapped model loader, the
        // file must not be truncated or rewritten by another process while it is open.
        let mmap = unsafe { Mmap::map(&file) }
            .with_context(|| format!("memory-mapping {}", path.display()))?;
        let (version, metadata, tensors) =
            parse(&mmap).with_context(|| format!("reading GGUF file {}", path.display()))?;
        Ok(Self {
            version,
            metadata,
            tensors,
            mmap,
        })
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw stored bytes of `info`'s data; an error for types Peregrine cannot read.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<&[u8]> {
        let n_bytes = info.n_bytes.with_context(|| {
            format!(
                "tensor '{}' has type {}, which Peregrine cannot read (supported: {})",
                info.name,
                info.ggml_type,
                supported_list()
            )
        })?;
        // Checked against the file length when the file was opened.
        usize::try_from(info.offset)
            .ok()
            .zip(usize::try_from(n_bytes).ok())
            .and_then(|(start, len)| self.mmap.get(start..start.checked_add(len)?))
            .with_context(|| format!("tensor '{}' data lies outside the file", info.name))
    }
}

/// The readable types, comma-separated, for error messages.
pub(crate) fn supported_list() -> String {
    let names: Vec<String> = GgmlType::SUPPORTED.iter().map(|t| t.to_string()).collect();
    names.join(", ")
}

type Parsed = (u32, BTreeMap<String, Value>, Vec<TensorInfo>);

fn parse(buf: &[u8]) -> Result<Parsed> {
    let mut c = Cursor::new(buf);
    if c.take(4, "magic")? != b"GGUF" {
        bail!("not a GGUF file (the first 4 bytes are not 'GGUF')");
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => bail!("GGUF version 1 is not supported (only 2 and 3)"),
        v if matches!(v.swap_bytes(), 2 | 3) => bail!("big-endian GGUF files are not supported"),
        v => bail!("unsupported GGUF version {v} (only 2 and 3)"),
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c
            .string("metadata key")
            .with_context(|| format!("reading metadata entry #{i}"))?;
        let value = c
            .u32("value type")
            .and_then(|ty| c.value(ty))
            .with_context(|| format!("reading the value of metadata key '{key}'"))?;
        if metadata.insert(key.clone(), value).is_some() {
            bail!("metadata key '{key}' appears twice");
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 => a,
            _ => bail!("general.alignment must be a positive integer, found {v:?}"),
        },
    };

    let mut tensors = Vec::new();
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let info = tensor_info(&mut c).with_context(|| format!("reading tensor info #{i}"))?;
        if !names.insert(info.name.clone()) {
            bail!("tensor '{}' appears twice", info.name);
        }
        tensors.push(info);
    }

    let data_start = align_up(c.pos() as u64, alignment).context("tensor data offset overflows")?;
    for t in &mut tensors {
        locate(t, data_start, alignment, buf.len() as u64)?;
    }
    Ok((version, metadata, tensors))
}

/// Reads one tensor info; its offset is still relative to the data section.
fn tensor_info(c: &mut Cursor<'_>) -> Result<TensorInfo> {
    let name = c.string("tensor name")?;
    let ctx = || format!("tensor '{name}'");
    let n_dims = c.u32("dimension count").with_context(ctx)?;
    if n_dims > MAX_DIMS {
        bail!("tensor '{name}' has {n_dims} dimensions (ggml allows at most {MAX_DIMS})");
    }
    let dims = (0..n_dims)
        .map(|_| c.u64("dimension"))
        .collect::<Result<Vec<_>>>()
        .with_context(ctx)?;
    let ggml_type = GgmlType(c.u32("tensor type").with_context(ctx)?);
    let offset = c.u64("tensor data offset").with_context(ctx)?;
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_bytes: None,
    })
}

/// Makes `t.offset` absolute and, for readable types, computes and bounds-checks its size.
fn locate(t: &mut TensorInfo, data_start: u64, alignment: u64, file_len: u64) -> Result<()> {
    if !t.offset.is_multiple_of(alignment) {
        bail!(
            "tensor '{}' data offset {} is not a multiple of the alignment {alignment}",
            t.name,
            t.offset
        );
    }
    t.offset = data_start
        .checked_add(t.offset)
        .with_context(|| format!("tensor '{}' data offset overflows", t.name))?;
    let Some((block_elems, block_bytes)) = t.ggml_type.block_layout() else {
        return Ok(());
    };
    let n_elements = t
        .dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .with_context(|| format!("tensor '{}' has too many elements", t.name))?;
    let row = t.dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(block_elems) {
        bail!(
            "tensor '{}' rows of {row} elements are not whole {} blocks of {block_elems}",
            t.name,
            t.ggml_type
        );
    }
    let n_bytes = (n_elements / block_elems)
        .checked_mul(block_bytes)
        .with_context(|| format!("tensor '{}' is too large", t.name))?;
    match t.offset.checked_add(n_bytes) {
        Some(end) if end <= file_len => {}
        _ => bail!(
            "GGUF file is truncated: tensor '{}' data needs bytes {}..{} but the file has {file_len}",
            t.name,
            t.offset,
            t.offset.saturating_add(n_bytes)
        ),
    }
    t.n_bytes = Some(n_bytes);
    Ok(())
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    Some(x.checked_add(alignment - 1)? / alignment * alignment)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(version: u32) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b
    }

    #[test]
    fn header_checks() {
        assert!(parse(&header(3)).is_ok());
        assert!(parse(&header(2)).is_ok());
        let msg = |b: &[u8]| format!("{:#}", parse(b).err().unwrap());
        assert!(msg(&header(1)).contains("version 1"));
        assert!(msg(&header(3u32.swap_bytes())).contains("big-endian"));
        assert!(msg(b"GGML").contains("not a GGUF"));
        assert!(msg(&header(3)[..10]).contains("tensor count"));
    }

    #[test]
    fn align() {
        assert_eq!(align_up(0, 32), Some(0));
        assert_eq!(align_up(33, 32), Some(64));
        assert_eq!(align_up(u64::MAX, 32), None);
    }
}
