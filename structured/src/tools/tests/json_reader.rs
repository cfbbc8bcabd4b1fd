//! The incremental JSON reader against `serde_json`, on random mutations of valid JSON.

use rand::seq::IndexedRandom;
use rand::Rng;

use super::super::json::{JsonScanner, Scan};
use super::rng;

/// Whether the reader takes all of `text` as one JSON value.
fn reads(text: &str) -> bool {
    let mut scanner = JsonScanner::new();
    let mut last = Scan::Space;
    for c in text.chars() {
        if matches!(last, Scan::Done | Scan::DoneBefore) {
            return false;
        }
        last = scanner.feed(c);
        if last == Scan::Invalid || last == Scan::DoneBefore {
            return false;
        }
    }
    // A number ends at the character after it.
    last == Scan::Done || (last == Scan::Char && scanner.feed(' ') == Scan::DoneBefore)
}

/// Whether `serde_json` reads `text` (`None` where it refuses a number out of `f64`'s
/// range, which the reader takes as the valid JSON it is).
fn serde_reads(text: &str) -> Option<bool> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(_) => Some(true),
        Err(err) if err.to_string().contains("out of range") => None,
        Err(_) => Some(false),
    }
}

#[test]
fn the_json_reader_agrees_with_serde_json() {
    const SEEDS: &[&str] = &[
        r#"{"a": [1, -2.5e+3, true, false, null, {"b": "c\n\u00e9\"\\"}], "d": {}}"#,
        r#"[[], [{}], "x", 0, -0.0, 1E2]"#,
        r#""\ud83d\ude00 😀 é \uDBFF\uDFFF""#,
        "  12 ",
        "{\"k\":\"v\"}",
    ];
    const PIECES: &[&str] = &[
        "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "00", "e", "E", "+", "-", ".", "0", "1",
        "9", "true", "fals", "null", " ", "\n", "\t", "a", "é", "\u{1}", "/",
    ];
    let mut rng = rng("the_json_reader_agrees_with_serde_json");
    let mut checked = 0;
    for _ in 0..20000 {
        let mut text = SEEDS.choose(&mut rng).copied().unwrap_or("{}").to_string();
        for _ in 0..rng.random_range(0..4) {
            let bounds: Vec<usize> = text
                .char_indices()
                .map(|(at, _)| at)
                .chain([text.len()])
                .collect();
            let at = bounds.choose(&mut rng).copied().unwrap_or(0);
            match rng.random_range(0..3) {
                0 => text.insert_str(at, PIECES.choose(&mut rng).copied().unwrap_or("")),
                _ if at < text.len() => {
                    text.remove(at);
                }
                _ => {}
            }
        }
        let text = text.trim_end();
        if let Some(expected) = serde_reads(text) {
            assert_eq!(reads(text), expected, "{text:?}");
            checked += 1;
        }
    }
    assert!(checked > 15000);
}

#[test]
fn the_json_reader_nests_as_deep_as_serde_json() {
    for depth in [1, 100, 127, 128, 129, 200] {
        let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_eq!(
            reads(&text),
            serde_reads(&text) == Some(true),
            "depth {depth}"
        );
    }
}
