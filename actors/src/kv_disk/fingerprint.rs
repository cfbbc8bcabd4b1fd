//! A model's fingerprint for the disk tier: blocks written for one model's weights are
//! never read for another's.

use super::chain::ContentHash;
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
