//! The DeepSeek-V3 fixture with a random multi-token prediction layer
//! (`peregrine_testkit::mtp_checkpoint`), read from `tests/fixtures/deepseek/deepseek_v3`
//! relative to the working directory: the workspace root, where the root tests run and
//! where `scripts/gpu_run.sh` runs the GPU tests.

use std::path::Path;

const FIXTURE: &str = "tests/fixtures/deepseek/deepseek_v3";

/// Writes the fixture with an MTP layer (random: norms near 1, the rest N(0, 0.1)-like)
/// into `dir`, sharded with an index.
pub fn write(dir: &Path, seed: u64) {
    peregrine_testkit::mtp_checkpoint::write_from(Path::new(FIXTURE), dir, seed);
}
