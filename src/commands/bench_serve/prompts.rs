//! Plain prompts: random words of a fixed length, or the lines of a JSONL dataset that
//! hold nothing but a prompt and its output length (what `bench spec` runs offline).

use super::dataset::{self, Input, Line};
use anyhow::{bail, Context};
use rand::seq::IndexedRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
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

/// Reads a JSONL dataset of plain prompts (see [`dataset::load`]) and returns `count`
/// prompts, going round the file again when it has fewer lines. A line with chat
/// `messages` or fields that shape the output is refused: only `bench serve` sends them.
pub fn dataset(
    path: &Path,
    count: usize,
    default_max_tokens: usize,
) -> anyhow::Result<Vec<Prompt>> {
    let prompts = dataset::load(path, default_max_tokens)?
        .into_iter()
        .map(plain)
        .collect::<anyhow::Result<Vec<_>>>()
        .with_context(|| format!("in the dataset {}", path.display()))?;
    Ok(prompts.iter().cycle().take(count).cloned().collect())
}

/// The prompt of a line that has nothing but `prompt`, `max_tokens` and `ignore_eos`.
fn plain(line: Line) -> anyhow::Result<Prompt> {
    let Input::Text(text) = line.input else {
        bail!(
            "line {}: chat \"messages\" are sent only by `bench serve`",
            line.number
        );
    };
    if let Some(field) = line.fields.keys().next() {
        bail!(
            "line {}: \"{field}\" is sent only by `bench serve`",
            line.number
        );
    }
    Ok(Prompt {
        approx_tokens: text.split_whitespace().count(),
        text,
        max_tokens: line.max_tokens,
        ignore_eos: line.ignore_eos,
    })
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
    fn plain_dataset_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        let text = "{\"prompt\": \"hello there\", \"max_tokens\": 5, \"ignore_eos\": true}\n\n\
                    {\"prompt\": \"hi\"}\n";
        std::fs::write(&path, text).unwrap();
        let prompts = dataset(&path, 2, 9).unwrap();
        assert_eq!(prompts.len(), 2);
        assert_eq!((prompts[0].max_tokens, prompts[0].approx_tokens), (5, 2));
        assert!(prompts[0].ignore_eos);
        assert_eq!((prompts[1].text.as_str(), prompts[1].max_tokens), ("hi", 9));
        assert!(!prompts[1].ignore_eos);
    }

    #[test]
    fn chats_and_shaping_fields_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        for (line, want) in [
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
                "line 2: chat \"messages\" are sent only by `bench serve`",
            ),
            (
                "{\"prompt\": \"a\", \"guided_regex\": \"b+\"}",
                "line 2: \"guided_regex\" is sent only by `bench serve`",
            ),
            (
                "{\"prompt\": \"a\", \"temperature\": 1}",
                "line 2: \"temperature\" is sent only by `bench serve`",
            ),
        ] {
            std::fs::write(&path, format!("{{\"prompt\": \"ok\"}}\n{line}\n")).unwrap();
            let error = format!("{:#}", dataset(&path, 1, 4).unwrap_err());
            assert_eq!(error, format!("in the dataset {}: {want}", path.display()));
        }
        std::fs::write(&path, "{\"prompt\": 3}\n").unwrap();
        let error = format!("{:#}", dataset(&path, 1, 4).unwrap_err());
        assert!(
            error.contains("line 1, column 12: not a dataset line"),
            "{error}"
        );
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
