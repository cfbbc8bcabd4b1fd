//! `--tensor-parallel-size`: checked against the model, the GPUs and NCCL at start-up,
//! then refused above 1, since the NCCL runners that would run the shards
//! (`peregrine_models::tensor_parallel`) are not built.

use anyhow::Context;
use peregrine_config::{DeviceKind, ServeConfig};
use peregrine_models::tensor_parallel::{validate, TpShape};
use peregrine_models::ModelConfig;
use std::path::Path;

/// Checks `config`'s tensor-parallel size against the model in `dir` and the GPUs
/// visible, and refuses any size above 1; size 1 reads nothing.
pub fn check_start_up(config: &ServeConfig, dir: &Path) -> anyhow::Result<()> {
    let size = config.tensor_parallel_size;
    if size == 1 {
        return Ok(());
    }
    let model = ModelConfig::from_dir(dir).with_context(|| format!("loading {}", dir.display()))?;
    check(size, &model, gpus(config.device), nccl(config.device))
}

/// The NCCL version a tensor-parallel group on `device` would join its ranks with, or why
/// there is none; `None` where no GPU is involved.
fn nccl(device: DeviceKind) -> Option<Result<String, String>> {
    match device {
        DeviceKind::Cpu => None,
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => Some(
            peregrine_runtime::cuda::nccl::nccl_version()
                .map(|v| v.to_string())
                .map_err(|e| e.to_string()),
        ),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => None,
    }
}

/// The GPUs a tensor-parallel group on `device` could use: none is counted on the CPU.
fn gpus(device: DeviceKind) -> Option<usize> {
    match device {
        DeviceKind::Cpu => None,
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => Some(peregrine_runtime::cuda::device_count().unwrap_or(0)),
        // Refused after this check: this binary has no CUDA backend.
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => None,
    }
}

/// Tensor-parallel `size` over `model` with `gpus` GPUs and `nccl` (its version, or why
/// it cannot be loaded; `None`: neither counted): the precise error of a size the model,
/// the GPUs or a missing NCCL cannot take, else, above 1, the refusal.
fn check(
    size: usize,
    model: &ModelConfig,
    gpus: Option<usize>,
    nccl: Option<Result<String, String>>,
) -> anyhow::Result<()> {
    validate(&TpShape::of(model)?, size, gpus)?;
    if size == 1 {
        return Ok(());
    }
    let found = match nccl {
        Some(Err(why)) => anyhow::bail!("--tensor-parallel-size {size}: {why}"),
        Some(Ok(version)) => format!(" (NCCL {version} was found)"),
        None => String::new(),
    };
    anyhow::bail!(
        "--tensor-parallel-size {size}: tensor parallelism over NCCL is not built yet{found} \
         (the model's shards are described, but no runner splits a forward over GPUs); \
         use --tensor-parallel-size 1"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// SmolLM2-135M's config.json, in a directory of its own.
    fn smollm2_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let config = r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 49152,
            "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 8192, "tie_word_embeddings": true}"#;
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        dir
    }

    /// The configuration `peregrine serve` gets from `flags`.
    fn serve_config(flags: &[&str]) -> anyhow::Result<ServeConfig> {
        let cli = crate::cli::Cli::try_parse_from(["peregrine", "serve"].iter().chain(flags))?;
        match cli.command {
            crate::cli::Command::Serve(args) => Ok(ServeConfig::load(&args)?),
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn the_size_defaults_to_one_and_zero_is_refused_by_the_flag() {
        let config = serve_config(&[]).unwrap();
        assert_eq!(config.tensor_parallel_size, 1);
        let dir = smollm2_dir();
        check_start_up(&config, dir.path()).unwrap();
        // Size 1 reads no config.json.
        check_start_up(&config, &dir.path().join("absent")).unwrap();
        let err = serve_config(&["--tensor-parallel-size", "0"]).unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("--tensor-parallel-size must be at least 1, not 0"),
            "{err}"
        );
    }

    #[test]
    fn a_size_above_one_is_refused_at_start_up_after_the_models_checks() {
        let dir = smollm2_dir();
        // 3 splits SmolLM2's 9 heads, 3 KV heads and 1536: refused as not built.
        let config = serve_config(&["--tensor-parallel-size", "3"]).unwrap();
        assert_eq!(config.tensor_parallel_size, 3);
        let err = check_start_up(&config, dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("--tensor-parallel-size 3: tensor parallelism over NCCL is not built yet"),
            "{err}"
        );
        // 2 does not divide the 9 heads: that is the error.
        let config = serve_config(&["--tensor-parallel-size", "2"]).unwrap();
        let err = check_start_up(&config, dir.path()).unwrap_err().to_string();
        assert_eq!(
            err,
            "--tensor-parallel-size 2 does not divide the model's 9 attention heads"
        );
        // Too few GPUs is named before the refusal.
        let model = ModelConfig::from_dir(dir.path()).unwrap();
        let err = check(3, &model, Some(1), None).unwrap_err().to_string();
        assert_eq!(err, "--tensor-parallel-size 3 needs 3 GPUs; 1 found");
        check(1, &model, Some(1), None).unwrap();
    }

    #[test]
    fn a_missing_nccl_is_named_after_the_gpus_and_a_found_one_in_the_refusal() {
        let dir = smollm2_dir();
        let model = ModelConfig::from_dir(dir.path()).unwrap();
        let missing = || {
            Some(Err(
                "NCCL cannot be used: no libnccl.so could be opened".into()
            ))
        };
        let err = check(3, &model, Some(4), missing())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--tensor-parallel-size 3: NCCL cannot be used: no libnccl.so could be opened"
        );
        // Too few GPUs comes first; size 1 needs no NCCL.
        let err = check(3, &model, Some(2), missing())
            .unwrap_err()
            .to_string();
        assert_eq!(err, "--tensor-parallel-size 3 needs 3 GPUs; 2 found");
        check(1, &model, Some(1), missing()).unwrap();
        let err = check(3, &model, Some(4), Some(Ok("2.27.3".into())))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "--tensor-parallel-size 3: tensor parallelism over NCCL is not built yet \
                 (NCCL 2.27.3 was found)"
            ),
            "{err}"
        );
    }

    #[test]
    fn the_engine_loader_refuses_before_loading_the_model() {
        // The directory holds no weights: the refusal comes first.
        let dir = smollm2_dir();
        let config = serve_config(&["--tensor-parallel-size", "3"]).unwrap();
        let err = match crate::commands::engine::load_backend(&config, dir.path()) {
            Ok(_) => panic!("a tensor-parallel size of 3 was accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            err.contains("tensor parallelism over NCCL is not built yet"),
            "{err}"
        );
    }
}
