//! The closed sets of values some fields take: the device and the weights' dtype.

use serde::Deserialize;

/// The device the model runs on.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The CPU backend (always built).
    Cpu,
    /// An NVIDIA GPU through CUDA.
    Cuda,
}

impl DeviceKind {
    /// The name used by the flag and the file.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

/// The dtype the weights and activations are computed in.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DtypeChoice {
    /// The model's own dtype where the device supports it.
    Auto,
    /// bfloat16.
    Bfloat16,
    /// IEEE half precision.
    Float16,
    /// IEEE single precision.
    Float32,
}

impl DtypeChoice {
    /// The name used by the flag and the file.
    pub fn as_str(self) -> &'static str {
        match self {
            DtypeChoice::Auto => "auto",
            DtypeChoice::Bfloat16 => "bfloat16",
            DtypeChoice::Float16 => "float16",
            DtypeChoice::Float32 => "float32",
        }
    }
}
