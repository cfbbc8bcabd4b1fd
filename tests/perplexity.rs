//! `peregrine perplexity` on a tiny random Llama (vocabulary 300, byte-level BPE): the
//! running and final estimates it prints agree with perplexities computed here from the
//! dense float64 reference forward, chunk by chunk as llama-perplexity cuts and scores them
//! (with and without BOS set at each chunk's start); chunking the prefill or stopping after
//! some chunks changes nothing; bad input is refused with a clear error.

mod common;

use common::reference::RefModel;
use common::tiny_model::{TinyModel, TinySpec};
use common::tiny_tokenizer::write_tokenizer;
use peregrine_models::tokenizer::Tokenizer;
use rand::seq::IndexedRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under test, built by cargo for this test profile.
const PEREGRINE: &str = env!("CARGO_BIN_EXE_peregrine");

/// The tiny tokenizer's BOS id (`<|im_start|>`).
const BOS: u32 = 1;

/// Tokens per chunk in the tests.
const CTX: usize = 32;

/// A tiny Llama with its tokenizer (BOS added if `add_bos`), and a text of a few hundred
/// tokens beside it, in a temporary folder.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(seed: u64, add_bos: bool) -> Fixture {
        let dir = tempfile::tempdir().expect("a temporary folder");
        TinyModel::random(TinySpec::llama_tiny(), seed).write_hf(dir.path());
        write_tokenizer(dir.path(), 300);
        if add_bos {
            let path = dir.path().join("tokenizer_config.json");
            let mut config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config["add_bos_token"] = true.into();
            std::fs::write(&path, config.to_string()).unwrap();
        }
        let words = [
            "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then", "cat",
            "sat", "on", "mat", "with", "another", "hat", "rabbit", "garden", "door", "key",
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let text: Vec<&str> = (0..90).map(|_| *words.choose(&mut rng).unwrap()).collect();
        // The trailing newline is dropped before tokenizing, as llama.cpp's `-f` drops it.
        std::fs::write(dir.path().join("text.txt"), format!("{}\n", text.join(" "))).unwrap();
        Fixture { dir }
    }

    fn model(&self) -> &Path {
        self.dir.path()
    }

    fn text(&self) -> PathBuf {
        self.dir.path().join("text.txt")
    }

    /// The text's tokens, as the command tokenizes it.
    fn tokens(&self) -> Vec<u32> {
        let text = std::fs::read_to_string(self.text()).unwrap();
        let text = text.strip_suffix('\n').unwrap();
        Tokenizer::from_dir(self.model())
            .unwrap()
            .encode(text, true)
            .unwrap()
    }

    /// `peregrine perplexity --model DIR ARGS…`.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(PEREGRINE)
            .arg("perplexity")
            .arg("--model")
            .arg(self.model())
            .args(args)
            .output()
            .expect("running peregrine perplexity")
    }

    /// The command's stdout on the fixture's text with `args`, which must succeed.
    fn stdout(&self, args: &[&str]) -> String {
        let text = self.text();
        let mut all = vec!["--file", text.to_str().unwrap()];
        all.extend_from_slice(args);
        let output = self.run(&all);
        assert!(
            output.status.success(),
            "peregrine perplexity {args:?} failed with {}:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }
}

/// What the command prints: the running estimate after each chunk, the final perplexity
/// and its standard error.
#[derive(Debug)]
struct Printed {
    running: Vec<f64>,
    ppl: f64,
    error: f64,
}

fn parse(stdout: &str) -> Printed {
    let mut lines = stdout.lines();
    let running = lines
        .next()
        .unwrap()
        .split(',')
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            let value = s.strip_prefix(&format!("[{}]", i + 1)).unwrap_or_else(|| {
                panic!("chunk {} printed as {s:?}", i + 1);
            });
            value.parse().unwrap()
        })
        .collect();
    let last = lines.next().unwrap();
    let rest = last.strip_prefix("Final estimate: PPL = ").unwrap();
    let (ppl, error) = rest.split_once(" +/- ").unwrap();
    Printed {
        running,
        ppl: ppl.parse().unwrap(),
        error: error.parse().unwrap(),
    }
}

/// llama-perplexity's method over the float64 reference: whole chunks of `ctx` tokens,
/// each chunk's first token set to `bos` where given, scoring positions `first` ..= ctx - 2
/// against the next token. The running estimates and the final standard error.
fn reference(
    model: &RefModel,
    tokens: &[u32],
    ctx: usize,
    first: usize,
    bos: Option<u32>,
) -> (Vec<f64>, f64) {
    let (mut count, mut nll, mut nll2) = (0.0, 0.0, 0.0);
    let mut running = Vec::new();
    for chunk in tokens.chunks_exact(ctx) {
        let mut input = chunk.to_vec();
        if let Some(bos) = bos {
            input[0] = bos;
        }
        let logits = model.forward(&input);
        for p in first..ctx - 1 {
            let row = &logits[p];
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let log_sum = row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
            let v = log_sum - row[input[p + 1] as usize];
            count += 1.0;
            nll += v;
            nll2 += v * v;
        }
        running.push((nll / count).exp());
    }
    let mean = nll / count;
    let error = ((nll2 / count - mean * mean) / (count - 1.0)).sqrt() * mean.exp();
    (running, error)
}

/// Whether a value printed to `decimals` places is `expected`, within float32 rounding
/// of the forward (1e-6 relative) and half a unit of the last place.
fn close(printed: f64, expected: f64, decimals: i32) -> bool {
    (printed - expected).abs() <= 1e-6 * expected.abs() + 0.5 * 10f64.powi(-decimals)
}

/// Checks the command's estimates for the fixture against the reference.
fn check_against_reference(fixture: &Fixture, bos: Option<u32>) {
    let tokens = fixture.tokens();
    assert!(tokens.len() >= 4 * CTX, "{} tokens", tokens.len());
    assert_eq!(tokens[0] == BOS, bos.is_some(), "{tokens:?}");
    // A float32 KV cache, so that the forward is float32 throughout (the default bfloat16
    // cache rounds each key and value; docs/performance.md measures what that changes).
    let printed = parse(&fixture.stdout(&[
        "--ctx-size",
        &CTX.to_string(),
        "--kv-cache-dtype",
        "float32",
    ]));
    let model = RefModel::load(fixture.model());
    let (running, error) = reference(&model, &tokens, CTX, CTX / 2, bos);
    assert_eq!(printed.running.len(), tokens.len() / CTX);
    for (i, (&p, &r)) in printed.running.iter().zip(&running).enumerate() {
        assert!(
            close(p, r, 4),
            "chunk {}: printed {p}, reference {r}",
            i + 1
        );
    }
    assert!(
        close(printed.ppl, *running.last().unwrap(), 4),
        "{printed:?}"
    );
    assert!(close(printed.error, error, 5), "{printed:?}: error {error}");

    // The reference tells other methods apart: scoring from one position earlier, or
    // without BOS at each chunk's start (only the text's first token), moves the estimate
    // far past the tolerance.
    let (earlier, _) = reference(&model, &tokens, CTX, CTX / 2 - 1, bos);
    let (unset, _) = reference(&model, &tokens, CTX, CTX / 2, None);
    let others = if bos.is_some() {
        vec![earlier, unset]
    } else {
        vec![earlier]
    };
    for other in others {
        let last = *other.last().unwrap();
        assert!(
            (last - printed.ppl).abs() > 1e-3 * printed.ppl,
            "{last} vs {}",
            printed.ppl
        );
    }
}

#[test]
fn the_estimates_match_the_float64_reference() {
    check_against_reference(&Fixture::new(10, false), None);
}

#[test]
fn with_add_bos_each_chunk_starts_with_bos() {
    check_against_reference(&Fixture::new(20, true), Some(BOS));
}

#[test]
fn prefill_pieces_and_fewer_chunks_change_nothing() {
    let fixture = Fixture::new(30, false);
    let ctx = CTX.to_string();
    let whole = fixture.stdout(&["--ctx-size", &ctx]);
    // 5-row forwards: several of each chunk's first half ask for no logits at all.
    assert_eq!(
        fixture.stdout(&["--ctx-size", &ctx, "--batch-size", "5"]),
        whole
    );
    let two = parse(&fixture.stdout(&["--ctx-size", &ctx, "--chunks", "2"]));
    assert_eq!(two.running, parse(&whole).running[..2]);
    assert_eq!(two.ppl, two.running[1]);
}

/// The command's exit and stderr for `args`; it must fail.
fn refused(fixture: &Fixture, args: &[&str]) -> String {
    let output = fixture.run(args);
    assert!(!output.status.success(), "{args:?} succeeded");
    assert!(output.stdout.is_empty(), "{args:?} printed an estimate");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    let fixture = Fixture::new(40, false);
    let text = fixture.text();
    let text = text.to_str().unwrap();
    for ctx in ["0", "1", "2"] {
        let err = refused(&fixture, &["--file", text, "--ctx-size", ctx]);
        assert!(
            err.contains(&format!("--ctx-size {ctx}")) && err.contains("at least 3"),
            "{err}"
        );
    }
    // Fewer than 2 x ctx tokens, as llama-perplexity refuses them.
    let ctx = fixture.tokens().len() / 2 + 1;
    let err = refused(&fixture, &["--file", text, "--ctx-size", &ctx.to_string()]);
    let needed = format!("at least {} (2 x --ctx-size", 2 * ctx);
    assert!(err.contains(&needed) && err.contains(text), "{err}");
    let missing = fixture.model().join("missing.txt");
    let err = refused(&fixture, &["--file", missing.to_str().unwrap()]);
    assert!(err.contains("missing.txt"), "{err}");
    let err = refused(&fixture, &["--file", text, "--chunks", "0"]);
    assert!(err.contains("--chunks 0"), "{err}");
    let err = refused(&fixture, &["--file", text, "--batch-size", "0"]);
    assert!(err.contains("--batch-size 0"), "{err}");
}
