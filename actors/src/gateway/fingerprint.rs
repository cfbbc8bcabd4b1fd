//! OpenAI's `system_fingerprint`: a name for the backend configuration that produced a
//! response, so a client can tell when outputs may differ for reasons other than
//! sampling. Peregrine's is `fp_` and ten hex digits of an FNV-1a hash of the Peregrine
//! version, the model's source (`root`: the `--model` path as given, or the default
//! model's name) and its context length: the same across restarts of one build serving
//! one model, different when either changes. Live-reloadable settings are left out (a
//! reload does not change what a request's sampling gives). vLLM sends none.

/// The fingerprint of the model from `root` with a context of `max_model_len` tokens,
/// served by this build.
pub fn system_fingerprint(root: &str, max_model_len: usize) -> String {
    fingerprint(&[env!("CARGO_PKG_VERSION"), root, &max_model_len.to_string()])
}

/// `fp_` and the first ten hex digits of the FNV-1a hash of `parts`, each ended by NUL.
fn fingerprint(parts: &[&str]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in parts.iter().flat_map(|part| part.bytes().chain([0])) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("fp_{:010x}", hash >> 24)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_is_stable_and_follows_its_parts() {
        let a = fingerprint(&["0.1.0", "/models/a", "4096"]);
        assert_eq!(a, fingerprint(&["0.1.0", "/models/a", "4096"]));
        assert!(a.starts_with("fp_") && a.len() == 13, "{a}");
        assert!(a[3..].bytes().all(|b| b.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, fingerprint(&["0.1.1", "/models/a", "4096"]));
        assert_ne!(a, fingerprint(&["0.1.0", "/models/b", "4096"]));
        assert_ne!(a, fingerprint(&["0.1.0", "/models/a4096", ""]));
        // FNV-1a of the empty input is its offset basis.
        assert_eq!(
            fingerprint(&[]),
            format!("fp_{:010x}", 0xcbf2_9ce4_8422_2325u64 >> 24)
        );
    }
}
