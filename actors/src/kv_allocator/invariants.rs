//! The block manager's invariants, checked after every step in debug builds and after
//! every operation in tests.

use super::BlockManager;

impl BlockManager {
    /// Checks that the pool is consistent: every table's blocks are in the pool and none is
    /// held twice by one table; every block's refcount equals the number of tables holding
    /// it; no block is both free and owned, and used + free = total; the free queue has no
    /// duplicates; the prefix cache's map and per-block keys agree; the tiers below agree with themselves
    /// and with the pool; a sequence's blocks past its registered prefix are its alone and
    /// uncached.
    pub fn check_invariants(&self) -> Result<(), String> {
        let num_blocks = self.ref_counts.len();
        let mut owners = vec![0u32; num_blocks];
        for (id, seq) in &self.seqs {
            let mut seen = std::collections::HashSet::new();
            for &block in &seq.table {
                let Some(count) = owners.get_mut(block as usize) else {
                    return Err(format!(
                        "{id} holds block {block}, outside the pool of {num_blocks}"
                    ));
                };
                if !seen.insert(block) {
                    return Err(format!("{id} holds block {block} twice"));
                }
                *count += 1;
            }
            if seq.num_registered > seq.table.len() {
                return Err(format!(
                    "{id} has {} registered blocks but only {} blocks",
                    seq.num_registered,
                    seq.table.len()
                ));
            }
        }
        for (block, (&count, &owned)) in self.ref_counts.iter().zip(&owners).enumerate() {
            if count != owned {
                return Err(format!(
                    "block {block} has refcount {count} but {owned} owners"
                ));
            }
            let free = self.free.contains(block as u32);
            if free == (count > 0) {
                return Err(format!(
                    "block {block} has refcount {count} and free = {free}"
                ));
            }
        }
        self.free.check()?;
        let used = self.ref_counts.iter().filter(|&&c| c > 0).count();
        if used + self.free.len() != num_blocks {
            return Err(format!(
                "{used} used + {} free blocks != {num_blocks} blocks",
                self.free.len()
            ));
        }
        if let Some(cache) = &self.cache {
            cache.check()?;
            if let Some(host) = &self.host {
                let mut counted = std::collections::HashMap::new();
                for parent in cache.parents().chain(host.parents()) {
                    *counted.entry(parent).or_insert(0u32) += 1;
                }
                host.check(&counted)?;
            }
            if let Some(disk) = &self.disk {
                disk.check()?;
                // Every entry in memory knows its parent's content, for its way to disk.
                let in_memory = cache.len() + self.host.as_ref().map_or(0, |h| h.len());
                if self.lineage.len() != in_memory {
                    return Err(format!(
                        "{} entries in memory but {} with a known lineage",
                        in_memory,
                        self.lineage.len()
                    ));
                }
            }
        }
        for (id, seq) in &self.seqs {
            for &block in &seq.table[seq.num_registered..] {
                if self.cache.as_ref().is_some_and(|c| c.is_cached(block)) {
                    return Err(format!("{id}'s unregistered block {block} is cached"));
                }
                if self.ref_counts[block as usize] != 1 {
                    return Err(format!("{id}'s unregistered block {block} is shared"));
                }
            }
        }
        Ok(())
    }
}
