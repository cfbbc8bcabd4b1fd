//! CPU kernels over `f32` slices, and weight matrices kept as they are stored.

mod activation;
mod attention;
mod embedding;
mod kv_elem;
mod kv_write;
mod linear;
mod matrix;
mod mla_attention;
mod norm;
pub mod quant;
mod rotary;
mod softmax;

pub use activation::silu_and_mul;

pub use attention::{paged_attention, AttentionSeq};
pub use embedding::embedding;
pub use kv_elem::KvElem;
pub use kv_write::{write_kv, write_rows};
pub use linear::linear;
pub use matrix::{Matrix, MatrixError, Storage};
pub use mla_attention::mla_attention;
pub use norm::{add_rms_norm, rms_norm};
pub use rotary::{apply_rotary, RotaryLayout};

/// Shape of one layer's paged KV cache, laid out
/// `[num_blocks, block_size, num_kv_heads, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub num_blocks: u64,
    pub block_size: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
}

impl KvLayout {
    /// Elements in one slot (one token's K or V for all KV heads).
    pub const fn slot_elems(&self) -> u64 {
        self.num_kv_heads * self.head_dim
    }

    /// Elements in one layer's K (or V) cache.
    pub const fn layer_elems(&self) -> u64 {
        self.num_blocks * self.block_size * self.slot_elems()
    }

    /// Element offset of `slot` (= block * block_size + offset in block), computed in 64 bits.
    pub const fn slot_offset(&self, slot: u64) -> u64 {
        slot * self.slot_elems()
    }

    /// Element offset of token `index` of a sequence whose blocks are `block_table`,
    /// for KV head `kv_head`. The block id is widened before any multiplication.
    pub fn token_offset(&self, block_table: &[u32], index: u64, kv_head: u64) -> u64 {
        let block = block_table[(index / self.block_size) as usize] as u64;
        let slot = block * self.block_size + index % self.block_size;
        self.slot_offset(slot) + kv_head * self.head_dim
    }

    /// [`token_offset`](Self::token_offset) of tokens `0..tokens` in order, a block at a
    /// time (no division per token).
    pub fn token_offsets<'a>(
        &'a self,
        block_table: &'a [u32],
        tokens: u64,
        kv_head: u64,
    ) -> impl Iterator<Item = u64> + 'a {
        let blocks = tokens.div_ceil(self.block_size) as usize;
        block_table[..blocks]
            .iter()
            .flat_map(move |&block| {
                let first = self.slot_offset(block as u64 * self.block_size);
                (0..self.block_size).map(move |t| first + self.slot_offset(t))
            })
            .take(tokens as usize)
            .map(move |at| at + kv_head * self.head_dim)
    }
}

/// What the address audit (docs/architecture.md, rule 2) found for one layer of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressAudit {
    /// The largest byte offset the cache-write and attention kernels compute.
    pub largest_byte_offset: u64,
    /// The most a CPU buffer can address (`isize::MAX` bytes); offsets are `u64`.
    pub limit: u64,
}

impl KvLayout {
    /// Checks that every offset the CPU cache and attention kernels compute for this
    /// layout (in `u64`, then as a slice index) fits a buffer, for `elem_bytes`-byte
    /// elements; the error names the kernels, the pool and the limit.
    pub fn audit(&self, elem_bytes: u64) -> Result<AddressAudit, String> {
        let limit = isize::MAX as u64;
        let bytes = self
            .num_blocks
            .checked_mul(self.block_size)
            .and_then(|t| t.checked_mul(self.slot_elems()))
            .and_then(|e| e.checked_mul(elem_bytes))
            .filter(|&b| b <= limit)
            .ok_or_else(|| {
                format!(
                    "write_kv / paged_attention: a layer of {} blocks x {} tokens x {} KV heads x {} \
                     elements of {elem_bytes} bytes does not fit the CPU's {limit}-byte limit",
                    self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim
                )
            })?;
        Ok(AddressAudit {
            largest_byte_offset: bytes.saturating_sub(1),
            limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::KvLayout;

    #[test]
    fn the_audit_refuses_pools_past_the_address_limit() {
        let layout = |num_blocks| KvLayout {
            num_blocks,
            block_size: 16,
            num_kv_heads: 8,
            head_dim: 128,
        };
        let ok = layout(140_000).audit(2).unwrap();
        assert_eq!(ok.largest_byte_offset, 140_000 * 16 * 8 * 128 * 2 - 1);
        let err = layout(u64::MAX / 1024).audit(4).unwrap_err();
        assert!(
            err.contains("paged_attention") && err.contains("blocks"),
            "{err}"
        );
    }

    #[test]
    fn token_offsets_in_order_are_each_tokens_offset() {
        let layout = KvLayout {
            num_blocks: 1 << 20,
            block_size: 16,
            num_kv_heads: 3,
            head_dim: 64,
        };
        let table = [70_000u32, 3, 65_535, 65_536, 1 << 19];
        for tokens in [0u64, 1, 15, 16, 17, 70, 80] {
            let got: Vec<u64> = layout.token_offsets(&table, tokens, 2).collect();
            let want: Vec<u64> = (0..tokens)
                .map(|i| layout.token_offset(&table, i, 2))
                .collect();
            assert_eq!(got, want, "{tokens} tokens");
        }
    }

    #[test]
    fn offsets_past_block_65535_and_4_gib_are_exact() {
        // Block size 16, 8 KV heads, head dim 128: 16,384 elements (32 KiB in bf16) a block.
        let layout = KvLayout {
            num_blocks: 140_000,
            block_size: 16,
            num_kv_heads: 8,
            head_dim: 128,
        };
        let per_block = 16 * 8 * 128u64;
        for block in [0u32, 65_534, 65_535, 65_536, 131_071, 139_999] {
            let table = [7, block];
            let off = layout.token_offset(&table, 16 + 3, 5);
            assert_eq!(off, block as u64 * per_block + 3 * 8 * 128 + 5 * 128);
        }
        // The last element of the pool lies past 2^31 and 2^32 elements' worth of bytes.
        assert!(layout.layer_elems() * 2 > 1u64 << 32);
    }

    #[test]
    fn latent_rows_past_2_31_over_576_are_addressed_exactly() {
        // A latent cache: one 576-element row a token. Row 3,728,271 is the first whose
        // element offset (times 576) passes 2^31, where an int32 product wraps.
        let first_past = (1u64 << 31).div_ceil(576);
        assert_eq!(first_past, 3_728_271);
        for block_size in [1u64, 16, 64] {
            let layout = KvLayout {
                num_blocks: 4_000_000 / block_size + 1,
                block_size,
                num_kv_heads: 1,
                head_dim: 576,
            };
            for row in [first_past - 2, first_past - 1, first_past, first_past + 1] {
                let (block, within) = (row / block_size, row % block_size);
                let table = [3, block as u32];
                let at = layout.token_offset(&table, block_size + within, 0);
                assert_eq!(at, row * 576, "row {row}, blocks of {block_size}");
                let all: Vec<u64> = layout
                    .token_offsets(&table, block_size + within + 1, 0)
                    .collect();
                assert_eq!(*all.last().unwrap(), row * 576);
            }
            assert!(layout.audit(4).is_ok());
        }
    }
}
