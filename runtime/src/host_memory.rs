//! What the host can give: the memory the kernel says is available (`MemAvailable`), within
//! the process's cgroup limit, and a check that refuses a plan of allocations that would
//! not fit, naming each one, before anything is allocated.

use std::fmt;

/// A planned allocation: what it is for, in words a user recognizes (the setting that
/// sizes it), and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryNeed {
    /// What it is for, naming the setting that sizes it: `kv_cache_memory 1 TiB`.
    pub what: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// A plan that does not fit in the memory available.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryShortfall {
    /// The planned allocations, largest first.
    pub needs: Vec<MemoryNeed>,
    /// The bytes available.
    pub available: u64,
}

impl fmt::Display for MemoryShortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = total_bytes(&self.needs);
        let (first, rest) = self.needs.split_first().expect("a shortfall has a need");
        write!(
            f,
            "{} needs {} of host memory",
            first.what,
            human_bytes(first.bytes)
        )?;
        if !rest.is_empty() {
            let others: Vec<String> = rest
                .iter()
                .map(|n| format!("{} for {}", human_bytes(n.bytes), n.what))
                .collect();
            write!(
                f,
                " (with {}: {} in all)",
                others.join(", "),
                human_bytes(total)
            )?;
        }
        write!(f, ", but {} is available", human_bytes(self.available))
    }
}

impl std::error::Error for MemoryShortfall {}

/// The bytes of `needs` together (saturating: a plan past `u64::MAX` never fits).
fn total_bytes(needs: &[MemoryNeed]) -> u64 {
    needs.iter().fold(0, |sum, n| sum.saturating_add(n.bytes))
}

/// Refuses `needs` if together they exceed `available` bytes (`None`: unknown, so
/// nothing is refused).
pub fn check_fits(needs: &[MemoryNeed], available: Option<u64>) -> Result<(), MemoryShortfall> {
    let Some(available) = available else {
        return Ok(());
    };
    if total_bytes(needs) <= available {
        return Ok(());
    }
    let mut needs: Vec<MemoryNeed> = needs.iter().filter(|n| n.bytes > 0).cloned().collect();
    needs.sort_by_key(|n| std::cmp::Reverse(n.bytes));
    Err(MemoryShortfall { needs, available })
}

/// Refuses `needs` if together they exceed the host memory available now.
pub fn check_host(needs: &[MemoryNeed]) -> Result<(), MemoryShortfall> {
    check_fits(needs, available_bytes())
}

/// The bytes the host can give this process now: the kernel's `MemAvailable`, less what
/// the process's cgroup (v2) limit leaves if that is lower; `None` where neither can be
/// read (not Linux).
pub fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let host = meminfo.as_deref().and_then(mem_available);
    let cgroup = cgroup_headroom();
    match (host, cgroup) {
        (Some(h), Some(c)) => Some(h.min(c)),
        (h, c) => h.or(c),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What the cgroup v2 memory limit of this process leaves, if it has one.
fn cgroup_headroom() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = format!("/sys/fs/cgroup{}", path.trim_end());
    let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).ok();
    headroom(&read("memory.max")?, &read("memory.current")?)
}

/// The limit less the usage, from the texts of `memory.max` and `memory.current`
/// (`max`: no limit).
fn headroom(max: &str, current: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?;
    let current: u64 = current.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// Bytes in binary units with three significant digits: `1.50 GiB`, `512 MiB`, `96 B`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ if value >= 100.0 => format!("{value:.0} {}", UNITS[unit]),
        _ if value >= 10.0 => format!("{value:.1} {}", UNITS[unit]),
        _ => format!("{value:.2} {}", UNITS[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(what: &str, bytes: u64) -> MemoryNeed {
        MemoryNeed {
            what: what.into(),
            bytes,
        }
    }

    #[test]
    fn a_plan_over_the_available_memory_names_its_largest_part_first() {
        let needs = [
            need("graphs", 3 << 30),
            need("kv_cache_memory 1 TiB", 1 << 40),
        ];
        assert_eq!(check_fits(&needs, Some(2 << 40)), Ok(()));
        assert_eq!(check_fits(&needs, None), Ok(()));
        let err = check_fits(&needs, Some(20 << 30)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "kv_cache_memory 1 TiB needs 1.00 TiB of host memory (with 3.00 GiB for graphs: \
             1.00 TiB in all), but 20.0 GiB is available"
        );
        let alone = check_fits(&[need("x", u64::MAX), need("y", u64::MAX)], Some(1)).unwrap_err();
        assert_eq!(alone.needs.len(), 2);
        assert!(
            alone.to_string().ends_with(", but 1 B is available"),
            "{alone}"
        );
    }

    #[test]
    fn meminfo_and_cgroup_texts_are_read() {
        let text = "MemTotal:       24576000 kB\nMemFree: 1 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(mem_available(text), Some(20_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(headroom("1073741824\n", "73741824\n"), Some(1_000_000_000));
        assert_eq!(headroom("max\n", "5\n"), None);
        assert!(available_bytes().is_none_or(|bytes| bytes > 0));
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_bytes(96), "96 B");
        assert_eq!(human_bytes(1536 << 20), "1.50 GiB");
        assert_eq!(human_bytes(512 << 20), "512 MiB");
        assert_eq!(human_bytes(1 << 40), "1.00 TiB");
    }
}
