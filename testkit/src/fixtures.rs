//! The workspace's fixtures, in the root `tests/fixtures/` (the root tests and the GPU
//! tests, run from the workspace root, read them by relative path), found from any crate.

use std::path::PathBuf;

/// The workspace's `tests/fixtures/` folder.
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");

/// The transformers fixtures' folder `name` of `tests/fixtures/deepseek/` (`deepseek_v2`,
/// `deepseek_v3`, `qwen3_moe`, `published`), or the folder itself for "".
pub fn deepseek(name: &str) -> PathBuf {
    PathBuf::from(ROOT).join("deepseek").join(name)
}
