//! End-to-end tests of `peregrine serve`: each test writes a tiny random Llama (vocabulary
//! 300, with a byte-level BPE tokenizer and a ChatML template) into a temporary folder,
//! starts the real binary on a free port, and runs one of the Python scripts in
//! `tests/e2e/` against it. The scripts use the official `openai` client (and the other
//! pinned packages of `tests/e2e/requirements.txt`, which the tests install on first use into
//! a virtual environment under `target/`: see `common::python_env`) and raw HTTP from the
//! standard library; this file owns the server's life: its flags and configuration files,
//! its signals, and its exit status.
//!
//! The tests take one lock, so that they run one at a time whatever `--test-threads` says:
//! several of them measure how the server behaves under load, which other servers running
//! beside them on a two-core machine would only blur.

mod common;

use common::eagle3_head::{HeadSpec, RandomHead};
use common::tiny_model::{TinyModel, TinySpec};
use common::tiny_tokenizer::write_tokenizer;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The binary under test, built by cargo for this test profile.
const PEREGRINE: &str = env!("CARGO_BIN_EXE_peregrine");

/// The name every test server serves its model under.
const MODEL_NAME: &str = "tiny";

/// KV bytes per token of the tiny Llama: K and V, 2 layers, 2 KV heads, head_dim 16, bf16
/// (the CPU cache's default element).
const KV_BYTES_PER_TOKEN: usize = 2 * 2 * 2 * 16 * 2;

/// Tokens per KV block (the server's default).
const BLOCK_SIZE: usize = 16;

/// How long a server gets to print its address and answer `/health`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one check script may run (each takes seconds).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

/// 1. The openai client gets a completion, a chat completion and streamed versions of
///    both, with the right usage counts; `/v1/models` lists the served name; a prompt is
///    scored (`echo` with `logprobs`, `max_tokens: 0`; vLLM's `prompt_logprobs`).
#[test]
fn openai_client_completions_chat_and_streams() {
    serve_and_check(1, &[], "check_openai.py", &[]);
}

/// 2. A seeded sampled request and a greedy one return the text `peregrine generate` prints
///    for the same prompt and settings (alone, and with copies of themselves beside them).
#[test]
fn seeded_and_greedy_requests_match_generate() {
    let _serial = serial();
    let model = TinyDir::new(2);
    let prompt = "the quick brown fox jumps over the lazy dog";
    let seeded = generate(
        model.path(),
        &[
            "--prompt",
            prompt,
            "--temperature",
            "0.8",
            "--seed",
            "7",
            "--max-tokens",
            "16",
            "--ignore-eos",
        ],
    );
    let greedy = generate(
        model.path(),
        &[
            "--prompt",
            prompt,
            "--temperature",
            "0",
            "--max-tokens",
            "16",
            "--ignore-eos",
        ],
    );
    let expected = model.write_json(
        "expected.json",
        &serde_json::json!({
            "prompt": prompt,
            "seeded": {"temperature": 0.8, "seed": 7, "max_tokens": 16, "text": seeded},
            "greedy": {"temperature": 0.0, "max_tokens": 16, "text": greedy},
        }),
    );
    let server = Server::start(model.path(), &[]);
    server.check("check_seeded.py", &["--expected", &path_arg(&expected)]);
}

/// 3. 64 concurrent streaming requests (max_tokens 1..=20) all finish, each with
///    completion_tokens == its max_tokens and prompt_tokens == the /tokenize count.
#[test]
fn concurrent_streams_all_finish_with_exact_usage() {
    serve_and_check(3, &[], "check_concurrency.py", &["--requests", "64"]);
}

/// 4. A client that goes away mid-stream is cancelled: its blocks are freed (the KV
///    metrics return to idle), and it is counted under finished_reason="abort".
#[test]
fn disconnected_client_frees_its_blocks() {
    serve_and_check(4, &[], "check_disconnect.py", &[]);
}

/// 4a. The same for a whole (non-streamed) request whose client hangs up before the answer:
///     the issue asks that any request whose client disconnects be cancelled.
#[test]
fn disconnected_whole_request_is_cancelled() {
    serve_and_check(12, &[], "check_disconnect.py", &["--whole"]);
}

/// 4b. A fresh server exports the KV and queue gauges at their idle values before its first
///     request, so that "returns to idle" has a baseline to return to.
#[test]
fn fresh_server_exports_idle_gauges() {
    serve_and_check(11, &[], "check_metrics.py", &[]);
}

/// 5. Under a pool of 10 blocks, 12 concurrent greedy requests preempt each other, and
///    every output equals that of the same request sent alone; with prefix caching on
///    (the default) and off.
#[test]
fn preemption_leaves_outputs_unchanged() {
    let _serial = serial();
    let model = TinyDir::new(5);
    let blocks = 10;
    let memory = (blocks * BLOCK_SIZE * KV_BYTES_PER_TOKEN).to_string();
    // With prefix caching a preempted request may find its own blocks again; without it,
    // it recomputes every token.
    for caching in [&[][..], &["--no-prefix-caching"][..]] {
        let mut flags = vec!["--kv-cache-memory", memory.as_str()];
        flags.extend_from_slice(caching);
        println!("server flags: {flags:?}");
        let server = Server::start(model.path(), &flags);
        server.check(
            "check_preemption.py",
            // Up to 28 prompt tokens plus 100 fit the 160-token pool alone; two at
            // once do not.
            &["--requests", "12", "--max-tokens", "100"],
        );
    }
}

/// 6. A repeated prompt of at least 40 tokens hits the prefix cache: the hit counter
///    grows, usage reports cached tokens, and the output is identical.
#[test]
fn repeated_prompt_hits_the_prefix_cache() {
    serve_and_check(6, &[], "check_prefix_cache.py", &[]);
}

/// 7. Bad requests get the right status and an OpenAI-shaped error naming the problem.
#[test]
fn bad_requests_get_named_errors() {
    let _serial = serial();
    let model = TinyDir::new(7);
    let server = Server::start(
        model.path(),
        &["--max-model-len", "64", "--api-key", "sk-test"],
    );
    server.check(
        "check_errors.py",
        &["--api-key", "sk-test", "--max-model-len", "64"],
    );
}

/// 8. Hot reload: an invalid file and a restart-only change are refused with the field
///    named and the running configuration kept; a change of max_num_seqs and the API keys
///    under load applies without dropping a request; SIGHUP and a change of the file
///    reload too.
#[test]
fn reload_validates_and_applies_under_load() {
    let _serial = serial();
    let model = TinyDir::new(8);
    // The server reads its configuration through a symlink, `link/config.toml`. The file
    // watcher watches the folder of the file the link pointed to at start-up,
    // `watched/config.toml`, so the script can stage each new version in `staged/` and
    // swap the link without the watcher noticing: each step is then reloaded by exactly
    // the trigger it tests (POST /admin/reload, SIGHUP), and the last step edits the
    // watched file itself to test the watcher.
    let root = model.path().join("reload");
    let (link_dir, watched_dir, staged_dir) =
        (root.join("link"), root.join("watched"), root.join("staged"));
    for dir in [&link_dir, &watched_dir, &staged_dir] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let watched = watched_dir.join("config.toml");
    std::fs::write(&watched, "max_num_seqs = 4\napi_keys = [\"k1\"]\n").unwrap();
    let link = link_dir.join("config.toml");
    std::os::unix::fs::symlink(&watched, &link).unwrap();
    let link_arg = path_arg(&link);
    let server = Server::start(
        model.path(),
        &["--config", &link_arg, "--admin-token", "adm"],
    );
    let pid = server.pid().to_string();
    server.check(
        "check_reload.py",
        &[
            "--admin-token",
            "adm",
            "--link",
            &link_arg,
            "--watched",
            &path_arg(&watched),
            "--staged",
            &path_arg(&staged_dir),
            "--pid",
            &pid,
        ],
    );
    // The log says which trigger reloaded what, and which reloads were refused and why.
    let log = server.log();
    let logged = |words: &[&str]| {
        log.lines()
            .any(|line| words.iter().all(|w| line.contains(w)))
    };
    assert!(
        logged(&["SIGHUP", "reloaded: api_keys, max_num_seqs"]),
        "no log line about the SIGHUP reload"
    );
    assert!(
        logged(&["file change", "reloaded: api_keys, max_num_seqs"]),
        "no log line about the reload on the file change"
    );
    assert!(
        logged(&["refused", "block_size"]),
        "no log line about the refused block_size change"
    );
}

/// 9. SIGTERM with 4 streams in flight: they finish normally, a new request gets 503 (or
///    a refused connection), and the process exits 0 within the shutdown timeout.
#[test]
fn sigterm_drains_in_flight_streams_then_exits_zero() {
    let _serial = serial();
    let model = TinyDir::new(9);
    let timeout = Duration::from_secs(30);
    let mut server = Server::start(
        model.path(),
        &["--shutdown-timeout", &timeout.as_secs().to_string()],
    );
    let pid = server.pid().to_string();
    let started = Instant::now();
    server.check(
        "check_shutdown.py",
        &["--pid", &pid, "--streams", "4", "--mode", "drain"],
    );
    let status = server.wait_exit(timeout);
    let waited = started.elapsed();
    let status = status.unwrap_or_else(|| {
        panic!(
            "the server was still running {waited:?} after SIGTERM (shutdown timeout {timeout:?})\n{}",
            server.log()
        )
    });
    assert!(
        status.success(),
        "the server exited with {status} after SIGTERM, not 0\n{}",
        server.log()
    );
}

/// 9b. SIGTERM with a stream that cannot finish within the shutdown timeout: the stream is
///     cancelled cleanly (an error event, then `[DONE]`) and the process exits 0 soon after
///     the deadline.
#[test]
fn sigterm_cancels_streams_past_the_deadline() {
    let _serial = serial();
    let model = TinyDir::new(10);
    let timeout = Duration::from_secs(1);
    let mut server = Server::start(
        model.path(),
        &["--shutdown-timeout", &timeout.as_secs().to_string()],
    );
    let pid = server.pid().to_string();
    server.check(
        "check_shutdown.py",
        &[
            "--pid",
            &pid,
            "--streams",
            "2",
            "--mode",
            "deadline",
            "--shutdown-timeout",
            "1",
        ],
    );
    let limit = timeout + Duration::from_secs(10);
    let status = server.wait_exit(limit).unwrap_or_else(|| {
        panic!(
            "the server was still running {limit:?} after SIGTERM with a {timeout:?} shutdown timeout\n{}",
            server.log()
        )
    });
    assert!(
        status.success(),
        "the server exited with {status} after SIGTERM, not 0\n{}",
        server.log()
    );
}

/// 11. With speculative decoding on (n-gram, the model as its own draft, a random EAGLE-3
///     head), greedy requests return exactly what `peregrine generate` prints without it,
///     alone and beside copies of themselves.
#[test]
fn speculative_greedy_requests_match_generate() {
    let _serial = serial();
    let model = TinyDir::new(11);
    let prompt = "the quick brown fox the quick brown fox the quick brown fox the quick";
    let greedy = generate(
        model.path(),
        &[
            "--prompt",
            prompt,
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--ignore-eos",
        ],
    );
    let expected = model.write_json(
        "expected.json",
        &serde_json::json!({
            "prompt": prompt,
            "greedy": {"temperature": 0.0, "max_tokens": 24, "text": greedy},
        }),
    );
    let draft = path_arg(model.path());
    let head_dir = model.path().join("eagle3");
    let head_spec = HeadSpec {
        aux_ids: Some(vec![0, 1, 1]),
        ..HeadSpec::midlayer()
    };
    RandomHead::new(&head_spec, &TinySpec::llama_tiny(), 12).write(&head_dir);
    let head = path_arg(&head_dir);
    for method in [
        &["--speculative-method", "ngram", "--ngram-min", "1"][..],
        &[
            "--speculative-method",
            "draft_model",
            "--draft-model",
            &draft,
        ][..],
        &["--speculative-method", "eagle3", "--draft-model", &head][..],
    ] {
        println!("server flags: {method:?}");
        let server = Server::start(model.path(), method);
        server.check("check_seeded.py", &["--expected", &path_arg(&expected)]);
        let (_, metrics) = http_get(&server.base, "/metrics").unwrap();
        assert!(
            metrics.contains("peregrine:spec_decode_num_drafts_total"),
            "no verification with drafts\n{}",
            server.log()
        );
    }
}

/// 11b. DeepSeek-V3 (the transformers fixture: latent attention, experts) with a random
///      multi-token prediction layer: greedy requests served with `--speculative-method
///      mtp`, which drafts with the target's own MTP layer, return exactly what
///      `peregrine generate` prints without it.
#[test]
fn mtp_greedy_requests_match_generate() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("a temporary folder");
    common::mtp_checkpoint::write(dir.path(), 31);
    // A tokenizer of 300 tokens under the model's 320: a padded vocabulary, as published
    // checkpoints have.
    write_tokenizer(dir.path(), 300);
    let prompt = "the quick brown fox the quick brown fox the quick brown fox the quick";
    let greedy = generate(
        dir.path(),
        &[
            "--prompt",
            prompt,
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--ignore-eos",
        ],
    );
    let expected = dir.path().join("expected.json");
    let body = serde_json::json!({
        "prompt": prompt,
        "greedy": {"temperature": 0.0, "max_tokens": 24, "text": greedy},
    });
    std::fs::write(&expected, serde_json::to_vec_pretty(&body).unwrap()).unwrap();
    let server = Server::start(dir.path(), &["--speculative-method", "mtp"]);
    server.check("check_seeded.py", &["--expected", &path_arg(&expected)]);
    let (_, metrics) = http_get(&server.base, "/metrics").unwrap();
    assert!(
        metrics.contains("peregrine:spec_decode_num_drafts_total"),
        "no verification with drafts\n{}",
        server.log()
    );
}

/// 12. The front door holds: stalled bodies and headers get 408 and lose their
///     connection, idle connections cannot exhaust the file limit, huge bodies and
///     prompts get 413 without slowing `/health` or keeping memory, a queued stream that
///     disconnects is cancelled at once, only allowed web origins are served, a foreign
///     `Host` (DNS rebinding) is refused on every route, forged roles
///     and bad fields get named errors, the HTTP parser's errors have JSON bodies, and a
///     reload past the host's memory is refused with the old configuration kept.
#[test]
fn the_front_door_holds() {
    let _serial = serial();
    let model = TinyDir::new(13);
    let config = model.path().join("front_door.toml");
    std::fs::write(&config, "max_num_seqs = 1\n").unwrap();
    let config_arg = path_arg(&config);
    let server = Server::start(
        model.path(),
        &[
            "--config",
            &config_arg,
            "--admin-token",
            "adm",
            "--request-header-timeout",
            "2",
            "--request-body-timeout",
            "2",
            "--max-connections",
            "48",
            "--max-request-body",
            "2MiB",
            "--max-prompt-chars",
            "20000",
            "--allowed-origins",
            "http://good.example",
            "--allowed-hosts",
            "good.example",
        ],
    );
    let pid = server.pid().to_string();
    server.check(
        "check_front_door.py",
        &[
            "--pid",
            &pid,
            "--config-file",
            &config_arg,
            "--admin-token",
            "adm",
        ],
    );
}

/// 22. Under a low open-file limit (1,024) and the default `--max-connections`, 100 idle
///     connections past the cap never take the server to its limit (each connection holds two files):
///     its open files stay below it, and a fresh `/health` answers once the idle ones are
///     dropped after the header timeout.
#[test]
fn the_connection_cap_holds_under_a_low_file_limit() {
    let _serial = serial();
    let model = TinyDir::new(23);
    let server =
        Server::start_with_file_limit(model.path(), &["--request-header-timeout", "2"], FILE_LIMIT);
    let (pid, files) = (server.pid().to_string(), FILE_LIMIT.to_string());
    server.check("check_file_limit.py", &["--pid", &pid, "--files", &files]);
}

/// The open-file limit of [`the_connection_cap_holds_under_a_low_file_limit`]: the old
/// accounting (one file a connection) allowed 768 connections, which exhaust it.
const FILE_LIMIT: u64 = 1024;

/// 13. Start-up refuses, with the setting named and no panic, a KV cache larger than the
///     host's memory, a step too large for it, and a negative size (a value, not a flag).
#[test]
fn start_up_refuses_sizes_past_the_host() {
    let _serial = serial();
    let model = TinyDir::new(14);
    let cases: [(&[&str], &[&str]); 3] = [
        (
            &["--kv-cache-memory", "1TB"],
            &["kv_cache_memory", "of host memory", "is available"],
        ),
        (
            &[
                "--max-num-seqs",
                "1000000000",
                "--max-num-batched-tokens",
                "1000000000",
            ],
            &["max_num_batched_tokens 1000000000", "of host memory"],
        ),
        (
            &["--kv-cache-memory", "-5"],
            &["invalid value '-5' for '--kv-cache-memory"],
        ),
    ];
    for (flags, needles) in cases {
        let mut command = Command::new(PEREGRINE);
        command
            .arg("serve")
            .arg("--model")
            .arg(model.path())
            .args(["--port", "0"])
            .args(flags);
        let output = output_within(&mut command, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?} started:\n{stderr}");
        assert!(
            !stderr.contains("panicked"),
            "{flags:?} panicked:\n{stderr}"
        );
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "{flags:?}: no {needle:?} in\n{stderr}"
            );
        }
    }
}

/// 15. `peregrine bench soak` against a server drafting with n-gram (every step): a row per wave and
///     for the request alone, every output equal to wave 1's (the CPU is batch
///     invariant), the largest block id in use where a poll saw one, and a quiet alarm.
#[test]
fn bench_soak_reports_every_wave_and_the_request_alone() {
    let _serial = serial();
    let model = TinyDir::new(16);
    // Drafting in every step: adaptive drafting may plan none for the tiny model where the
    // machine is busy (a full test run), and the test needs verifications to count.
    let flags = [
        "--speculative-method",
        "ngram",
        "--ngram-min",
        "1",
        "--no-speculative-adaptive",
    ];
    let server = Server::start(model.path(), &flags);
    let mut command = Command::new(PEREGRINE);
    command
        .args(["bench", "soak", "--url", &server.base])
        .args([
            "--waves",
            "3",
            "--concurrency",
            "4",
            // Long enough that a wave spans many polls on a fast machine: at 24
            // tokens a wave of the tiny model ended within one 5 ms poll in CI.
            "--max-tokens",
            "256",
            "--poll-ms",
            "2",
            "--prompt",
            "the quick brown fox jumps over the lazy dog",
        ]);
    let output = output_within(&mut command, SCRIPT_TIMEOUT);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| {
            f.first()
                .is_some_and(|w| ["1", "2", "3", "alone"].contains(w))
        })
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for row in &rows {
        let (largest, identical, alarm) = (row[1], row[row.len() - 2], row[row.len() - 1]);
        // A wave of the tiny model may end between two polls.
        assert!(largest.parse::<u64>().is_ok() || largest == "-", "{stdout}");
        let want = if row[0] == "alone" { "1/1" } else { "4/4" };
        assert_eq!((identical, alarm), (want, "quiet"), "{stdout}");
    }
    assert!(
        rows.iter().any(|row| row[1] != "-"),
        "no block id polled\n{stdout}"
    );
    assert!(
        stdout.contains("every output equal to wave 1's: yes; acceptance alarms raised: 0"),
        "{stdout}"
    );
    let (_, metrics) = http_get(&server.base, "/metrics").unwrap();
    assert!(
        metrics.contains("peregrine:spec_decode_num_drafts_total"),
        "no verification with drafts\n{stdout}"
    );
}

/// The flags that turn tool calling on, as vLLM spells them.
const TOOL_FLAGS: [&str; 3] = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"];

/// 16. Structured output: OpenAI's `response_format` (`json_schema` through the SDK's
///     `parse()` with a Pydantic model, `json_object`, streamed), vLLM's
///     `structured_outputs` and `guided_*`, and llama.cpp's `json_schema` and GBNF `grammar`,
///     on both endpoints: every finished output keeps its constraint; a `max_tokens` too
///     small ends with `length` and the text so far; bad constraints get a 400 naming the
///     field; and the schemas llama.cpp's server let outputs break are kept.
#[test]
fn structured_outputs_keep_their_constraints() {
    serve_and_check(17, &[], "check_structured.py", &[]);
}

/// 17. Tool calling (hermes): `tool_choice` required, named, `"none"` and `"auto"`,
///     `parallel_tool_calls: false`, a streamed call, a second turn answering the calls, and
///     400s naming the field for an unknown function and a tool without a name.
#[test]
fn tool_calls_follow_tool_choice() {
    serve_and_check(18, &TOOL_FLAGS, "check_tools.py", &[]);
}

/// 18. LangChain's `ChatOpenAI`: `bind_tools(..., tool_choice="required")` answers with
///     valid tool calls, and `with_structured_output` (its default method, `json_schema`,
///     `function_calling`) returns a valid Pydantic object.
#[test]
fn langchain_tools_and_structured_output() {
    serve_and_check(19, &TOOL_FLAGS, "check_langchain.py", &[]);
}

/// 19. `logit_bias` and `min_tokens` through the openai client, on both endpoints, whole
///     and streamed: a +100 bias repeats its token and a -100 one is never picked; a stop
///     token pulled up ends a request at once, or only after `min_tokens`; bad values get a
///     400 naming the field.
#[test]
fn logit_bias_and_min_tokens_are_honoured() {
    serve_and_check(20, &[], "check_biases.py", &[]);
}

/// 20. Anthropic's Messages API through the `anthropic` client: `messages.create` (a
///     system prompt, a stop sequence), `messages.stream`, `tool_choice` `any` and `tool`
///     with inputs that validate, a second turn sending the `tool_result` back, a streamed
///     call's `input_json_delta` fragments, and refusals in Anthropic's error shape.
#[test]
fn messages_api_through_the_anthropic_client() {
    serve_and_check(21, &TOOL_FLAGS, "check_messages.py", &[]);
}

/// 21. The Responses API (`/v1/responses`) through the `openai` SDK and the OpenAI Agents
///     SDK: string and item input, a required and a named function tool, a second turn
///     sending `function_call_output` back, `text.format` json_schema, typed streamed
///     events (text and argument deltas rebuilding the completed response), 400s naming
///     `store` and `previous_response_id`, and an agent turn calling its function tool.
#[test]
fn responses_api_serves_the_sdks() {
    serve_and_check(22, &TOOL_FLAGS, "check_responses.py", &[]);
}

/// 22. `n` > 1 through the openai client on both endpoints, whole and streamed: choices
///     in index order, usage with the prompt counted once, a seeded request repeating
///     choice for choice (choice i is the request with seed + i), the later choices
///     hitting the first one's prompt blocks in the prefix cache, and 400s naming `n`.
#[test]
fn n_choices_share_the_prompt_and_repeat_with_a_seed() {
    serve_and_check(23, &[], "check_choices.py", &[]);
}

/// 23. What clients of other engines rely on: the routes without `/v1`, `root` and
///     `parent` on models, `return_token_strs` on `/tokenize`, one `system_fingerprint` on
///     every response and chunk, and `continuous_usage_stats` through the openai client.
#[test]
fn compatibility_aliases_fingerprint_and_continuous_usage() {
    serve_and_check(24, &[], "check_compat.py", &[]);
}

/// 24. Three replicas behind vLLM's router and the Shepherd model gateway (`vllm-router` and
///     `smg` from PyPI, in the tests' venv): round robin spreads the requests evenly,
///     cache-aware routing (and vllm-router's kv_aware policy, over the replicas' KV-cache
///     events) raises the replicas' prefix-cache hits, and a replica killed
///     mid-run behind each costs no request sent after it (check_router.py).
#[test]
fn replicas_behind_the_routers_built_for_vllm_and_sglang() {
    let _serial = serial();
    let model = TinyDir::new(31);
    // Three replicas and a spare that takes the place of the one killed behind the first
    // router, to be killed behind the second.
    // Each publishes its KV-cache events, for vllm-router's kv_aware policy.
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let replicas: Vec<Server> = ports
        .iter()
        .map(|port| {
            let events =
                format!(r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{port}"}}"#);
            Server::start(model.path(), &["--kv-events-config", &events])
        })
        .collect();
    let bases: Vec<&str> = replicas.iter().map(|r| r.base.as_str()).collect();
    let events: Vec<String> = ports[..3]
        .iter()
        .map(|port| format!("tcp://127.0.0.1:{port}"))
        .collect();
    let model_dir = model.path().display().to_string();
    let pids: Vec<String> = replicas[2..]
        .iter()
        .map(|r| r.child.id().to_string())
        .collect();
    let mut args = vec![
        "--replicas",
        bases[0],
        bases[1],
        bases[2],
        "--spare",
        bases[3],
    ];
    args.extend(["--kill-pids", &pids[0], &pids[1]]);
    args.extend(["--kv-events", &events[0], &events[1], &events[2]]);
    args.extend(["--model-dir", &model_dir]);
    replicas[0].check("check_router.py", &args);
}

/// 25. KV-cache events reach a subscriber written with pyzmq and vLLM's msgspec types: the
///     start-up batch by replay, then every batch of requests through a pool of 64 blocks
///     that evicts, decoded, in sequence, each prompt held block by block, and the blocks
///     stored and not removed equal the pool's cached blocks (check_kv_events.py).
#[test]
fn kv_events_reach_a_subscriber_with_vllm_s_types() {
    check_kv_events(&[], &[]);
}

/// 25. The same with a host tier of 16 blocks below the pool: blocks move between the
///     `GPU` and `CPU` media under the same hashes, and the `CPU` blocks stored and not
///     removed equal the tier's (check_kv_events.py --host-tier).
#[test]
fn kv_events_carry_the_host_tier_as_the_cpu_medium() {
    let host = (16 * BLOCK_SIZE * KV_BYTES_PER_TOKEN).to_string();
    check_kv_events(&["--kv-host-memory", &host], &["--host-tier"]);
}

/// Serves a tiny model with a pool of 64 blocks, KV-cache events on and `flags`, and runs
/// check_kv_events.py against it with `check_flags`.
fn check_kv_events(flags: &[&str], check_flags: &[&str]) {
    let _serial = serial();
    let model = TinyDir::new(32);
    let memory = (64 * BLOCK_SIZE * KV_BYTES_PER_TOKEN).to_string();
    let port = free_port();
    let replay = model.path().join("replay.sock");
    let config = serde_json::json!({
        "enable_kv_cache_events": true,
        "endpoint": format!("tcp://*:{port}"),
        "replay_endpoint": format!("ipc://{}", replay.display()),
    })
    .to_string();
    let mut args = vec!["--kv-cache-memory", &memory, "--kv-events-config", &config];
    args.extend(flags);
    let server = Server::start(model.path(), &args);
    let events = format!("tcp://127.0.0.1:{port}");
    let replay = format!("ipc://{}", replay.display());
    let mut args = vec!["--events", &events, "--replay", &replay];
    args.extend(check_flags);
    server.check("check_kv_events.py", &args);
}

/// 26. A server whose CPU KV cache is float32 (`--kv-cache-dtype float32`, the default
///     being bfloat16): a repeated prompt hits the prefix cache and repeats its output,
///     greedy and seeded (check_prefix_cache.py).
#[test]
fn a_float32_kv_cache_serves_and_hits_the_prefix_cache() {
    serve_and_check(
        33,
        &["--kv-cache-dtype", "float32"],
        "check_prefix_cache.py",
        &[],
    );
}

/// A TCP port free on the loopback address now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// 14. `--device cuda` on a machine without an NVIDIA driver says so, with no panic.
#[cfg(feature = "cuda")]
#[test]
fn cuda_without_a_driver_is_an_error_not_a_panic() {
    if peregrine_runtime::cuda::gpu_available() {
        return; // a GPU machine: the CUDA tests cover it
    }
    let model = TinyDir::new(15);
    let mut command = Command::new(PEREGRINE);
    command
        .arg("serve")
        .arg("--model")
        .arg(model.path())
        .args(["--port", "0", "--device", "cuda"]);
    let output = output_within(&mut command, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started:\n{stderr}");
    assert!(!stderr.contains("panicked"), "a panic:\n{stderr}");
    assert!(
        stderr.contains("no CUDA driver could be loaded"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------------------
// The tiny model
// ---------------------------------------------------------------------------------------

/// A temporary folder holding the tiny Llama and its tokenizer.
struct TinyDir {
    dir: tempfile::TempDir,
}

impl TinyDir {
    fn new(seed: u64) -> TinyDir {
        let dir = tempfile::tempdir().expect("a temporary folder");
        TinyModel::random(TinySpec::llama_tiny(), seed).write_hf(dir.path());
        write_tokenizer(dir.path(), 300);
        TinyDir { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `value` as `name` beside the model and returns its path.
    fn write_json(&self, name: &str, value: &serde_json::Value) -> PathBuf {
        let path = self.path().join(name);
        std::fs::write(&path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
        path
    }
}

/// `peregrine generate --model DIR ARGS…`'s stdout, without its trailing newline.
fn generate(model: &Path, args: &[&str]) -> String {
    let output = Command::new(PEREGRINE)
        .arg("generate")
        .arg("--model")
        .arg(model)
        .args(args)
        .output()
        .expect("running peregrine generate");
    assert!(
        output.status.success(),
        "peregrine generate {args:?} failed with {}:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("generate prints UTF-8");
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

// ---------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------

/// A running `peregrine serve`. Dropping it kills the process; if the test is failing, its
/// log (stderr) is printed first.
struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    base: String,
    /// Everything the server wrote to stderr so far.
    stderr: Arc<Mutex<Vec<u8>>>,
    status: Option<ExitStatus>,
}

impl Server {
    /// Starts `peregrine serve` on a free port for the model in `model`, with the common
    /// flags and then `extra`, and waits until `/health` answers.
    fn start(model: &Path, extra: &[&str]) -> Server {
        Self::spawn(Command::new(PEREGRINE), model, extra)
    }

    /// As [`Server::start`], under an open-file limit (soft and hard) of `files`.
    fn start_with_file_limit(model: &Path, extra: &[&str], files: u64) -> Server {
        let mut shell = Command::new("sh");
        shell.args([
            "-c",
            &format!("ulimit -n {files} && exec \"$0\" \"$@\""),
            PEREGRINE,
        ]);
        Self::spawn(shell, model, extra)
    }

    /// Starts `command` (`peregrine` or what execs it) as [`Server::start`] says.
    fn spawn(mut command: Command, model: &Path, extra: &[&str]) -> Server {
        let mut child = command
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(["--served-model-name", MODEL_NAME])
            .args(["--log-level", "info"])
            .args(if extra.contains(&"--kv-cache-memory") {
                &[][..]
            } else {
                // 4096 blocks (65,536 tokens): no test runs out unless it means to.
                &["--kv-cache-memory", "32MiB"][..]
            })
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting peregrine serve");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        // The address line, then keep draining stdout so the server never blocks on it.
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("peregrine: listening on ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr.trim().to_string());
                    }
                }
            }
        });
        let mut server = Server {
            child,
            base: String::new(),
            stderr,
            status: None,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        server.base = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(base) => break base,
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    if let Some(status) = server.child.try_wait().unwrap() {
                        panic!(
                            "peregrine serve exited with {status} before listening:\n{}",
                            server.log()
                        );
                    }
                }
                Err(_) => panic!(
                    "peregrine serve printed no `peregrine: listening on` line within {START_TIMEOUT:?}:\n{}",
                    server.log()
                ),
            }
        };
        loop {
            if let Ok((200, _)) = http_get(&server.base, "/health") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}/health did not answer 200 within {START_TIMEOUT:?}:\n{}",
                server.base,
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's stderr so far.
    fn log(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Runs `tests/e2e/SCRIPT --base URL ARGS…` and fails the test (showing the script's
    /// output and the server's log) unless it exits 0.
    fn check(&self, script: &str, args: &[&str]) {
        // The venv's interpreter, built on first use (the build is not timed with the script).
        let python = common::python_env::python();
        let path = e2e_dir().join(script);
        let started = Instant::now();
        let mut command = Command::new(python);
        command
            .arg("-u")
            .arg(&path)
            // No __pycache__ in the checkout.
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .args(["--base", &self.base, "--model", MODEL_NAME])
            .args(args);
        let output = output_within(&mut command, SCRIPT_TIMEOUT);
        let shown = show(&output);
        if output.status.success() {
            println!(
                "--- {script} ({:.1}s) ---\n{shown}",
                started.elapsed().as_secs_f64()
            );
        }
        // On failure, dropping the server prints its log.
        assert!(
            output.status.success(),
            "{script} failed ({}):\n{shown}",
            output.status
        );
    }

    /// Waits up to `timeout` for the process to exit on its own.
    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the server") {
                self.status = Some(status);
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            // Give the reader thread a moment to take the last lines.
            std::thread::sleep(Duration::from_millis(100));
            eprintln!(
                "--- peregrine serve stderr ({}) ---\n{}",
                self.base,
                self.log()
            );
        }
    }
}

/// A blocking `GET` with HTTP/1.0 (the server closes the connection after answering):
/// the status and the body.
fn http_get(base: &str, path: &str) -> std::io::Result<(u16, String)> {
    let addr = base.strip_prefix("http://").unwrap_or(base);
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

// ---------------------------------------------------------------------------------------
// Python
// ---------------------------------------------------------------------------------------

fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("e2e")
}

/// Runs `command` to the end, killing it after `timeout` (a hung script must not hang the
/// test run): its status and output.
fn output_within(command: &mut Command, timeout: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for a script") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let status = child.wait().expect("waiting for a killed script");
            eprintln!("{command:?} ran past {timeout:?} and was killed");
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// A command's stdout and stderr for a failure message.
fn show(output: &Output) -> String {
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !stderr.trim().is_empty() {
        text.push_str("--- stderr ---\n");
        text.push_str(&stderr);
    }
    text
}

fn path_arg(path: &Path) -> String {
    path.to_str().expect("a UTF-8 temporary path").to_string()
}

/// 25. The host tier (`--kv-host-memory`) under a pool of 24 blocks: blocks other
///     prompts push out of the pool go down to host memory, and a repeated prompt gets its
///     whole blocks back from there as cached tokens, with exactly its cold greedy output
///     (check_host_tier.py). Start-up refuses the tier without prefix caching.
#[test]
fn prefix_blocks_come_back_from_the_host_tier() {
    let _serial = serial();
    let model = TinyDir::new(32);
    let pool = (24 * BLOCK_SIZE * KV_BYTES_PER_TOKEN).to_string();
    let host = (256 * BLOCK_SIZE * KV_BYTES_PER_TOKEN).to_string();
    let flags = ["--kv-cache-memory", &pool, "--kv-host-memory", &host];
    let server = Server::start(model.path(), &flags);
    let block_bytes = (BLOCK_SIZE * KV_BYTES_PER_TOKEN).to_string();
    server.check("check_host_tier.py", &["--block-bytes", &block_bytes]);
    drop(server);
    let mut command = Command::new(PEREGRINE);
    command
        .arg("serve")
        .arg("--model")
        .arg(model.path())
        .args(["--port", "0", "--no-prefix-caching"])
        .args(flags);
    let output = output_within(&mut command, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started without prefix caching");
    assert!(
        stderr.contains("kv_host_memory") && stderr.contains("prefix caching"),
        "{stderr}"
    );
}

/// 26. The disk tier (`--kv-cache-dir`) under a pool of 24 blocks, across restarts: blocks
///     other prompts push out of the pool are written to disk and a repeated prompt reads
///     its whole blocks back with its cold greedy output; a second process on the same
///     directory is refused while the first runs; a restarted server finds the blocks and
///     serves the prompt from disk with the same output; a byte of every chain's first
///     block flipped under that server makes the prompt's read fail its checks and the
///     request compute those blocks again (never served corrupt) with the same output, and
///     the same request then find them in the pool with the same output; a server started
///     over the damaged file misses those chains too, with the same output
///     (check_disk_tier.py).
#[test]
fn prefix_blocks_come_back_from_disk_across_restarts_and_damage_only_misses() {
    let _serial = serial();
    let model = TinyDir::new(33);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let kv_dir = dir.path().join("kv");
    let state = dir.path().join("cold.txt");
    let pool = (24 * BLOCK_SIZE * KV_BYTES_PER_TOKEN).to_string();
    let flags = [
        "--kv-cache-memory",
        &pool,
        "--kv-cache-dir",
        kv_dir.to_str().expect("a UTF-8 path"),
        "--kv-disk-space",
        "64MiB",
    ];
    let phase = |name: &str| {
        let server = Server::start(model.path(), &flags);
        let args = [
            "--phase",
            name,
            "--state",
            state.to_str().expect("a UTF-8 path"),
        ];
        server.check("check_disk_tier.py", &args);
        server
    };
    let first = phase("cold");
    let mut second = Command::new(PEREGRINE);
    second
        .arg("serve")
        .arg("--model")
        .arg(model.path())
        .args(["--port", "0"])
        .args(flags);
    let output = output_within(&mut second, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "a second server shared the directory"
    );
    assert!(
        stderr.contains("locked by another Peregrine process"),
        "{stderr}"
    );
    drop(first);
    let second = phase("restart");
    let state_arg = state.to_str().expect("a UTF-8 path");
    second.check(
        "check_disk_tier.py",
        &["--phase", "push", "--state", state_arg],
    );
    let flipped = flip_first_blocks(&kv_dir);
    assert!(flipped > 0, "no chain's first block was found in the file");
    second.check(
        "check_disk_tier.py",
        &["--phase", "live", "--state", state_arg],
    );
    drop(second);
    drop(phase("damaged"));
}

/// Flips a byte of the data of every block in `kv_dir`'s file that starts a chain (its
/// parent is the root), parsing the file with `kv_disk`'s own layout; how many.
fn flip_first_blocks(kv_dir: &Path) -> usize {
    use peregrine_actors::kv_disk::format::{FileHeader, RecordHeader, PAGE};
    use std::os::unix::fs::FileExt;
    let path = std::fs::read_dir(kv_dir)
        .expect("the tier's directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "blocks"))
        .expect("a blocks file");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("the blocks file");
    let mut page = vec![0; PAGE as usize];
    file.read_exact_at(&mut page, 0).expect("a header");
    let header = FileHeader::decode(&page).expect("a valid header");
    let mut flipped = 0;
    for slot in 0..header.slots {
        let at = header.slot_offset(slot).expect("an offset");
        file.read_exact_at(&mut page, at).expect("a record page");
        let Some(record) = RecordHeader::decode(&page, slot) else {
            continue;
        };
        if record.parent == [0; 32] {
            let mut byte = [0u8];
            file.read_exact_at(&mut byte, at + PAGE + 5)
                .expect("a data byte");
            file.write_all_at(&[byte[0] ^ 0x40], at + PAGE + 5)
                .expect("a write");
            flipped += 1;
        }
    }
    flipped
}

/// The shape of most tests here: one at a time, a server for a tiny model of `seed` with
/// `flags`, and `script` (under tests/e2e/) run against it with `args`.
fn serve_and_check(seed: u64, flags: &[&str], script: &str, args: &[&str]) {
    let _serial = serial();
    let model = TinyDir::new(seed);
    let server = Server::start(model.path(), flags);
    server.check(script, args);
}

/// One test at a time (see the module documentation); a failed test does not block the
/// others.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
