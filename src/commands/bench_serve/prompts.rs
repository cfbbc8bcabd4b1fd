//! The prompts to send: random words of a fixed length, or the lines of a JSONL dataset.

use anyhow::{bail, Context};
use rand::seq::IndexedRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use std::path::Path;

/// Common English words; with a byte-level BPE tokenizer, " word" is one token for
/// each of them, so a prompt of `n` words is about `n` tokens (plus any BOS).
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "water",
    "world", "house", "light", "river", "city", "road", "book", "music", "garden", "window",
    "morning", "little", "great",
];

/// One request's prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The prompt text.
    pub text: String,
    /// The `max_tokens` to send.
    pub max_tokens: usize,
    /// Whether to ask the server to keep generating past end-of-sequence.
    pub ignore_eos: bool,
    /// The prompt length in tokens as estimated here (one per word); used only when
    /// the server reports no usage.
    pub approx_tokens: usize,
}

/// `count` prompts of `input_len` random words each, the same for the same `seed`,
/// each asking for exactly `output_len` tokens (`ignore_eos`).
pub fn random(count: usize, input_len: usize, output_len: usize, seed: u64) -> Vec<Prompt> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let words: Vec<&str> = (0..input_len)
                .filter_map(|_| WORDS.choose(&mut rng).copied())
                .collect();
            Prompt {
                text: words.join(" "),
                max_tokens: output_len,
                ignore_eos: true,
                approx_tokens: input_len,
            }
        })
        .collect()
}

/// One dataset line.
#[derive(Deserialize)]
struct DatasetLine {
    prompt: String,
    max_tokens: Option<usize>,
    ignore_eos: Option<bool>,
}

/// Reads a JSONL dataset and returns `count` prompts, going round the file again when
/// it has fewer lines. Lines without `max_tokens` get `default_max_tokens`; the model
/// may stop early at end-of-sequence unless the line sets `ignore_eos`. Blank lines are
/// skipped.
pub fn dataset(
    path: &Path,
    count: usize,
    default_max_tokens: usize,
) -> anyhow::Result<Vec<Prompt>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the dataset {}", path.display()))?;
    let lines = parse_dataset(&text, default_max_tokens)
        .with_context(|| format!("in the dataset {}", path.display()))?;
    Ok(lines.iter().cycle().take(count).cloned().collect())
}

/// Parses JSONL text; an error names the (1-based) line.
fn parse_dataset(text: &str, default_max_tokens: usize) -> anyhow::Result<Vec<Prompt>> {
    let mut prompts = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: DatasetLine = match serde_json::from_str(line) {
            Ok(parsed) => parsed,
            Err(e) => {
                // serde's own "at line 1 column N" would clash with the file's line number.
                let reason = e.to_string();
                let reason = reason
                    .rsplit_once(" at line ")
                    .map_or(reason.as_str(), |(r, _)| r);
                bail!(
                    "line {number}, column {}: expected {{\"prompt\": string, \"max_tokens\"?: integer, \"ignore_eos\"?: boolean}}: {reason}",
                    e.column()
                )
            }
        };
        let max_tokens = parsed.max_tokens.unwrap_or(default_max_tokens);
        if max_tokens == 0 {
            bail!("line {number}: max_tokens must be at least 1");
        }
        prompts.push(Prompt {
            approx_tokens: parsed.prompt.split_whitespace().count(),
            text: parsed.prompt,
            max_tokens,
            ignore_eos: parsed.ignore_eos.unwrap_or(false),
        });
    }
    if prompts.is_empty() {
        bail!("no prompts (the file is empty)");
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_prompts_are_seeded_and_sized() {
        let a = random(3, 16, 7, 42);
        assert_eq!(a, random(3, 16, 7, 42));
        assert_ne!(a, random(3, 16, 7, 43));
        assert_ne!(a[0].text, a[1].text);
        for p in &a {
            assert_eq!(p.text.split(' ').count(), 16);
            assert_eq!((p.max_tokens, p.ignore_eos, p.approx_tokens), (7, true, 16));
        }
    }

    #[test]
    fn dataset_lines_with_and_without_max_tokens() {
        let text = "{\"prompt\": \"hello there\", \"max_tokens\": 5, \"ignore_eos\": true}\n\n\
                    {\"prompt\": \"hi\"}\n";
        let prompts = parse_dataset(text, 9).unwrap();
        assert_eq!(prompts.len(), 2);
        assert_eq!((prompts[0].max_tokens, prompts[0].approx_tokens), (5, 2));
        assert!(prompts[0].ignore_eos);
        assert_eq!(prompts[1].max_tokens, 9);
        assert!(!prompts[1].ignore_eos);
    }

    #[test]
    fn bad_dataset_line_is_named() {
        let text = "{\"prompt\": \"ok\"}\n{\"prompt\": 3}\n";
        let error = format!("{:#}", parse_dataset(text, 9).unwrap_err());
        assert!(error.starts_with("line 2, column 12: expected"), "{error}");
        assert!(error.ends_with("expected a string"), "{error}");
        let error = format!(
            "{:#}",
            parse_dataset("{\"prompt\": \"a\", \"max_tokens\": 0}", 9).unwrap_err()
        );
        assert!(error.contains("line 1: max_tokens"), "{error}");
        assert!(parse_dataset("\n\n", 9).is_err());
    }

    #[test]
    fn short_dataset_is_cycled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        std::fs::write(&path, "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n").unwrap();
        let texts: Vec<String> = dataset(&path, 5, 4)
            .unwrap()
            .into_iter()
            .map(|p| p.text)
            .collect();
        assert_eq!(texts, ["a", "b", "a", "b", "a"]);
        let missing = format!("{:#}", dataset(&dir.path().join("none"), 1, 4).unwrap_err());
        assert!(missing.contains("cannot read the dataset"), "{missing}");
    }
}
