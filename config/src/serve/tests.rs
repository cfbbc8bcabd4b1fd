//! Loading, validation, reload and masking, through the flags and file text users write.

use super::*;
use clap::{CommandFactory, Parser};
use std::path::{Path, PathBuf};

/// `peregrine serve` alone.
#[derive(Parser)]
struct Serve {
    #[command(flatten)]
    args: ServeArgs,
}

fn flags(list: &[&str]) -> ServeArgs {
    let argv = std::iter::once("serve").chain(list.iter().copied());
    Serve::try_parse_from(argv).expect("flags parse").args
}

fn from_file(text: &str, list: &[&str]) -> Result<ServeConfig, ConfigError> {
    ServeConfig::resolve(Some((Path::new("config.toml"), text)), &flags(list))
}

fn file(text: &str) -> ServeConfig {
    from_file(text, &[]).expect("config loads")
}

fn error(text: &str) -> String {
    from_file(text, &[])
        .expect_err("config is refused")
        .to_string()
}

#[test]
fn defaults_fill_what_nothing_sets() {
    let config = ServeConfig::load(&ServeArgs::default()).expect("defaults load");
    assert_eq!(config, ServeConfig::default());
    assert_eq!((config.host.as_str(), config.port), ("127.0.0.1", 8000));
    assert_eq!(
        (config.max_num_seqs, config.max_num_batched_tokens),
        (64, 2048)
    );
    assert_eq!((config.block_size, config.kv_cache_memory), (16, None));
    assert!(config.enable_prefix_caching);
    assert_eq!(config.cache_config().kv_cache_memory, None);
}

#[test]
fn flags_override_the_file_and_the_file_overrides_defaults() {
    let text = r#"
        max_num_seqs = 32
        port = 9000
        api_keys = ["a", "b"]
        enable_prefix_caching = true
        log_level = "debug"
        shutdown_timeout = 5
    "#;
    let list = [
        "--max-num-seqs",
        "8",
        "--api-key",
        "c",
        "--no-prefix-caching",
    ];
    let config = from_file(text, &list).expect("loads");
    assert_eq!(config.max_num_seqs, 8);
    assert_eq!(config.api_keys, ["c"]);
    assert!(!config.enable_prefix_caching);
    assert_eq!(config.port, 9000);
    assert_eq!(config.log_level, "debug");
    assert_eq!(config.shutdown_timeout.as_secs(), 5);
    assert_eq!(config.block_size, 16);
    let keys = from_file("", &["--api-key", "x", "--api-key", "y"]).expect("loads");
    assert_eq!(keys.api_keys, ["x", "y"]);
    // vLLM's spelling of the same flag.
    let vllm = from_file("", &["--no-enable-prefix-caching"]).expect("loads");
    assert!(!vllm.enable_prefix_caching);
    let vllm = from_file("", &["--kv-cache-memory-bytes", "2GiB"]).expect("loads");
    assert_eq!(vllm.kv_cache_memory, Some(2 << 30));
}

#[test]
fn port_zero_is_allowed() {
    assert_eq!(file("port = 0").port, 0);
}

#[test]
fn unknown_keys_are_named() {
    let top = error("max_num_seq = 1");
    assert!(
        top.starts_with("config.toml: ") && top.contains("max_num_seq`"),
        "{top}"
    );
    let nested = error("[default_sampling]\ntemprature = 0.5");
    assert!(
        nested.contains("temprature") && nested.contains("default_sampling"),
        "{nested}"
    );
}

#[test]
fn wrong_types_are_named() {
    let cases = [
        ("max_num_seqs = \"many\"", "max_num_seqs"),
        ("port = 70000", "port"),
        ("device = \"tpu\"", "device"),
        ("api_keys = \"k\"", "api_keys"),
        ("enable_prefix_caching = 1", "enable_prefix_caching"),
        ("[default_sampling]\ntop_k = 1.5", "default_sampling.top_k"),
        ("default_sampling = 3", "default_sampling"),
    ];
    for (text, field) in cases {
        let message = error(text);
        assert!(message.starts_with("config.toml: "), "{message}");
        assert!(message.contains(&format!("`{field}`")), "{text}: {message}");
    }
}

#[test]
fn invalid_values_name_the_field() {
    let cases = [
        (
            "max_num_seqs = 0",
            "config.toml: max_num_seqs must be at least 1, not 0",
        ),
        (
            "max_num_batched_tokens = 0",
            "config.toml: max_num_batched_tokens must be at least 1, not 0",
        ),
        (
            "max_waiting_requests = 0",
            "config.toml: max_waiting_requests must be at least 1, not 0",
        ),
        (
            "block_size = 12",
            "config.toml: block_size must be a power of two from 1 to 256, not 12",
        ),
        (
            "block_size = 512",
            "config.toml: block_size must be a power of two from 1 to 256, not 512",
        ),
        (
            "gpu_memory_utilization = 1.5",
            "config.toml: gpu_memory_utilization must be in (0, 1], not 1.5",
        ),
        (
            "gpu_memory_utilization = 0",
            "config.toml: gpu_memory_utilization must be in (0, 1], not 0",
        ),
        (
            "kv_cache_memory = 0",
            "config.toml: kv_cache_memory must be more than 0 bytes",
        ),
        (
            "api_keys = [\"a\", \"\"]",
            "config.toml: api_keys must not hold an empty key (key 2)",
        ),
        (
            "admin_token = \"\"",
            "config.toml: admin_token must not be empty",
        ),
        ("host = \" \"", "config.toml: host must not be empty"),
        (
            "[default_sampling]\ntemperature = -1",
            "config.toml: default_sampling.temperature must be at least 0, not -1",
        ),
        (
            "[default_sampling]\ntop_p = 0",
            "config.toml: default_sampling.top_p must be in (0, 1], not 0",
        ),
    ];
    for (text, message) in cases {
        assert_eq!(error(text), message);
    }
    assert!(error("log_level = \"loud\"").starts_with("config.toml: log_level must be"));
    assert_eq!(
        file("log_level = \"info,peregrine=trace\"").log_level,
        "info,peregrine=trace"
    );
}

#[test]
fn invalid_flags_name_the_flag() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--max-num-seqs", "0"],
            "--max-num-seqs must be at least 1, not 0",
        ),
        (
            &["--block-size", "48"],
            "--block-size must be a power of two from 1 to 256, not 48",
        ),
        (
            &["--api-key", ""],
            "--api-key must not hold an empty key (key 1)",
        ),
        (&["--log-level", "chatty"], "--log-level must be error"),
    ];
    for (list, message) in cases {
        let got = from_file("", list).expect_err("refused").to_string();
        assert!(got.starts_with(message), "{got}");
    }
    assert!(Serve::try_parse_from(["serve", "--kv-cache-memory", "lots"]).is_err());
    assert!(Serve::try_parse_from(["serve", "--device", "tpu"]).is_err());
}

#[test]
fn a_bad_file_is_refused_even_when_a_flag_overrides_the_field() {
    let message = from_file("max_num_seqs = 0", &["--max-num-seqs", "4"]).expect_err("refused");
    assert!(message.to_string().contains("max_num_seqs"));
}

#[test]
fn syntax_errors_name_the_file_and_line() {
    let message = error("max_num_seqs = 4\nport = [");
    assert!(
        message.starts_with("config.toml: ") && message.contains("line 2"),
        "{message}"
    );
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let path = PathBuf::from("/nonexistent/peregrine.toml");
    let args = ServeArgs {
        config: Some(path),
        ..ServeArgs::default()
    };
    let message = ServeConfig::load(&args).expect_err("refused").to_string();
    assert!(message.contains("/nonexistent/peregrine.toml"), "{message}");
}

#[test]
fn byte_sizes_in_the_file_and_flags() {
    assert_eq!(
        file("kv_cache_memory = \"512MiB\"").kv_cache_memory,
        Some(512 << 20)
    );
    assert_eq!(
        file("kv_cache_memory = \"1.5GB\"").kv_cache_memory,
        Some(1_500_000_000)
    );
    assert_eq!(
        file("kv_cache_memory = 1048576").kv_cache_memory,
        Some(1 << 20)
    );
    for bad in [
        "kv_cache_memory = \"lots\"",
        "kv_cache_memory = -5",
        "kv_cache_memory = 1.5",
    ] {
        assert!(
            error(bad).contains("`kv_cache_memory`"),
            "{bad}: {}",
            error(bad)
        );
    }
    let flag = from_file("kv_cache_memory = \"1GiB\"", &["--kv-cache-memory", "2GiB"]);
    assert_eq!(flag.expect("loads").kv_cache_memory, Some(2 << 30));
}

#[test]
fn the_default_sampling_table() {
    let text = r#"
        [default_sampling]
        temperature = 1
        top_p = 0.9
        top_k = 40
        min_p = 0.05
        repetition_penalty = 1.1
        presence_penalty = -0.5
        frequency_penalty = 0.5
        max_tokens = 256
    "#;
    let expected = SamplingDefaults {
        temperature: Some(1.0),
        top_p: Some(0.9),
        top_k: Some(40),
        min_p: Some(0.05),
        repetition_penalty: Some(1.1),
        presence_penalty: Some(-0.5),
        frequency_penalty: Some(0.5),
        max_tokens: Some(256),
    };
    assert_eq!(file(text).default_sampling, expected);
    let partial = file("default_sampling.max_tokens = 16").default_sampling;
    let only_max = SamplingDefaults {
        max_tokens: Some(16),
        ..SamplingDefaults::default()
    };
    assert_eq!(partial, only_max);
}

#[test]
fn reload_lists_the_live_fields_that_changed() {
    let old = file("max_num_seqs = 32\napi_keys = [\"a\"]\nblock_size = 16");
    let new = file("max_num_seqs = 16\napi_keys = [\"a\", \"b\"]\nblock_size = 16");
    assert_eq!(
        old.reload_changes(&new),
        Ok(vec!["api_keys", "max_num_seqs"])
    );
    assert_eq!(old.reload_changes(&old.clone()), Ok(vec![]));
    let sampling = file("default_sampling.temperature = 0.5");
    assert_eq!(
        old.reload_changes(&sampling),
        Ok(vec!["api_keys", "max_num_seqs", "default_sampling"])
    );
}

#[test]
fn reload_refuses_a_field_that_needs_a_restart() {
    let old = file("block_size = 16");
    let new = file("block_size = 32\nmax_num_seqs = 8");
    let refused = old.reload_changes(&new).expect_err("refused");
    let expected = ReloadError::RestartRequired {
        field: "block_size",
        old: "16".into(),
        new: "32".into(),
    };
    assert_eq!(refused, expected);
    assert_eq!(
        refused.to_string(),
        "field \"block_size\" cannot change without a restart (running 16, file says 32); \
         the running configuration stays"
    );
    let model = old.reload_changes(&file("model = \"/models/other\""));
    let message = model.expect_err("refused").to_string();
    assert!(
        message.starts_with("field \"model\" cannot change")
            && message.contains("running unset, file says /models/other"),
        "{message}"
    );
}

#[test]
fn kv_host_memory_is_a_byte_size_off_by_default() {
    assert_eq!(ServeConfig::default().kv_host_memory, None);
    assert_eq!(
        file("kv_host_memory = \"2GiB\"").kv_host_memory,
        Some(2 << 30)
    );
}

#[test]
fn the_disk_tier_is_a_directory_and_a_byte_size_off_by_default() {
    let default = ServeConfig::default();
    assert_eq!(
        (default.kv_cache_dir.clone(), default.kv_disk_space),
        (None, None)
    );
    let config = file("kv_cache_dir = \"/var/cache/kv\"\nkv_disk_space = \"2GiB\"");
    assert_eq!(config.kv_cache_dir, Some(PathBuf::from("/var/cache/kv")));
    assert_eq!(config.kv_disk_space, Some(2 << 30));
    let flags = from_file(
        "",
        &["--kv-cache-dir", "/tmp/kv", "--kv-disk-space", "500MB"],
    )
    .unwrap();
    assert_eq!(flags.kv_disk_space, Some(500_000_000));
    let zero = from_file("", &["--kv-disk-space", "0"])
        .unwrap_err()
        .to_string();
    assert!(zero.contains("--kv-disk-space"), "{zero}");
}

#[test]
fn the_reloadable_fields_are_exactly_these() {
    let live: Vec<_> = ServeConfig::default()
        .fields()
        .into_iter()
        .filter(|f| f.reload == fields::Reload::Live)
        .map(|f| f.name)
        .collect();
    let expected = [
        "api_keys",
        "admin_token",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enforce_eager",
        "cudagraph_sizes",
        "max_waiting_requests",
        "request_body_timeout",
        "max_request_body",
        "max_prompt_chars",
        "shutdown_timeout",
        "log_level",
        "default_sampling",
        "num_speculative_tokens",
        "speculative_adaptive",
    ];
    assert_eq!(live, expected);
    assert_eq!(ServeConfig::default().fields().len(), 49);
}

#[test]
fn masking_hides_every_secret() {
    let config = file(
        r#"api_keys = ["sk-one-secret", "sk-two-secret"]
                         admin_token = "admin-secret""#,
    );
    let json = config.masked_json();
    let text = json.to_string();
    let debug = format!("{config:?}");
    for secret in ["sk-one-secret", "sk-two-secret", "admin-secret"] {
        assert!(!text.contains(secret) && !debug.contains(secret), "{text}");
    }
    assert_eq!(json["api_keys"], serde_json::json!(["***", "***"]));
    assert_eq!(json["admin_token"], "***");
    assert_eq!(json["max_num_seqs"], 64);
    assert_eq!(json["gpu_memory_utilization"], 0.9);
    assert_eq!(
        ServeConfig::default().masked_json()["admin_token"],
        serde_json::Value::Null
    );
}

#[test]
fn help_defaults_are_the_real_defaults() {
    let mut checked = 0;
    for arg in Serve::command().get_arguments() {
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let Some(default) = help
            .split("[default: ")
            .nth(1)
            .and_then(|r| r.split(']').next())
        else {
            continue;
        };
        if default.contains(' ') {
            continue; // a description, not a value
        }
        let flag = format!("--{}", arg.get_long().expect("a long flag"));
        let config = from_file("", &[&flag, default]).expect("the default loads");
        assert_eq!(
            config,
            ServeConfig::default(),
            "{flag} says its default is {default}"
        );
        checked += 1;
    }
    assert_eq!(checked, 22);
}

#[test]
fn speculation_settings_load_and_bad_ones_name_their_field() {
    let config = from_file(
        "num_speculative_tokens = 5\nngram_max = 6",
        &["--speculative-method", "ngram", "--ngram-min", "3"],
    )
    .expect("loads");
    assert_eq!(config.speculative_method, Some(SpeculativeMethod::Ngram));
    assert_eq!(
        (
            config.num_speculative_tokens,
            config.ngram_min,
            config.ngram_max
        ),
        (5, 3, 6)
    );
    let draft = from_file(
        "",
        &["--speculative-method", "draft_model", "--draft-model", "d"],
    );
    assert_eq!(draft.expect("loads").draft_model, Some(PathBuf::from("d")));

    let refused = |text: &str, list: &[&str]| from_file(text, list).unwrap_err().to_string();
    // With the default model, eagle3 drafts with the head shipped for it; with another
    // model the head must be named.
    let default_head = from_file("", &["--speculative-method", "eagle3"]).expect("loads");
    assert_eq!(default_head.draft_model, None);
    let e = refused("", &["--model", "m", "--speculative-method", "eagle3"]);
    assert!(
        e.starts_with("--draft-model") && e.contains("eagle3"),
        "{e}"
    );
    let eagle = from_file(
        "",
        &["--speculative-method", "eagle3", "--draft-model", "head"],
    );
    assert_eq!(
        eagle.expect("loads").draft_model,
        Some(PathBuf::from("head"))
    );
    let e = refused("num_speculative_tokens = 0", &[]);
    assert!(
        e.starts_with("config.toml: num_speculative_tokens must be from 1 to 16"),
        "{e}"
    );
    let e = refused("ngram_min = 5", &["--speculative-method", "ngram"]);
    assert!(
        e.contains("ngram_min") && e.contains("must not exceed ngram_max (4)"),
        "{e}"
    );
    let e = refused("", &["--speculative-method", "draft_model"]);
    assert!(
        e.starts_with("--draft-model") && e.contains("directory"),
        "{e}"
    );
    let e = refused("", &["--draft-model", "d"]);
    assert!(
        e.contains("only used with speculative_method draft_model"),
        "{e}"
    );
    // mtp drafts with the target's own layers: no draft model is named.
    let mtp = from_file("", &["--model", "m", "--speculative-method", "mtp"]).expect("loads");
    assert_eq!(mtp.speculative_method, Some(SpeculativeMethod::Mtp));
    let e = refused("", &["--speculative-method", "mtp", "--draft-model", "d"]);
    assert!(
        e.contains("only used with speculative_method draft_model"),
        "{e}"
    );
    // Speculation is a device-independent setting: the GPU sizes its logits for it.
    let config = from_file("device = \"cuda\"", &["--speculative-method", "ngram"]).unwrap();
    assert_eq!(config.speculative_method, Some(SpeculativeMethod::Ngram));
    let args = ["--speculative-method", "eagle3", "--draft-model", "d"];
    let config = from_file("device = \"cuda\"", &args).unwrap();
    assert_eq!(config.speculative_method, Some(SpeculativeMethod::Eagle3));
}

#[test]
fn speculative_tokens_reload_live_and_the_method_needs_a_restart() {
    let running = from_file("speculative_method = \"ngram\"", &[]).unwrap();
    let more = from_file(
        "speculative_method = \"ngram\"\nnum_speculative_tokens = 5",
        &[],
    );
    assert_eq!(
        running.reload_changes(&more.unwrap()).unwrap(),
        vec!["num_speculative_tokens"]
    );
    let off = from_file("", &[]).unwrap();
    let err = running.reload_changes(&off).unwrap_err().to_string();
    assert!(err.contains("speculative_method"), "{err}");
}

#[test]
fn an_absent_flag_stays_absent_under_a_global_log_level() {
    // The binary may give `--log-level` as a global flag; it must have no default value, or
    // clap would fill `ServeArgs::log_level` with it and override the file.
    #[derive(Parser)]
    struct Cli {
        #[arg(long, global = true)]
        log_level: Option<String>,
        #[command(subcommand)]
        command: Command,
    }
    #[derive(clap::Subcommand)]
    enum Command {
        Serve(ServeArgs),
    }
    Cli::command().debug_assert();
    let level = |argv: &[&str]| match Cli::try_parse_from(argv).expect("parses").command {
        Command::Serve(args) => args.layer.log_level,
    };
    assert_eq!(level(&["p", "serve"]), None);
    assert_eq!(
        level(&["p", "serve", "--log-level", "debug"]).as_deref(),
        Some("debug")
    );
    assert_eq!(
        level(&["p", "--log-level", "trace", "serve"]).as_deref(),
        Some("trace")
    );
}

#[test]
fn the_example_file_loads() {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/example.toml"));
    let args = ServeArgs {
        config: Some(path),
        ..ServeArgs::default()
    };
    let config = ServeConfig::load(&args).expect("example.toml loads");
    assert_eq!(config.api_keys.len(), 1);
    assert_eq!(config.default_sampling.max_tokens, Some(512));
    assert_eq!(config.kv_cache_memory, None);
}

#[test]
fn graph_sizes_come_from_a_comma_list_or_the_file_and_stay_within_max_num_seqs() {
    let config = from_file("", &["--cudagraph-sizes", "1,2,4,32"]).expect("loads");
    assert_eq!(config.cudagraph_sizes, Some(vec![1, 2, 4, 32]));
    assert!(!config.enforce_eager);
    let config = file("cudagraph_sizes = [8, 1]\nenforce_eager = true");
    assert_eq!(config.cudagraph_sizes, Some(vec![8, 1]));
    assert!(config.enforce_eager);
    assert!(from_file("", &["--enforce-eager"]).unwrap().enforce_eager);
    assert_eq!(
        error("cudagraph_sizes = [1, 0]"),
        "config.toml: cudagraph_sizes must list batch sizes of at least 1, not [1, 0]"
    );
    assert!(error("cudagraph_sizes = []").starts_with("config.toml: cudagraph_sizes must list"));
    let past = from_file("max_num_seqs = 16", &["--cudagraph-sizes", "8,32"])
        .expect_err("refused")
        .to_string();
    assert_eq!(
        past,
        "--cudagraph-sizes (or config.toml: cudagraph_sizes) holds 32, past max_num_seqs 16: \
         a step never has that many sequences"
    );
    assert!(Serve::try_parse_from(["serve", "--cudagraph-sizes", "1,x"]).is_err());
    // Sizes reload live; lowering max_num_seqs under a listed size is refused whole.
    let old = file("cudagraph_sizes = [1, 2]");
    let new = file("cudagraph_sizes = [1, 2, 4]");
    assert_eq!(old.reload_changes(&new), Ok(vec!["cudagraph_sizes"]));
}

#[test]
fn async_scheduling_is_on_unless_the_file_or_the_flag_turns_it_off() {
    assert!(from_file("", &[]).unwrap().async_scheduling);
    assert!(!file("async_scheduling = false").async_scheduling);
    assert!(
        !from_file("", &["--no-async-scheduling"])
            .unwrap()
            .async_scheduling
    );
}

#[test]
fn constrained_batches_queue_ahead_only_when_asked() {
    assert!(!from_file("", &[]).unwrap().async_scheduling_constrained);
    assert!(file("async_scheduling_constrained = true").async_scheduling_constrained);
    let flagged = from_file("", &["--async-scheduling-constrained"]).unwrap();
    assert!(flagged.async_scheduling_constrained);
}

#[test]
fn dtype_is_the_devices_own_or_auto_and_anything_else_is_refused() {
    for (device, own) in [("cpu", "float32"), ("cuda", "bfloat16")] {
        for dtype in ["auto", own] {
            let config = from_file("", &["--device", device, "--dtype", dtype]).expect("loads");
            assert_eq!(config.dtype.as_str(), dtype);
        }
        for dtype in ["float16", "bfloat16", "float32"]
            .into_iter()
            .filter(|d| *d != own)
        {
            let err = from_file("", &["--device", device, "--dtype", dtype])
                .expect_err("refused")
                .to_string();
            assert!(
                err.contains("--dtype") && err.contains(dtype) && err.contains(own),
                "{err}"
            );
        }
    }
    let err = error("dtype = \"float16\"");
    assert!(err.contains("config.toml: dtype"), "{err}");
}

#[test]
fn every_setting_has_its_flag_on_the_command_line() {
    let command = Serve::command();
    let longs: Vec<String> = command
        .get_arguments()
        .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
        .collect();
    let config = ServeConfig::default();
    for field in config.fields() {
        let flag = settings::flag_of(field.name).expect("every setting names its flag");
        if flag.starts_with("--") {
            assert!(longs.iter().any(|l| l == flag), "{}: {flag}", field.name);
        } else {
            assert_eq!(field.name, "default_sampling", "only a table has no flag");
        }
    }
    assert_eq!(
        longs.len(),
        config.fields().len(),
        "--config and one flag a setting, less one"
    );
}

#[test]
fn front_door_settings_load_and_bad_ones_name_their_field() {
    let config = from_file(
        "max_request_body = \"2MiB\"\nallowed_origins = [\"https://app.example.com\"]",
        &[
            "--request-body-timeout",
            "3",
            "--allowed-origins",
            "http://localhost:3000,*",
            "--allowed-hosts",
            "api.example.com,[fd00::1],*",
            "--max-prompt-chars",
            "1000",
        ],
    )
    .expect("loads");
    assert_eq!(config.max_request_body, 2 << 20);
    assert_eq!(
        config.request_body_timeout,
        std::time::Duration::from_secs(3)
    );
    assert_eq!(config.allowed_origins, ["http://localhost:3000", "*"]);
    assert_eq!(config.allowed_hosts, ["api.example.com", "[fd00::1]", "*"]);
    assert_eq!(config.max_prompt_chars, Some(1000));
    for (flags, needle) in [
        (
            &["--allowed-origins", "localhost:3000"][..],
            "--allowed-origins must hold origins",
        ),
        (
            &["--allowed-origins", "https://a.com/path"][..],
            "--allowed-origins must hold origins",
        ),
        (
            &["--allowed-hosts", "http://api.example.com"][..],
            "--allowed-hosts must hold host names",
        ),
        (
            &["--allowed-hosts", "api.example.com:8000"][..],
            "--allowed-hosts must hold host names",
        ),
        (
            &["--request-header-timeout", "0"][..],
            "--request-header-timeout must be at least 1 second",
        ),
        (
            &["--max-connections", "0"][..],
            "--max-connections must be at least 1",
        ),
        (
            &["--max-num-seqs", "4096"][..],
            "must not exceed max_num_batched_tokens (2048)",
        ),
    ] {
        let message = from_file("", flags).expect_err("refused").to_string();
        assert!(message.contains(needle), "{flags:?}: {message}");
    }
}

#[test]
fn kv_events_come_from_vllm_s_flag_or_a_table_and_are_checked_by_field() {
    let flag = from_file(
        "",
        &[
            "--kv-events-config",
            r#"{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000", "topic": "kv"}"#,
        ],
    )
    .expect("loads");
    let events = flag.kv_events_config.expect("set");
    assert!(events.publishes());
    assert_eq!(
        (events.endpoint.as_str(), events.topic.as_str()),
        ("tcp://*:6000", "kv")
    );
    let table = file(
        "[kv_events_config]\nenable_kv_cache_events = true\nreplay_endpoint = \"tcp://*:6001\"",
    );
    let events = table.kv_events_config.expect("set");
    assert_eq!(events.replay_endpoint.as_deref(), Some("tcp://*:6001"));
    assert_eq!(events.endpoint, "tcp://*:5557");
    let refused = error("[kv_events_config]\nhwm = 5");
    assert!(refused.contains("kv_events_config.hwm"), "{refused}");
    assert!(Serve::try_parse_from(["serve", "--kv-events-config", "{\"hwm\": \"x\"}"]).is_err());
}
