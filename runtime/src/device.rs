//! The device a model runs on.

use std::fmt;
use std::str::FromStr;

/// Where tensors live and kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Device {
    /// Host memory; kernels in plain Rust and matrix products through `gemm`.
    #[default]
    Cpu,
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "hip" => Err(format!(
                "device `{s}` is not available in this build: only `cpu` is built in"
            )),
            other => Err(format!("unknown device `{other}` (expected cpu)")),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
        }
    }
}
