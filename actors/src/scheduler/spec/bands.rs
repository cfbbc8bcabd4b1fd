//! Bands of KV block ids: where a verified sequence's draft KV lives, for the band alarm
//! (`band_alarm`) and the per-band acceptance series. A sequence's place is the
//! largest block id in its block table (the draft's KV shares the target pool's block
//! ids). The bands break at every power of two from block 65,536 on and, when the draft
//! layer's bytes per block are known, at the block holding each power of two from 2^31
//! bytes on of one layer's K (or V) tensor: the limits past which 16-bit ids or 32-bit
//! byte offsets go wrong. Only the breaks inside the pool are kept, so a pool of fewer
//! than 65,536 blocks (and under 2 GiB a layer) has one band.

use std::fmt::Write;

/// The first block id past 16 bits, the lowest break.
const FIRST_BLOCK_BREAK: u64 = 1 << 16;
/// The lowest byte-offset break: past `i32`.
const FIRST_BYTE_BREAK: u32 = 31;

/// The bands of one pool, in block-id order.
#[derive(Clone, Debug, PartialEq)]
pub struct Bands {
    /// The first block id of each band; `starts[0]` is 0.
    starts: Vec<u32>,
    /// The pool's largest block id.
    last_block: u32,
    /// Bytes one block takes in one of the draft layer's K or V tensors, if known.
    bytes_per_block: Option<u64>,
    /// Each band's name, `blocks FIRST-LAST`.
    names: Vec<String>,
}

impl Bands {
    /// The bands of a pool of `num_blocks` blocks whose draft layer takes
    /// `bytes_per_block` bytes per block in each of its K and V tensors (`None`: breaks
    /// at block ids only).
    pub fn new(num_blocks: usize, bytes_per_block: Option<u64>) -> Bands {
        let last_block = u32::try_from(num_blocks.saturating_sub(1)).unwrap_or(u32::MAX);
        let inside = |b: u64| b > 0 && b <= u64::from(last_block);
        let mut breaks: Vec<u64> = (0..)
            .map(|n| FIRST_BLOCK_BREAK << n)
            .take_while(|&b| inside(b))
            .collect();
        if let Some(bytes) = bytes_per_block.filter(|&b| b > 0) {
            // The block that holds byte offset 2^n.
            breaks.extend(
                (FIRST_BYTE_BREAK..64)
                    .map(|n| (1u64 << n) / bytes)
                    .take_while(|&b| b <= u64::from(last_block))
                    .filter(|&b| inside(b)),
            );
        }
        breaks.sort_unstable();
        breaks.dedup();
        let starts: Vec<u32> = std::iter::once(0)
            .chain(breaks.into_iter().map(|b| b as u32))
            .collect();
        let mut bands = Bands {
            starts,
            last_block,
            bytes_per_block,
            names: Vec::new(),
        };
        bands.names = (0..bands.count())
            .map(|b| bands.block_range(b..b + 1))
            .collect();
        bands
    }

    /// How many bands there are (at least one).
    pub fn count(&self) -> usize {
        self.starts.len()
    }

    /// The band of a sequence whose largest block id is `block`.
    pub fn of(&self, block: u32) -> usize {
        self.starts.partition_point(|&s| s <= block) - 1
    }

    /// Band `band`'s name, `blocks FIRST-LAST`: a Prometheus label value.
    pub fn name(&self, band: usize) -> &str {
        &self.names[band]
    }

    /// The first block id of band `band`.
    pub fn start(&self, band: usize) -> u32 {
        self.starts[band]
    }

    /// The block ids of `bands` together, `blocks FIRST-LAST`.
    fn block_range(&self, bands: std::ops::Range<usize>) -> String {
        let first = self.starts[bands.start];
        let last = self
            .starts
            .get(bands.end)
            .map_or(self.last_block, |&next| next - 1);
        format!("blocks {first}-{last}")
    }

    /// `bands` together for a log line: their block ids and, when the draft layer's bytes
    /// per block are known, the byte offsets of one K or V tensor they span, as
    /// `blocks 65536-131071 (draft KV bytes [2 GiB, 4 GiB))`.
    pub fn describe(&self, bands: std::ops::Range<usize>) -> String {
        let mut text = self.block_range(bands.clone());
        if let Some(bytes) = self.bytes_per_block {
            let first = u64::from(self.starts[bands.start]);
            let end = self
                .starts
                .get(bands.end)
                .map_or(u64::from(self.last_block) + 1, |&next| u64::from(next));
            let _ = write!(
                text,
                " (draft KV bytes [{}, {}))",
                human_bytes(first * bytes),
                human_bytes(end * bytes)
            );
        }
        text
    }
}

/// `bytes` in the largest binary unit it reaches, exact when it is a whole number of it.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ];
    let (name, unit) = UNITS
        .into_iter()
        .find(|&(_, unit)| bytes >= unit)
        .unwrap_or(("B", 1));
    if bytes.is_multiple_of(unit) {
        format!("{} {name}", bytes / unit)
    } else {
        format!("{:.2} {name}", bytes as f64 / unit as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_pool_has_one_band() {
        let bands = Bands::new(1024, Some(8192));
        assert_eq!(bands.count(), 1);
        assert_eq!(bands.name(0), "blocks 0-1023");
        assert_eq!(bands.of(1023), 0);
        assert_eq!(
            bands.describe(0..1),
            "blocks 0-1023 (draft KV bytes [0 B, 8 MiB))"
        );
    }

    #[test]
    fn blocks_break_at_powers_of_two_from_65536() {
        let bands = Bands::new(300_000, None);
        let names: Vec<&str> = (0..bands.count()).map(|b| bands.name(b)).collect();
        assert_eq!(
            names,
            [
                "blocks 0-65535",
                "blocks 65536-131071",
                "blocks 131072-262143",
                "blocks 262144-299999"
            ]
        );
        assert_eq!(bands.of(65_535), 0);
        assert_eq!(bands.of(65_536), 1);
        assert_eq!(bands.of(299_999), 3);
        assert_eq!(bands.describe(1..4), "blocks 65536-299999");
    }

    #[test]
    fn byte_offsets_break_at_the_block_holding_each_power_of_two_from_2_gib() {
        // 48 KiB a block: 2^31 bytes lie in block 43690, 2^32 in 87381, 2^33 in 174762.
        let bands = Bands::new(100_000, Some(48 << 10));
        let starts: Vec<u32> = (0..bands.count()).map(|b| bands.start(b)).collect();
        assert_eq!(starts, [0, 43_690, 65_536, 87_381]);
        assert_eq!(
            bands.describe(1..2),
            "blocks 43690-65535 (draft KV bytes [2.00 GiB, 3 GiB))"
        );
        assert_eq!(bands.name(3), "blocks 87381-99999");
        // 32 KiB a block: 2^31 bytes start block 65536, one break for both limits.
        let bands = Bands::new(70_000, Some(32 << 10));
        assert_eq!(bands.count(), 2);
        assert_eq!(
            bands.describe(1..2),
            "blocks 65536-69999 (draft KV bytes [2 GiB, 2.14 GiB))"
        );
    }
}
