//! A model's fingerprint for the disk tier, and its block shape's: blocks written for one
//! model's weights, or in another layout or on another device, are never read.

use super::chain::ContentHash;
use peregrine_kernels::cpu::KvLayout;
use peregrine_ops::{KvDtype, KvRows};
use sha2::{Digest, Sha256};
use std::io::{self, Read};
use std::path::Path;

/// The SHA-256 over the files of the model at `path` (one file, or a directory's files in
/// name order, subdirectories left out): each file's name, length and bytes. Weights,
/// their shapes and names, and the configuration are all in those bytes.
pub fn model_fingerprint(path: &Path) -> io::Result<ContentHash> {
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut hash = Sha256::new();
    let mut buf = vec![0; 1 << 20];
    for file in files {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        hash.update(name.unwrap_or_default().as_bytes());
        hash.update([0]);
        let mut f = std::fs::File::open(&file)?;
        hash.update(f.metadata()?.len().to_le_bytes());
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
        }
    }
    Ok(hash.finalize().into())
}

/// How a backend's pool lays out one block, which the bytes on disk are: a file is read
/// only by a pool that lays its blocks out the same way, on the same kind of device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockShape {
    /// The backend whose pool wrote the blocks (`cpu`, `cuda`): its kernels compute the
    /// keys and values, so another device's are not taken for its own.
    pub device: &'static str,
    /// The cache's element.
    pub dtype: KvDtype,
    /// What a token leaves in a layer.
    pub rows: KvRows,
    /// A layer's layout (its block count is not part of the shape).
    pub layout: KvLayout,
    /// Bytes of one block over every layer.
    pub block_bytes: u64,
}

/// The fingerprint that names a disk tier's file: the SHA-256 of the model's
/// ([`model_fingerprint`]) and of the block shape it is cached in.
pub fn block_fingerprint(model: &ContentHash, shape: &BlockShape) -> ContentHash {
    let mut hash = Sha256::new();
    hash.update(model);
    hash.update(
        format!(
            "{} {:?} {:?} block_size {} kv_heads {} head_dim {} block_bytes {}",
            shape.device,
            shape.dtype,
            shape.rows,
            shape.layout.block_size,
            shape.layout.num_kv_heads,
            shape.layout.head_dim,
            shape.block_bytes
        )
        .as_bytes(),
    );
    hash.finalize().into()
}
