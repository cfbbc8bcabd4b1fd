//! Memory sizes as operators write them: `1073741824`, `512MiB`, `2GiB`, `1.5GB`.

/// A size that cannot be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("cannot read {0:?} as a size in bytes (examples: 1073741824, 512MiB, 2GiB, 1.5GB)")]
pub struct ByteSizeError(pub String);

/// Parses a byte count with an optional unit: B, KB/MB/GB/TB (powers of 1000) or
/// KiB/MiB/GiB/TiB (powers of 1024), case-insensitive.
pub fn parse_byte_size(text: &str) -> Result<u64, ByteSizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" | "k" => 1_000,
        "mb" | "m" => 1_000_000,
        "gb" | "g" => 1_000_000_000,
        "tb" | "t" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(ByteSizeError(text.to_string())),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| ByteSizeError(text.to_string()))?;
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(ByteSizeError(text.to_string()));
    }
    Ok(bytes as u64)
}

/// Reads an optional byte size from a config file: an integer count or a string with a unit.
pub(crate) fn deserialize_byte_size<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    deserializer.deserialize_any(ByteSizeVisitor).map(Some)
}

/// Accepts `536870912` or `"512MiB"`.
struct ByteSizeVisitor;

impl serde::de::Visitor<'_> for ByteSizeVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a size in bytes: an integer or a string such as \"512MiB\"")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<u64, E> {
        parse_byte_size(v).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_units() {
        assert_eq!(parse_byte_size("4096"), Ok(4096));
        assert_eq!(parse_byte_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_byte_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_byte_size("8 gib"), Ok(8 << 30));
        assert!(parse_byte_size("12 parsecs").is_err());
        assert!(parse_byte_size("").is_err());
    }
}
