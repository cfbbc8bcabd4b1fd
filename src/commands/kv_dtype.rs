//! The KV cache's element type per device, from `--kv-cache-dtype`.

use peregrine_config::DtypeChoice;
use peregrine_ops::{KvDtype, KvRows};

/// The CPU KV cache's element for `--kv-cache-dtype` and a model whose tokens leave `rows`
/// (`None` or `auto`: bfloat16 for key and value caches, half float32's memory, with decode
/// steps 1.14-1.20x faster and prefill within 6%, docs/performance.md; float32 for a
/// latent-attention cache, which the MLA kernel reads in float32 only).
pub fn cpu_kv_dtype(choice: Option<DtypeChoice>, rows: KvRows) -> anyhow::Result<KvDtype> {
    match choice.unwrap_or(DtypeChoice::Auto) {
        DtypeChoice::Float32 => Ok(KvDtype::Float32),
        DtypeChoice::Auto if rows == KvRows::Latent => Ok(KvDtype::Float32),
        DtypeChoice::Auto | DtypeChoice::Bfloat16 => Ok(KvDtype::Bfloat16),
        DtypeChoice::Float16 => {
            anyhow::bail!("--kv-cache-dtype float16: the CPU's KV cache is float32 or bfloat16")
        }
    }
}

/// Refuses a `--kv-cache-dtype` other than `auto` or `bfloat16` on the GPU, whose KV cache
/// is bfloat16.
#[cfg(any(feature = "cuda", test))]
pub fn check_gpu_kv_dtype(choice: Option<DtypeChoice>) -> anyhow::Result<()> {
    match choice.unwrap_or(DtypeChoice::Auto) {
        DtypeChoice::Auto | DtypeChoice::Bfloat16 => Ok(()),
        other => anyhow::bail!(
            "--kv-cache-dtype {}: the GPU's KV cache is bfloat16 (auto)",
            other.as_str()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_gpu_kv_dtype, cpu_kv_dtype};
    use peregrine_config::DtypeChoice;
    use peregrine_ops::{KvDtype, KvRows};

    #[test]
    fn the_cpu_cache_is_bfloat16_unless_float32_is_asked_or_latent_and_float16_is_refused() {
        let kv = KvRows::KeysAndValues;
        assert_eq!(cpu_kv_dtype(None, kv).unwrap(), KvDtype::Bfloat16);
        let dtype = |choice| cpu_kv_dtype(Some(choice), kv).unwrap();
        assert_eq!(dtype(DtypeChoice::Auto), KvDtype::Bfloat16);
        assert_eq!(dtype(DtypeChoice::Float32), KvDtype::Float32);
        assert_eq!(dtype(DtypeChoice::Bfloat16), KvDtype::Bfloat16);
        let latent = cpu_kv_dtype(Some(DtypeChoice::Auto), KvRows::Latent).unwrap();
        assert_eq!(latent, KvDtype::Float32);
        let err = cpu_kv_dtype(Some(DtypeChoice::Float16), kv).unwrap_err();
        assert!(err.to_string().contains("float32 or bfloat16"), "{err}");
    }

    #[test]
    fn the_gpu_cache_takes_auto_or_bfloat16_only() {
        for ok in [None, Some(DtypeChoice::Auto), Some(DtypeChoice::Bfloat16)] {
            check_gpu_kv_dtype(ok).unwrap();
        }
        for refused in [DtypeChoice::Float32, DtypeChoice::Float16] {
            let err = check_gpu_kv_dtype(Some(refused)).unwrap_err().to_string();
            assert!(
                err.contains(refused.as_str()) && err.contains("bfloat16 (auto)"),
                "{err}"
            );
        }
    }
}
