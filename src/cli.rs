//! Command-line arguments, with flag names following vLLM's where vLLM has the same thing.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Peregrine: an LLM serving runtime with a paged KV cache and speculative decoding.
#[derive(Parser, Debug)]
#[command(name = "peregrine", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log level (error, warn, info, debug, trace); `serve` defaults to its configuration's
    /// (info), the other commands to warn.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text for one prompt and print the prompt and decode speeds.
    #[command(allow_negative_numbers = true)]
    Generate(Box<GenerateArgs>),
    /// Download a known model and convert it into the cache.
    Fetch(FetchArgs),
    /// Convert a GGUF file into a Hugging Face model directory.
    Convert(ConvertArgs),
    /// Serve a model over an OpenAI-compatible HTTP API.
    // A negative value (`--kv-cache-memory -5`) is a value, refused by its check, not a flag.
    #[command(allow_negative_numbers = true)]
    Serve(Box<peregrine_config::ServeArgs>),
    /// The model's perplexity on a text, computed as llama.cpp's `llama-perplexity` does.
    Perplexity(PerplexityArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// `peregrine bench ...`.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Load a running server with concurrent streaming requests, as `vllm bench serve` does.
    #[command(allow_negative_numbers = true)]
    Serve(BenchServeArgs),
    /// Time prefill and decode of a model offline (no HTTP), as `vllm bench latency` does.
    Latency(BenchLatencyArgs),
    /// Greedy requests through the engine on the CPU without and with speculative
    /// decoding: speedup, acceptance, tokens per forward, identical outputs.
    #[command(allow_negative_numbers = true)]
    Spec(BenchSpecArgs),
    /// Waves of one prompt against a running server, then one request alone: per wave the
    /// largest KV block id in use, per-position acceptance, tokens per verification,
    /// whether every output equals wave 1's, and the acceptance alarm.
    Soak(BenchSoakArgs),
}

/// `peregrine bench soak`.
#[derive(Args, Debug)]
pub struct BenchSoakArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// The model name to send (default: the first one `GET /v1/models` lists).
    #[arg(long)]
    pub model: Option<String>,
    /// The prompt every request sends.
    #[arg(
        long,
        default_value = "Write a long story about a lighthouse keeper who finds a message in a \
                         bottle, with every character's name and the weather of each day."
    )]
    pub prompt: String,
    /// Waves of concurrent requests.
    #[arg(long, default_value_t = 25)]
    pub waves: usize,
    /// Requests per wave, all at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Tokens each request generates (sent with ignore_eos).
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// How often `/metrics` is polled while a wave runs, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub poll_ms: u64,
    /// An API key to send as a Bearer token.
    #[arg(long, env = "OPENAI_API_KEY")]
    pub api_key: Option<String>,
}

/// `peregrine bench spec`.
#[derive(Args, Debug)]
pub struct BenchSpecArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// How drafts are proposed.
    #[arg(long, default_value = "ngram")]
    pub speculative_method: peregrine_config::SpeculativeMethod,
    /// The draft model directory, for draft_model; the EAGLE-3 head's, for eagle3 (with
    /// the default model: the head shipped for it).
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Drafts per request and step.
    #[arg(long, default_value_t = 3)]
    pub num_speculative_tokens: usize,
    /// Always plan --num-speculative-tokens drafts, as `serve --no-speculative-adaptive`
    /// does; by default fewer or none where drafting measures as not paying.
    #[arg(long)]
    pub no_speculative_adaptive: bool,
    /// Sampling temperature of every request (request i seeded with i); 0 is greedy, whose
    /// outputs must not change with drafts. An EAGLE-3 head samples a sampled request's
    /// drafts at this temperature.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// The shortest suffix the n-gram method matches.
    #[arg(long, default_value_t = 2)]
    pub ngram_min: usize,
    /// The longest suffix the n-gram method matches.
    #[arg(long, default_value_t = 4)]
    pub ngram_max: usize,
    /// How many requests.
    #[arg(long, default_value_t = 16)]
    pub num_prompts: usize,
    /// Requests running at once (max_num_seqs).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Tokens per step (max_num_batched_tokens).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Prompt length in words of the random prompts.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Tokens to generate per request (random prompts ignore EOS).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// A JSONL file of {"prompt": ..., "max_tokens"?: ..., "ignore_eos"?: ...} lines instead
    /// of random prompts.
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Seed for the random prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Bytes of KV cache (CPU).
    #[arg(long, default_value_t = 1 << 30)]
    pub kv_cache_memory: u64,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Where the target model runs: cpu, or cuda (a binary built with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The share of GPU memory for the weights, activations and KV pool (cuda).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f32,
    /// Batch-invariant GPU kernels (cuda).
    #[arg(long)]
    pub deterministic: bool,
    /// Decode steps run eagerly rather than through graphs (captured for 1, 2, 4, 8 and
    /// every multiple of 8 up to --concurrency, in both runs).
    #[arg(long)]
    pub enforce_eager: bool,
    /// No decode step is queued before the step ahead of it is read (as `serve
    /// --no-async-scheduling`; on by default on the GPU, in both runs).
    #[arg(long)]
    pub no_async_scheduling: bool,
    /// Writes every run's outputs to this file, a JSON line each request ({"run": "without"
    /// or "with", "round", "request", "tokens"}), to find where greedy outputs part.
    #[arg(long)]
    pub outputs: Option<PathBuf>,
    /// Runs of each kind, in the order without, with, with, without, ... (so that a
    /// machine whose speed drifts during the benchmark weighs on both alike); the times
    /// are summed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
}

/// `peregrine bench latency`.
#[derive(Args, Debug)]
pub struct BenchLatencyArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Random weights of this config.json's shapes, made on the GPU, instead of a checkpoint.
    #[arg(long, conflicts_with = "model")]
    pub random_weights: Option<PathBuf>,
    /// cpu, or cuda (with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Batch sizes to time, each one sequence per request.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub batch_sizes: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Decode steps timed.
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// The CPU KV cache's element: float32, or bfloat16 (half the bytes) [default: as
    /// `serve` chooses it]. The GPU's cache is bfloat16.
    #[arg(long, value_name = "DTYPE")]
    pub kv_cache_dtype: Option<peregrine_config::DtypeChoice>,
    /// Batch-invariant GPU kernels.
    #[arg(long)]
    pub deterministic: bool,
    /// GPU products of up to this many rows use the fixed-order GEMV kernel of
    /// --deterministic mode, larger ones cuBLAS (0: cuBLAS for all; default: the model's,
    /// as `serve` chooses it from the hidden size).
    #[arg(long)]
    pub gemv_max_rows: Option<usize>,
    /// Also time verification steps of this many rows per sequence (the last token and
    /// N - 1 drafts, every row a logit row), beside one-row decode steps of the same batch
    /// and at the same contexts (each step keeps one row, as if no draft were accepted: the
    /// next step writes over the others' keys and values); on the GPU through verification
    /// graphs. 1: decode steps only.
    #[arg(long, default_value_t = 1)]
    pub verify_rows: usize,
    /// Also time, on the GPU, a drafting round of the model's multi-token prediction layer
    /// (its checkpoint's, or random with --random-weights) of this many drafts a sequence:
    /// step 0 over each sequence's --verify-rows rows, then the chained steps, through the
    /// layer's graphs. 0: none.
    #[arg(long, default_value_t = 0)]
    pub mtp_drafts: usize,
    /// GPU decode steps run eagerly rather than through CUDA graphs (captured, one per batch
    /// size timed, for contexts up to --max-seq-len-to-capture).
    #[arg(long)]
    pub enforce_eager: bool,
    /// The longest context a CUDA graph serves; longer decode steps run eagerly.
    #[arg(long, default_value_t = 8192)]
    pub max_seq_len_to_capture: usize,
    /// GPU kernels start only when the one before has finished, rather than overlapping
    /// its tail through programmatic dependent launch (the baseline it is measured against).
    #[arg(long)]
    pub no_programmatic_launch: bool,
    /// GPU kernels that have a tensor-core path (prefill attention) run their CUDA-core
    /// path instead, as on a device without tensor cores (the baseline the tensor-core
    /// kernels are measured against).
    #[arg(long)]
    pub no_tensor_cores: bool,
}

/// `peregrine bench serve`.
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// The model name to send (default: the first one `GET /v1/models` lists).
    #[arg(long)]
    pub model: Option<String>,
    /// How many requests to send.
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// How many requests are in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Prompt length in tokens of the random prompts.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Tokens to generate per request (sent as max_tokens with ignore_eos).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// A JSONL file of {"prompt" or "messages", "max_tokens"?, "ignore_eos"?} lines instead
    /// of random prompts; a line may also set "temperature" (default 0) and the fields that
    /// constrain the output ("response_format", "tools", "tool_choice",
    /// "parallel_tool_calls", "structured_outputs", "guided_json", "guided_regex",
    /// "guided_choice", "guided_grammar", "json_schema", "grammar"), sent as given. Lines
    /// with "messages" or "tools" go to /v1/chat/completions.
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Seed for the random prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Choices per request (OpenAI's `n`): each request asks for this many completions of
    /// its prompt, and its output tokens are all of theirs.
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub result_file: Option<PathBuf>,
    /// An API key to send as a Bearer token.
    #[arg(long, env = "OPENAI_API_KEY")]
    pub api_key: Option<String>,
}

/// Where models are found.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A Hugging Face model directory or a GGUF file; the default model (smollm2-135m)
    /// when absent, fetched on first use.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The model cache (default: $PEREGRINE_CACHE, else $XDG_CACHE_HOME/peregrine).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

/// `peregrine generate`: one request through the engine `serve` runs, configured by the
/// same settings (flags and `--config` file), less the ones only a server has.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: peregrine_config::ServeArgs,
    /// The prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 picks the most likely token (greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0 or -1: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches p.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalise tokens already in the prompt or output (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token already generated.
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtracted per occurrence of a token already generated.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed of the request's sampler; random when absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Generate max_tokens even past the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
}

/// `peregrine perplexity`: llama-perplexity's default method (chunks of --ctx-size tokens,
/// each scored on its second half) on the CPU.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score (one trailing newline is dropped, as llama.cpp's `-f` does).
    #[arg(long, short = 'f')]
    pub file: PathBuf,
    /// Tokens per chunk (llama.cpp's `-c`); each chunk's tokens from ctx-size/2 + 1 on are
    /// scored.
    #[arg(long, short = 'c', default_value_t = 512)]
    pub ctx_size: usize,
    /// Score only the first N chunks (default: every whole chunk of the text).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Rows per forward; a longer chunk is prefilled in pieces (llama.cpp's `-b`).
    #[arg(long, short = 'b', default_value_t = 2048)]
    pub batch_size: usize,
    /// The KV cache's element: float32 or bfloat16 [default: as `serve` chooses it].
    #[arg(long, value_name = "DTYPE")]
    pub kv_cache_dtype: Option<peregrine_config::DtypeChoice>,
}

/// `peregrine fetch`.
#[derive(Args, Debug)]
pub struct FetchArgs {
    /// The model's name (known: smollm2-135m).
    pub name: String,
    /// The model cache (default: $PEREGRINE_CACHE, else $XDG_CACHE_HOME/peregrine).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

/// `peregrine convert`.
#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The GGUF file to read.
    pub gguf: PathBuf,
    /// The Hugging Face directory to write.
    pub out_dir: PathBuf,
}
