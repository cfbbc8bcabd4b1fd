//! The KV cache's shape and budget.

/// A cache configuration that cannot be used, naming the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheConfigError {
    #[error("block_size must be a power of two from 1 to 256, not {0}")]
    BlockSize(usize),
    #[error(
        "kv_cache_memory of {budget} bytes holds no block: one block takes {block_bytes} bytes"
    )]
    TooSmall { budget: u64, block_bytes: u64 },
    #[error("kv_cache_memory of {budget} bytes makes {blocks} blocks, more than block ids (u32) can name")]
    TooManyBlocks { budget: u64, blocks: u64 },
}

/// How the paged KV cache is cut and how much memory it may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes the cache may take across all layers; `None` sizes it to the work at hand.
    pub kv_cache_memory: Option<u64>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            block_size: 16,
            kv_cache_memory: None,
        }
    }
}

impl CacheConfig {
    /// Checks the block size.
    pub fn validate(&self) -> Result<(), CacheConfigError> {
        if !self.block_size.is_power_of_two() || self.block_size > 256 {
            return Err(CacheConfigError::BlockSize(self.block_size));
        }
        Ok(())
    }

    /// Blocks the budget holds for a model whose tokens take `bytes_per_token` of KV, or
    /// `needed_tokens` worth of blocks when no budget is set.
    pub fn num_blocks(
        &self,
        bytes_per_token: u64,
        needed_tokens: usize,
    ) -> Result<u32, CacheConfigError> {
        self.validate()?;
        let block_bytes = bytes_per_token * self.block_size as u64;
        let blocks = match self.kv_cache_memory {
            Some(budget) => {
                let blocks = budget / block_bytes;
                if blocks == 0 {
                    return Err(CacheConfigError::TooSmall {
                        budget,
                        block_bytes,
                    });
                }
                if blocks > u32::MAX as u64 {
                    return Err(CacheConfigError::TooManyBlocks { budget, blocks });
                }
                blocks
            }
            None => needed_tokens.div_ceil(self.block_size).max(1) as u64,
        };
        Ok(blocks as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_the_pool_from_the_budget() {
        let c = CacheConfig {
            block_size: 16,
            kv_cache_memory: Some(1 << 20),
        };
        assert_eq!(c.num_blocks(1024, 0), Ok(64));
        let auto = CacheConfig::default();
        assert_eq!(auto.num_blocks(1024, 33), Ok(3));
        let tiny = CacheConfig {
            block_size: 16,
            kv_cache_memory: Some(100),
        };
        assert!(matches!(
            tiny.num_blocks(1024, 0),
            Err(CacheConfigError::TooSmall { .. })
        ));
        let odd = CacheConfig {
            block_size: 12,
            kv_cache_memory: None,
        };
        assert_eq!(odd.validate(), Err(CacheConfigError::BlockSize(12)));
    }
}
