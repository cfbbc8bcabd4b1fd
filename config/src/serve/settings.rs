//! Every setting of `peregrine serve`, declared once. A row says, in order: the setting's
//! doc, its key (the TOML key) and type, its default; the type the file and the flag give
//! and how that fills the setting; whether it reloads live; whether `GET /admin/config`
//! hides it; the check its given value passes; its flag and the flag's clap arguments
//! (with its help, which states the default); serde arguments where the file's format
//! needs them. `table.rs` turns the rows into `Layer` and `ServeConfig`.

use super::checks::{
    any, at_least_one, batch_sizes, block_size, fraction, hosts, keys_not_empty, kv_events,
    log_filter, origins, path_not_empty, positive_bytes, positive_seconds, sampling,
    speculative_tokens, text_not_empty,
};
use super::fields::{Field, Reload};
use super::json::ToJson;
use super::table::{settings, Secrecy};
use super::{
    ConfigError, DeviceKind, DtypeChoice, KvEventsConfig, Origin, SamplingDefaults,
    SpeculativeMethod, ToolCallParser,
};
use crate::parse_byte_size;
use std::path::PathBuf;
use std::time::Duration;

settings! {
    /// The model directory or GGUF file; `None` serves the default model.
    model: Option<PathBuf> = None;
        given PathBuf, fill optional, reload Restart, Public, check path_not_empty,
        flag "--model", arg(long, value_name = "DIR|FILE.gguf",
            help = "A Hugging Face model directory or a GGUF file (run as it is stored) \
                    [default: smollm2-135m, fetched on first use]");
    /// The model name clients send; `None` uses the model's own name.
    served_model_name: Option<String> = None;
        given String, fill optional, reload Restart, Public, check text_not_empty,
        flag "--served-model-name", arg(long,
            help = "The model name clients send [default: the model's name]");
    /// The address to listen on.
    host: String = "127.0.0.1".to_string();
        given String, fill value, reload Restart, Public, check text_not_empty,
        flag "--host", arg(long, help = "The address to listen on [default: 127.0.0.1]");
    /// The port to listen on; 0 picks a free one.
    port: u16 = 8000;
        given u16, fill value, reload Restart, Public, check any,
        flag "--port", arg(long, help = "The port to listen on; 0 picks a free one [default: 8000]");
    /// Bearer tokens clients may send; empty means no authentication.
    api_keys: Vec<String> = Vec::new();
        given Vec<String>, fill value, reload Live, Secret, check keys_not_empty,
        flag "--api-key", arg(long = "api-key", value_name = "KEY",
            help = "A key clients must send as `Authorization: Bearer KEY`; repeat for several");
    /// The token the admin endpoints require; `None` turns them off.
    admin_token: Option<String> = None;
        given String, fill optional, reload Live, Secret, check text_not_empty,
        flag "--admin-token", arg(long, value_name = "TOKEN",
            help = "The token `/admin/*` endpoints require [default: admin endpoints off]");
    /// The device to run on.
    device: DeviceKind = DeviceKind::Cpu;
        given DeviceKind, fill value, reload Restart, Public, check any,
        flag "--device", arg(long, help = "The device to run on [default: cpu]");
    /// Ranks the model is split over by tensor parallelism (vLLM's flag); only 1 runs:
    /// a larger size is checked against the model and refused, as the multi-GPU runners
    /// are not built.
    tensor_parallel_size: usize = 1;
        given usize, fill value, reload Restart, Public, check at_least_one,
        flag "--tensor-parallel-size", arg(long, value_name = "N",
            help = "GPUs to split the model over by tensor parallelism; only 1 is built: \
                    a larger size is checked against the model, then refused [default: 1]");
    /// The compute dtype: `auto`, or the device's own ([`DeviceKind::compute_dtype`]).
    dtype: DtypeChoice = DtypeChoice::Auto;
        given DtypeChoice, fill value, reload Restart, Public, check any,
        flag "--dtype", arg(long, help = "The compute dtype: auto, or the device's own \
            (float32 on the CPU, bfloat16 on the GPU) [default: auto]");
    /// The most sequences in one step.
    max_num_seqs: usize = 64;
        given usize, fill value, reload Live, Public, check at_least_one,
        flag "--max-num-seqs", arg(long, value_name = "N",
            help = "The most sequences in one step [default: 64]");
    /// The most tokens in one step.
    max_num_batched_tokens: usize = 2048;
        given usize, fill value, reload Live, Public, check at_least_one,
        flag "--max-num-batched-tokens", arg(long, value_name = "N",
            help = "The most tokens in one step [default: 2048]");
    /// The longest prompt plus output; `None` uses the model's context length.
    max_model_len: Option<usize> = None;
        given usize, fill optional, reload Restart, Public, check at_least_one,
        flag "--max-model-len", arg(long, value_name = "N",
            help = "The longest prompt plus output [default: the model's context length]");
    /// Tokens per KV cache block.
    block_size: usize = 16;
        given usize, fill value, reload Restart, Public, check block_size,
        flag "--block-size", arg(long, value_name = "N",
            help = "Tokens per KV cache block, a power of two up to 256 [default: 16]");
    /// Bytes the KV cache takes; `None` sizes it: on the CPU from the model (see
    /// `CpuFootprint::default_kv_cache_memory` in the actors crate), on the GPU all that
    /// `gpu_memory_utilization` leaves (which a larger value exceeds, refused).
    kv_cache_memory: Option<u64> = None;
        given u64, fill optional, reload Restart, Public, check positive_bytes,
        flag "--kv-cache-memory", arg(long, value_name = "BYTES", value_parser = parse_byte_size,
            alias = "kv-cache-memory-bytes",
            help = "Memory for the KV cache: 1073741824, 512MiB, 2GiB, 1.5GB... [default: on \
                    the CPU room for one sequence of max_model_len tokens, or for four steps \
                    of max_num_batched_tokens if that is more, at most a quarter of the memory \
                    available; on the GPU what --gpu-memory-utilization leaves]"),
        serde(default, deserialize_with = "crate::byte_size::deserialize_byte_size");
    /// Bytes of host memory below the KV pool (page-locked on the GPU) for prefix-cache
    /// blocks the pool reuses: they move there instead of being dropped, and come back when
    /// a request's prefix continues in them; `None`: no such tier.
    kv_host_memory: Option<u64> = None;
        given u64, fill optional, reload Restart, Public, check positive_bytes,
        flag "--kv-host-memory", arg(long, value_name = "BYTES", value_parser = parse_byte_size,
            help = "Host memory for prefix-cache blocks the KV pool evicts (a tier below it, \
                    page-locked on the GPU): 2GiB, 512MiB... [default: none, evicted blocks \
                    are dropped]"),
        serde(default, deserialize_with = "crate::byte_size::deserialize_byte_size");
    /// A directory for a disk tier of prefix-cache blocks below the CPU's KV pool (and its
    /// host tier): blocks leaving memory are written there, read back, checked, when a
    /// request's prefix continues in them, and found again after a restart (one file per
    /// model and KV layout, locked by the process using it); `None`: no such tier.
    kv_cache_dir: Option<PathBuf> = None;
        given PathBuf, fill optional, reload Restart, Public, check path_not_empty,
        flag "--kv-cache-dir", arg(long, value_name = "DIR",
            help = "A directory for prefix-cache blocks leaving memory, kept across \
                    restarts (a tier below the KV pool and --kv-host-memory, CPU only) \
                    [default: no disk tier]");
    /// Bytes of disk the tier under `kv_cache_dir` may take; `None`: 10 GiB.
    kv_disk_space: Option<u64> = None;
        given u64, fill optional, reload Restart, Public, check positive_bytes,
        flag "--kv-disk-space", arg(long, value_name = "BYTES", value_parser = parse_byte_size,
            help = "Disk the --kv-cache-dir tier may take: 10GiB, 500GB... [default: 10 GiB]"),
        serde(default, deserialize_with = "crate::byte_size::deserialize_byte_size");
    /// The KV cache's element: `auto` (bfloat16), `bfloat16`, or `float32` (the CPU only:
    /// twice the memory, slower decode steps).
    kv_cache_dtype: DtypeChoice = DtypeChoice::Auto;
        given DtypeChoice, fill value, reload Restart, Public, check any,
        flag "--kv-cache-dtype", arg(long, value_name = "DTYPE",
            help = "The KV cache's element: auto (bfloat16), bfloat16, or float32 (the CPU \
                    only: twice the memory) [default: auto]");
    /// The fraction of GPU memory the server may use.
    gpu_memory_utilization: f32 = 0.9;
        given f32, fill value, reload Restart, Public, check fraction,
        flag "--gpu-memory-utilization", arg(long, value_name = "FRACTION",
            help = "The fraction of GPU memory Peregrine may use, in (0, 1] [default: 0.9]");
    /// Whether full KV blocks are shared between requests with the same prefix.
    enable_prefix_caching: bool = true;
        given bool, fill value, reload Restart, Public, check any,
        flag "--no-prefix-caching", arg(long = "no-prefix-caching", num_args = 0,
            alias = "no-enable-prefix-caching", default_missing_value = "false",
            help = "Turn prefix caching off (it is on by default; vLLM's \
                    --no-enable-prefix-caching also does)");
    /// Publishing KV-cache events for prefix-aware routers (vLLM's `--kv-events-config`);
    /// `None`: no events.
    kv_events_config: Option<KvEventsConfig> = None;
        given KvEventsConfig, fill optional, reload Restart, Public, check kv_events,
        flag "--kv-events-config", arg(long, value_name = "JSON",
            value_parser = KvEventsConfig::from_json,
            help = "Publish KV-cache events over ZeroMQ in vLLM's format, as vLLM's flag: \
                    '{\"enable_kv_cache_events\": true, \"endpoint\": \"tcp://*:5557\", \
                    \"replay_endpoint\": \"tcp://*:5558\", \"topic\": \"kv-events\"}' \
                    (docs/routers.md) [default: no events]");
    /// Batch-invariant GPU kernels.
    deterministic: bool = false;
        given bool, fill value, reload Restart, Public, check any,
        flag "--deterministic", arg(long, num_args = 0, default_missing_value = "true",
            help = "Batch-invariant GPU kernels: a request's tokens do not depend on the \
                    rest of the batch (the CPU backend always is)");
    /// Run every step eagerly, capturing no graphs.
    enforce_eager: bool = false;
        given bool, fill value, reload Live, Public, check any,
        flag "--enforce-eager", arg(long, num_args = 0, default_missing_value = "true",
            help = "Run every step eagerly: capture no graphs");
    /// On a GPU, each greedy decode step queues the step after it before its tokens reach
    /// the host (vLLM's async scheduling); ignored with speculative decoding.
    async_scheduling: bool = true;
        given bool, fill value, reload Restart, Public, check any,
        flag "--no-async-scheduling", arg(long = "no-async-scheduling", num_args = 0,
            default_missing_value = "false",
            help = "Turn async scheduling off: on a GPU, a greedy decode step otherwise \
                    queues the step after it before its tokens reach the host (vLLM's async \
                    scheduling)");
    /// With async scheduling, a greedy batch holding constrained requests also queues its
    /// next step, their rows' argmax masked on the device.
    async_scheduling_constrained: bool = false;
        given bool, fill value, reload Restart, Public, check any,
        flag "--async-scheduling-constrained", arg(long = "async-scheduling-constrained",
            num_args = 0, default_missing_value = "true",
            help = "With async scheduling, also queue ahead the next step of a greedy batch \
                    holding structured-output requests, their masks applied on the device \
                    (off: it measured slower; such a batch runs a step at a time)");
    /// The batch sizes graphs are captured for; `None`: 1, 2, 4, 8 and every multiple of 8
    /// up to `max_num_seqs` and 512 (captured again when a reload changes it). Each size is at most
    /// `max_num_seqs`: a configuration with a larger one is refused.
    cudagraph_sizes: Option<Vec<usize>> = None;
        given Vec<usize>, fill optional, reload Live, Public, check batch_sizes,
        flag "--cudagraph-sizes", arg(long, value_name = "1,2,4,...", value_delimiter = ',',
            help = "Batch sizes to capture graphs for, each from 1 to max_num_seqs \
                    [default: 1,2,4,8 and every multiple of 8 up to max_num_seqs, at most 512]");
    /// Requests that may wait for a slot before new ones are refused with 429.
    max_waiting_requests: usize = 1024;
        given usize, fill value, reload Live, Public, check at_least_one,
        flag "--max-waiting-requests", arg(long, value_name = "N",
            help = "Requests that may wait for a slot before new ones get 429 [default: 1024]");
    /// Browser origins (CORS) that may call the API; empty: a request that carries an
    /// `Origin` header is refused with 403, so no web page can make the server generate.
    allowed_origins: Vec<String> = Vec::new();
        given Vec<String>, fill value, reload Restart, Public, check origins,
        flag "--allowed-origins", arg(long = "allowed-origins", value_name = "ORIGIN",
            value_delimiter = ',',
            help = "Browser origins allowed to call the API (CORS), such as \
                    https://app.example.com, comma-separated or repeated; * allows any \
                    [default: none: requests with an Origin header get 403]");
    /// `Host` names served besides the loopback ones (`*`: any). A listener bound to a
    /// loopback address serves only `localhost`, `127.x.x.x` and `[::1]` without them (a
    /// defence against DNS rebinding); one bound to another address checks `Host` only
    /// when some are given.
    allowed_hosts: Vec<String> = Vec::new();
        given Vec<String>, fill value, reload Restart, Public, check hosts,
        flag "--allowed-hosts", arg(long = "allowed-hosts", value_name = "HOST",
            value_delimiter = ',',
            help = "Host header names served besides localhost, 127.x.x.x and [::1], such \
                    as api.example.com, comma-separated or repeated; * allows any \
                    [default: none: bound to loopback, another Host gets 403; bound \
                    elsewhere, Host is not checked]");
    /// How long a client has to send a request's headers (else 408 and the connection
    /// closes); also how long an idle keep-alive connection stays open.
    request_header_timeout: Duration = Duration::from_secs(5);
        given u64, fill seconds, reload Restart, Public, check positive_seconds,
        flag "--request-header-timeout", arg(long, value_name = "SECONDS",
            help = "Seconds a client has to send a request's headers; also how long an idle \
                    connection stays open [default: 5]");
    /// How long a client has to send a request's body once its headers arrived (else 408
    /// and the connection closes).
    request_body_timeout: Duration = Duration::from_secs(30);
        given u64, fill seconds, reload Live, Public, check positive_seconds,
        flag "--request-body-timeout", arg(long, value_name = "SECONDS",
            help = "Seconds a client has to send a request's body [default: 30]");
    /// The most client connections open at once; `None`: what the process's open-file
    /// limit holds after a reserve for the server's own files, at two files a connection.
    max_connections: Option<usize> = None;
        given usize, fill optional, reload Restart, Public, check at_least_one,
        flag "--max-connections", arg(long, value_name = "N",
            help = "The most client connections open at once; more wait to be accepted \
                    [default: half of the open-file limit less 256]");
    /// The largest request body accepted (else 413).
    max_request_body: u64 = 16 << 20;
        given u64, fill value, reload Live, Public, check positive_bytes,
        flag "--max-request-body", arg(long, value_name = "BYTES", value_parser = parse_byte_size,
            help = "The largest request body; larger ones get 413 [default: 16MiB]"),
        serde(default, deserialize_with = "crate::byte_size::deserialize_byte_size");
    /// The longest prompt in characters, checked before it is tokenized (else 413);
    /// `None`: 32 characters per token of `max_model_len`.
    max_prompt_chars: Option<usize> = None;
        given usize, fill optional, reload Live, Public, check at_least_one,
        flag "--max-prompt-chars", arg(long, value_name = "N",
            help = "The longest prompt in characters, checked before tokenizing; longer \
                    ones get 413 [default: 32 per token of max_model_len]");
    /// How long in-flight requests get to finish at shutdown.
    shutdown_timeout: Duration = Duration::from_secs(30);
        given u64, fill seconds, reload Live, Public, check any,
        flag "--shutdown-timeout", arg(long, value_name = "SECONDS",
            help = "Seconds in-flight requests get to finish at shutdown [default: 30]");
    /// The tracing filter: a level or directives such as `info,peregrine=debug`.
    log_level: String = "info".to_string();
        given String, fill value, reload Live, Public, check log_filter,
        flag "--log-level", arg(long, value_name = "LEVEL",
            help = "error, warn, info, debug, trace, or a filter like \"info,peregrine=debug\" \
                    [default: info]");
    /// The model cache; `None` uses `$PEREGRINE_CACHE`, else `$XDG_CACHE_HOME/peregrine`.
    cache_dir: Option<PathBuf> = None;
        given PathBuf, fill optional, reload Restart, Public, check path_not_empty,
        flag "--cache-dir", arg(long, value_name = "DIR",
            help = "The model cache [default: $PEREGRINE_CACHE, else $XDG_CACHE_HOME/peregrine]");
    /// Sampling parameters for requests that leave them out (the file's
    /// `[default_sampling]` table; no flag).
    default_sampling: SamplingDefaults = SamplingDefaults::default();
        given SamplingDefaults, fill value, reload Live, Public, check sampling,
        flag "[default_sampling]", arg(skip);
    /// How drafts are proposed; `None` turns speculative decoding off.
    speculative_method: Option<SpeculativeMethod> = None;
        given SpeculativeMethod, fill optional, reload Restart, Public, check any,
        flag "--speculative-method", arg(long, value_name = "METHOD",
            help = "Speculative decoding: how drafts are proposed [default: no speculation]");
    /// The draft model's directory, for `draft_model`; the EAGLE-3 head's, for `eagle3`
    /// (`None` with the default model: the head shipped for it).
    draft_model: Option<PathBuf> = None;
        given PathBuf, fill optional, reload Restart, Public, check path_not_empty,
        flag "--draft-model", arg(long, value_name = "DIR",
            help = "The draft model directory, for --speculative-method draft_model; the \
                    EAGLE-3 head's, for eagle3 [default for eagle3 with the default model: \
                    the head shipped for it]");
    /// The most draft tokens verified per request and step.
    num_speculative_tokens: usize = 3;
        given usize, fill value, reload Live, Public, check speculative_tokens,
        flag "--num-speculative-tokens", arg(long, value_name = "K",
            help = "The most draft tokens verified per request and step, 1 to 16 [default: 3]");
    /// Plan fewer drafts, or none, at the batch sizes where measured step costs and
    /// acceptance say drafting does not pay; `false` always plans
    /// `num_speculative_tokens`.
    speculative_adaptive: bool = true;
        given bool, fill value, reload Live, Public, check any,
        flag "--no-speculative-adaptive", arg(long = "no-speculative-adaptive", num_args = 0,
            default_missing_value = "false",
            help = "Always plan --num-speculative-tokens drafts; by default the scheduler \
                    plans fewer, or none, at the batch sizes where measured step costs and \
                    acceptance say drafting does not pay");
    /// Let requests with `tools` leave the choice to the model (`tool_choice: "auto"`, the
    /// default when tools are sent), its calls parsed from its output (vLLM's flag).
    enable_auto_tool_choice: bool = false;
        given bool, fill value, reload Restart, Public, check any,
        flag "--enable-auto-tool-choice", arg(long = "enable-auto-tool-choice", num_args = 0,
            default_missing_value = "true",
            help = "Let requests with tools leave the choice of calling one to the model                     (tool_choice \"auto\"); without it only \"none\", \"required\" and a                     named function are served");
    /// The format the model writes tool calls in; `None`: the one its chat template
    /// uses, else `hermes`.
    tool_call_parser: Option<ToolCallParser> = None;
        given ToolCallParser, fill optional, reload Restart, Public, check any,
        flag "--tool-call-parser", arg(long, value_name = "NAME",
            help = "The format the model writes tool calls in: hermes, llama3_json, mistral                     or deepseek_v3 [default: the chat template's, else hermes]");
    /// The largest constraint (JSON schema, regular expression, grammar) compiled, in bytes.
    max_grammar_bytes: u64 = 1 << 20;
        given u64, fill value, reload Restart, Public, check positive_bytes,
        flag "--max-grammar-bytes", arg(long, value_name = "BYTES", value_parser = parse_byte_size,
            help = "The largest JSON schema, regular expression or grammar a request may                     constrain its output with [default: 1MiB]"),
        serde(default, deserialize_with = "crate::byte_size::deserialize_byte_size");
    /// How long compiling one constraint may take (else 400).
    grammar_compile_timeout: Duration = Duration::from_secs(10);
        given u64, fill seconds, reload Restart, Public, check positive_seconds,
        flag "--grammar-compile-timeout", arg(long, value_name = "SECONDS",
            help = "Seconds compiling one request's constraint may take; slower ones get 400 \
                    [default: 10]");
    /// How many compiled constraints are kept for requests that send them again.
    grammar_cache_entries: usize = 256;
        given usize, fill value, reload Restart, Public, check at_least_one,
        flag "--grammar-cache-entries", arg(long, value_name = "N",
            help = "How many compiled constraints are cached for requests that send the same                     one again [default: 256]");
    /// The shortest suffix the n-gram method matches.
    ngram_min: usize = 2;
        given usize, fill value, reload Restart, Public, check at_least_one,
        flag "--ngram-min", arg(long, value_name = "N",
            help = "The shortest suffix the n-gram method matches [default: 2]");
    /// The longest suffix the n-gram method matches.
    ngram_max: usize = 4;
        given usize, fill value, reload Restart, Public, check at_least_one,
        flag "--ngram-max", arg(long, value_name = "N",
            help = "The longest suffix the n-gram method matches [default: 4]");
}
