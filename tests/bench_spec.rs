//! `peregrine bench spec` on a tiny random Llama: `--rounds` runs each kind in turns and
//! sums them (a speedup per round, greedy outputs identical in every run), and a round
//! count of 0 is refused naming the flag.

mod common;

use common::tiny_model::{TinyModel, TinySpec};
use common::tiny_tokenizer::write_tokenizer;
use std::process::{Command, Output};

/// The binary under test, built by cargo for this test profile.
const PEREGRINE: &str = env!("CARGO_BIN_EXE_peregrine");

/// `peregrine bench spec` with n-gram drafts on a tiny random model, and `args`.
fn bench_spec(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("a temporary folder");
    TinyModel::random(TinySpec::llama_tiny(), 7).write_hf(dir.path());
    write_tokenizer(dir.path(), 300);
    Command::new(PEREGRINE)
        .args(["bench", "spec", "--model"])
        .arg(dir.path())
        .args(["--speculative-method", "ngram", "--num-prompts", "3"])
        .args([
            "--concurrency",
            "2",
            "--input-len",
            "12",
            "--output-len",
            "10",
        ])
        .args(["--kv-cache-memory", "16000000"])
        .args(args)
        .output()
        .expect("peregrine runs")
}

#[test]
fn rounds_alternate_the_runs_and_sum_them() {
    let out = bench_spec(&["--rounds", "3"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rounds = stdout
        .lines()
        .find_map(|l| l.strip_prefix("3 rounds (times summed), speedup of each:"))
        .unwrap_or_else(|| panic!("no rounds line in:\n{stdout}"));
    let speedups: Vec<f64> = rounds
        .split_whitespace()
        .map(|s| s.trim_end_matches('x').parse().expect("a speedup"))
        .collect();
    assert_eq!(speedups.len(), 3, "{stdout}");
    assert!(speedups.iter().all(|s| *s > 0.0), "{stdout}");
    assert!(
        stdout.contains("identical outputs: 3 of 3\n"),
        "greedy outputs differ between runs:\n{stdout}"
    );
}

#[test]
fn zero_rounds_are_refused_naming_the_flag() {
    let out = bench_spec(&["--rounds", "0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--rounds"), "{stderr}");
}
