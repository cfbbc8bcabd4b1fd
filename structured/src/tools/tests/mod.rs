//! Tests of the tools module: fixed outputs of each format, streams split every way,
//! random outputs (well-formed and not), the JSON reader against `serde_json`, forced-call
//! grammars walked at random, and the prompt texts.

mod fixed;
mod generate;
mod grammars;
mod json_reader;
mod prompts;
mod streams;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{ParsedOutput, ToolCallFormat, ToolCallStream, ToolDelta};

/// A random generator, seeded from `TOOLS_TEST_SEED` or afresh (the seed is printed, so a
/// failure can be replayed).
fn rng(test: &str) -> StdRng {
    let seed = std::env::var("TOOLS_TEST_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: TOOLS_TEST_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// `text` streamed in `pieces` (cut at these byte offsets, on character boundaries):
/// every delta, and the output as the stream parsed it.
fn stream_at(format: ToolCallFormat, text: &str, cuts: &[usize]) -> (Vec<ToolDelta>, ParsedOutput) {
    let mut stream = ToolCallStream::new(format);
    let mut deltas = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain([text.len()].iter()) {
        deltas.extend(stream.push(&text[from..cut]));
        from = cut;
    }
    deltas.extend(stream.finish());
    (deltas, stream.parsed())
}

/// The content and calls (name, arguments) that `deltas` add up to, checking that each
/// call starts once, in index order, before any of its argument fragments.
fn rebuild(deltas: &[ToolDelta]) -> (Option<String>, Vec<(String, String)>) {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for delta in deltas {
        match delta {
            ToolDelta::Content(text) => {
                assert!(!text.is_empty(), "an empty content delta");
                content.push_str(text);
            }
            ToolDelta::CallStart { index, name } => {
                assert_eq!(*index, calls.len(), "calls start in index order");
                calls.push((name.clone(), String::new()));
            }
            ToolDelta::Arguments { index, fragment } => {
                assert!(
                    *index < calls.len(),
                    "arguments of call {index} before its start"
                );
                assert!(!fragment.is_empty(), "an empty argument fragment");
                calls[*index].1.push_str(fragment);
            }
        }
    }
    ((!content.is_empty()).then_some(content), calls)
}

/// Random cut points of `text`, on character boundaries, in order.
fn random_cuts(text: &str, rng: &mut StdRng) -> Vec<usize> {
    let bounds: Vec<usize> = text.char_indices().map(|(at, _)| at).skip(1).collect();
    let mut cuts: Vec<usize> = bounds
        .into_iter()
        .filter(|_| rng.random_bool(0.2))
        .collect();
    cuts.dedup();
    cuts
}

/// Checks that `text` gives the same content and calls whole, streamed cut at every single
/// point, character by character, and cut at random points.
fn assert_stream_matches_parse(format: ToolCallFormat, text: &str, rng: &mut StdRng) {
    let whole = super::parse(format, text);
    let expected = (
        whole.content.clone(),
        whole
            .calls
            .iter()
            .map(|call| (call.name.clone(), call.arguments.clone()))
            .collect::<Vec<_>>(),
    );
    let bounds: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
    let mut splits: Vec<Vec<usize>> = bounds.iter().skip(1).map(|&at| vec![at]).collect();
    splits.push(bounds.iter().skip(1).copied().collect());
    splits.push(random_cuts(text, rng));
    splits.push(Vec::new());
    for cuts in splits {
        let (deltas, parsed) = stream_at(format, text, &cuts);
        assert_eq!(
            rebuild(&deltas),
            expected,
            "{format:?} {text:?} cut at {cuts:?}"
        );
        assert_eq!(parsed, whole, "{format:?} {text:?} cut at {cuts:?}");
    }
}
