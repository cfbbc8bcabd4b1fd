//! The engine's Prometheus metrics, named as vLLM's with the `peregrine:` prefix, recorded
//! through the `metrics` facade (the serve command installs the Prometheus exporter).

pub mod vllm;

use crate::messages::{AheadUse, FinishReason, KvUsage};
use metrics::{counter, gauge, histogram};
use std::time::Duration;

/// Requests running (holding KV blocks).
pub const NUM_REQUESTS_RUNNING: &str = "peregrine:num_requests_running";
/// Requests waiting to start.
pub const NUM_REQUESTS_WAITING: &str = "peregrine:num_requests_waiting";
/// Fraction of KV blocks owned by requests (0..1).
pub const KV_CACHE_USAGE_PERC: &str = "peregrine:kv_cache_usage_perc";
/// The largest KV block id owned by a request; -1 when none is.
pub const KV_BLOCK_ID_MAX: &str = "peregrine:kv_block_id_max";
/// Prompt tokens looked up in the prefix cache.
pub const PREFIX_CACHE_QUERIES: &str = "peregrine:prefix_cache_queries_total";
/// Prompt tokens found in the prefix cache.
pub const PREFIX_CACHE_HITS: &str = "peregrine:prefix_cache_hits_total";
/// Gauge: blocks holding a prefix-cache entry (owned by a request or free, kept until
/// reused); what a subscriber to the KV-cache events holds as stored and not removed.
pub const PREFIX_CACHE_BLOCKS: &str = "peregrine:prefix_cache_blocks";
/// Gauge: prefix-cache blocks held in the host tier below the pool (`kv_host_memory`).
pub const KV_HOST_BLOCKS: &str = "peregrine:kv_host_blocks";
/// Blocks copied from the pool down to the host tier (instead of dropped).
pub const KV_HOST_SPILLED: &str = "peregrine:kv_host_spilled_blocks_total";
/// Blocks copied back from the host tier into the pool (a prompt's prefix found there).
pub const KV_HOST_LOADED: &str = "peregrine:kv_host_loaded_blocks_total";
/// Blocks dropped from the host tier (full: its least recently spilled chain ends go).
pub const KV_HOST_DROPPED: &str = "peregrine:kv_host_dropped_blocks_total";
/// Gauge: prefix-cache blocks held in the disk tier (`kv_cache_dir`), found at start-up
/// included.
pub const KV_DISK_BLOCKS: &str = "peregrine:kv_disk_blocks";
/// Blocks written to the disk tier as they left memory.
pub const KV_DISK_WRITTEN: &str = "peregrine:kv_disk_written_blocks_total";
/// Blocks read back from the disk tier into the pool (a prompt's prefix found there).
pub const KV_DISK_READ: &str = "peregrine:kv_disk_read_blocks_total";
/// Blocks dropped from the disk tier (full: its least recently used chain ends go).
pub const KV_DISK_DROPPED: &str = "peregrine:kv_disk_dropped_blocks_total";
/// Prompt blocks found in each tier (`tier`: `pool`, `host`, `disk`), cumulative.
pub const KV_HIT_BLOCKS: &str = "peregrine:kv_hit_blocks_total";
/// Gauge: bytes of keys and values held in the host tier (its blocks times a block's
/// bytes over every layer).
pub const KV_HOST_BYTES: &str = "peregrine:kv_host_bytes";
/// Gauge: bytes of keys and values held in the disk tier (its blocks times a block's
/// bytes over every layer; each record's header and page padding not counted).
pub const KV_DISK_BYTES: &str = "peregrine:kv_disk_bytes";
/// Batches of KV-cache events published.
pub const KV_EVENTS_PUBLISHED: &str = "peregrine:kv_events_published_total";
/// KV-cache events dropped because the publisher's queue was full (or it had stopped).
pub const KV_EVENTS_DROPPED: &str = "peregrine:kv_events_dropped_total";
/// Prompt tokens of finished requests.
pub const PROMPT_TOKENS: &str = "peregrine:prompt_tokens_total";
/// Generated tokens.
pub const GENERATION_TOKENS: &str = "peregrine:generation_tokens_total";
/// Finished requests, by `finished_reason`.
pub const REQUEST_SUCCESS: &str = "peregrine:request_success_total";
/// Preemptions (a running request's blocks taken back; it recomputes later).
pub const NUM_PREEMPTIONS: &str = "peregrine:num_preemptions_total";
/// Tokens that decode steps queued ahead gave (async scheduling: the runner queued the
/// step before the scheduler asked for it).
pub const DECODE_AHEAD_TOKENS: &str = "peregrine:decode_ahead_tokens_total";
/// Decode steps queued ahead that no sequence used (the batch changed): work thrown away.
pub const DECODE_AHEAD_DROPPED: &str = "peregrine:decode_ahead_dropped_total";
/// Seconds from arrival to the first generated token.
pub const TIME_TO_FIRST_TOKEN: &str = "peregrine:time_to_first_token_seconds";
/// Seconds between consecutive generated tokens.
pub const INTER_TOKEN_LATENCY: &str = "peregrine:inter_token_latency_seconds";
/// Seconds from arrival to the end of a request.
pub const E2E_REQUEST_LATENCY: &str = "peregrine:e2e_request_latency_seconds";
/// Seconds from arrival to the first step that ran the request.
pub const REQUEST_QUEUE_TIME: &str = "peregrine:request_queue_time_seconds";

/// Seconds a step spent copying blocks between the pool and the tiers below it (host
/// memory, disk) before its forward, the disk reads finished off its path included (not
/// the reads themselves, which the disk tier's thread makes); steps that copied nothing
/// are not counted.
pub const KV_TIER_COPY_SECONDS: &str = "peregrine:kv_tier_copy_seconds";

/// Every histogram's name, for configuring buckets in the exporter.
pub const HISTOGRAMS: [&str; 5] = [
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    E2E_REQUEST_LATENCY,
    REQUEST_QUEUE_TIME,
    KV_TIER_COPY_SECONDS,
];

/// Histogram buckets in seconds, from 1 ms to 5 minutes.
pub const LATENCY_BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 300.0,
];

/// A step's copies between the pool and its tiers took `elapsed`.
pub fn record_tier_copies(elapsed: Duration) {
    histogram!(KV_TIER_COPY_SECONDS).record(elapsed.as_secs_f64());
}

/// Queue lengths.
pub fn record_queues(running: usize, waiting: usize) {
    gauge!(NUM_REQUESTS_RUNNING).set(running as f64);
    gauge!(NUM_REQUESTS_WAITING).set(waiting as f64);
}

/// The pool's state after a step; `previous` holds the last cumulative prefix counts so
/// that the counters advance by the difference.
pub fn record_kv(usage: &KvUsage, previous: &mut KvUsage) {
    let frac = if usage.num_blocks == 0 {
        0.0
    } else {
        usage.used_blocks as f64 / usage.num_blocks as f64
    };
    gauge!(KV_CACHE_USAGE_PERC).set(frac);
    gauge!(KV_BLOCK_ID_MAX).set(usage.max_block_id_in_use.map_or(-1.0, f64::from));
    gauge!(PREFIX_CACHE_BLOCKS).set(usage.cached_blocks as f64);
    counter!(PREFIX_CACHE_QUERIES)
        .increment(usage.prefix_queries.saturating_sub(previous.prefix_queries));
    counter!(PREFIX_CACHE_HITS).increment(usage.prefix_hits.saturating_sub(previous.prefix_hits));
    gauge!(KV_HOST_BLOCKS).set(usage.host_blocks as f64);
    counter!(KV_HOST_SPILLED).increment(usage.host_spilled.saturating_sub(previous.host_spilled));
    counter!(KV_HOST_LOADED).increment(usage.host_loaded.saturating_sub(previous.host_loaded));
    counter!(KV_HOST_DROPPED).increment(usage.host_dropped.saturating_sub(previous.host_dropped));
    gauge!(KV_DISK_BLOCKS).set(usage.disk_blocks as f64);
    counter!(KV_DISK_WRITTEN).increment(usage.disk_written.saturating_sub(previous.disk_written));
    counter!(KV_DISK_READ).increment(usage.disk_read.saturating_sub(previous.disk_read));
    counter!(KV_DISK_DROPPED).increment(usage.disk_dropped.saturating_sub(previous.disk_dropped));
    for (tier, now, before) in [
        ("pool", usage.pool_hit_blocks, previous.pool_hit_blocks),
        ("host", usage.host_loaded, previous.host_loaded),
        ("disk", usage.disk_read, previous.disk_read),
    ] {
        counter!(KV_HIT_BLOCKS, "tier" => tier).increment(now.saturating_sub(before));
    }
    gauge!(KV_HOST_BYTES).set((usage.host_blocks as u64 * usage.block_bytes) as f64);
    gauge!(KV_DISK_BYTES).set((usage.disk_blocks as u64 * usage.block_bytes) as f64);
    *previous = *usage;
}

/// `events` KV-cache events that were not published.
pub fn record_kv_events_dropped(events: usize) {
    counter!(KV_EVENTS_DROPPED).increment(events as u64);
}

/// A batch of KV-cache events published.
pub fn record_kv_events_published() {
    counter!(KV_EVENTS_PUBLISHED).increment(1);
}

/// A finished request.
pub fn record_finish(reason: FinishReason, prompt_tokens: usize, e2e: Duration) {
    counter!(REQUEST_SUCCESS, "finished_reason" => reason.as_str()).increment(1);
    counter!(PROMPT_TOKENS).increment(prompt_tokens as u64);
    histogram!(E2E_REQUEST_LATENCY).record(e2e.as_secs_f64());
}

/// A generated token: `since_previous` is the time to first token for the first one.
pub fn record_token(first: bool, since_previous: Duration) {
    counter!(GENERATION_TOKENS).increment(1);
    let name = if first {
        TIME_TO_FIRST_TOKEN
    } else {
        INTER_TOKEN_LATENCY
    };
    histogram!(name).record(since_previous.as_secs_f64());
}

/// A request's first step, `queued` after its arrival.
pub fn record_queue_time(queued: Duration) {
    histogram!(REQUEST_QUEUE_TIME).record(queued.as_secs_f64());
}

/// A preemption.
pub fn record_preemption() {
    counter!(NUM_PREEMPTIONS).increment(1);
}

/// How the step the runner queued ahead served a step.
pub fn record_ahead(ahead: AheadUse) {
    match ahead {
        AheadUse::None => {}
        AheadUse::Served(tokens) => counter!(DECODE_AHEAD_TOKENS).increment(tokens as u64),
        AheadUse::Dropped => counter!(DECODE_AHEAD_DROPPED).increment(1),
    }
}

/// Seconds of the scheduler's steps that computed something, by `part`: `allocate` (the
/// KV allocator's grant), `propose` (the draft proposer), `forward` (the target runner's
/// step) and `host` (the rest: scheduling, applying the results, streaming them).
pub const ENGINE_STEP_SECONDS: &str = "peregrine:engine_step_seconds";

/// Seconds of an EAGLE-3 head's forwards, by `step`: `first` (step 0, over the target's
/// new rows), `next` (each later draft step run on its own) and `chain` (a whole
/// proposal's steps queued back to back on the GPU, read back once).
pub const SPEC_HEAD_SECONDS: &str = "peregrine:spec_decode_head_seconds";

/// Which of a head's forwards a time covers (`SPEC_HEAD_SECONDS`'s `step`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadSteps {
    /// Step 0.
    First,
    /// One later draft step.
    Next,
    /// Every step of a proposal, queued back to back.
    Chain,
}

/// An EAGLE-3 head's `steps` took `elapsed`.
pub fn record_head_step(steps: HeadSteps, elapsed: Duration) {
    let step = match steps {
        HeadSteps::First => "first",
        HeadSteps::Next => "next",
        HeadSteps::Chain => "chain",
    };
    histogram!(SPEC_HEAD_SECONDS, "step" => step).record(elapsed.as_secs_f64());
}

/// Where one step's time went.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepTimes {
    pub allocate: Duration,
    pub propose: Duration,
    pub forward: Duration,
    /// The whole step.
    pub total: Duration,
}

/// A step that computed something took `times`.
pub fn record_step_times(times: &StepTimes) {
    let host = times
        .total
        .saturating_sub(times.allocate + times.propose + times.forward);
    for (part, d) in [
        ("allocate", times.allocate),
        ("propose", times.propose),
        ("forward", times.forward),
        ("host", host),
    ] {
        histogram!(ENGINE_STEP_SECONDS, "part" => part).record(d.as_secs_f64());
    }
}

/// Verification steps that had drafts (one per request and step).
pub const SPEC_NUM_DRAFTS: &str = "peregrine:spec_decode_num_drafts_total";
/// Draft tokens verified.
pub const SPEC_NUM_DRAFT_TOKENS: &str = "peregrine:spec_decode_num_draft_tokens_total";
/// Draft tokens accepted.
pub const SPEC_NUM_ACCEPTED_TOKENS: &str = "peregrine:spec_decode_num_accepted_tokens_total";
/// Draft tokens accepted at each draft position (`position` 0 is the first draft).
pub const SPEC_ACCEPTED_PER_POS: &str = "peregrine:spec_decode_num_accepted_tokens_per_pos_total";
/// Drafts accepted per verification step, 0..K.
pub const SPEC_ACCEPTED_LENGTH: &str = "peregrine:spec_decode_accepted_length";
/// Mean tokens emitted per verification step (accepted drafts plus one), since start.
pub const SPEC_MEAN_TOKENS_PER_FORWARD: &str = "peregrine:spec_decode_mean_tokens_per_forward";
/// 1 while an acceptance alarm is raised (the whole pool's collapse, or acceptance that
/// depends on the band of block ids), else 0.
pub const SPEC_ACCEPTANCE_ALARM: &str = "peregrine:spec_decode_acceptance_alarm";
/// Times an acceptance alarm was raised (one per warning).
pub const SPEC_ACCEPTANCE_ALARMS: &str = "peregrine:spec_decode_acceptance_alarms_total";
/// Draft tokens verified, by the `band` of block ids the sequence's KV lives in (its
/// largest block id, `blocks FIRST-LAST`) and draft `position`.
pub const SPEC_BAND_DRAFT_TOKENS: &str = "peregrine:spec_decode_band_draft_tokens_total";
/// Draft tokens accepted, by `band` and `position` as the draft tokens.
pub const SPEC_BAND_ACCEPTED_TOKENS: &str = "peregrine:spec_decode_band_accepted_tokens_total";

/// Buckets of the accepted-length histogram: one per count up to 16 drafts.
pub const ACCEPTED_LENGTH_BUCKETS: [f64; 17] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0,
];

/// One request's verification: `drafts` proposed, the first `accepted` of them accepted.
pub fn record_verification(drafts: usize, accepted: usize) {
    counter!(SPEC_NUM_DRAFTS).increment(1);
    counter!(SPEC_NUM_DRAFT_TOKENS).increment(drafts as u64);
    counter!(SPEC_NUM_ACCEPTED_TOKENS).increment(accepted as u64);
    for position in 0..accepted {
        counter!(SPEC_ACCEPTED_PER_POS, "position" => position.to_string()).increment(1);
    }
    histogram!(SPEC_ACCEPTED_LENGTH).record(accepted as f64);
}

/// Drafts planned per request by the latest decode step of each batch size (`batch`: a
/// range of decoding requests, `1`, `2-3`, `4-7`, ...).
pub const SPEC_PLANNED_DRAFTS: &str = "peregrine:spec_decode_planned_drafts";
/// Decode steps by the drafts planned per request (`num_drafts`).
pub const SPEC_PLANNED_STEPS: &str = "peregrine:spec_decode_planned_steps_total";

/// What a decode step of `batch` decoding requests planned: `drafts` per request.
pub fn record_planned_drafts(batch: &str, drafts: usize) {
    gauge!(SPEC_PLANNED_DRAFTS, "batch" => batch.to_string()).set(drafts as f64);
    counter!(SPEC_PLANNED_STEPS, "num_drafts" => drafts.to_string()).increment(1);
}

/// One verification of a sequence placed in `band`: `drafts` proposed at positions
/// 0.., the first `accepted` accepted.
pub fn record_band_verification(band: &str, drafts: usize, accepted: usize) {
    for position in 0..drafts {
        let at = position.to_string();
        counter!(SPEC_BAND_DRAFT_TOKENS, "band" => band.to_owned(), "position" => at.clone())
            .increment(1);
        if position < accepted {
            counter!(SPEC_BAND_ACCEPTED_TOKENS, "band" => band.to_owned(), "position" => at)
                .increment(1);
        }
    }
}

/// The running mean of tokens per verification step.
pub fn record_tokens_per_forward(mean: f64) {
    gauge!(SPEC_MEAN_TOKENS_PER_FORWARD).set(mean);
}

/// An acceptance alarm was raised (`true`: counted), or none is raised any more.
pub fn record_acceptance_alarm(raised: bool) {
    gauge!(SPEC_ACCEPTANCE_ALARM).set(f64::from(u8::from(raised)));
    if raised {
        counter!(SPEC_ACCEPTANCE_ALARMS).increment(1);
    }
}

/// Constrained requests (structured output, enforced tool calls), by `kind` (`json_schema`,
/// `json_object`, `regex`, `choice`, `grammar`, `gbnf`, `tool_call`).
pub const STRUCTURED_REQUESTS: &str = "peregrine:structured_output_requests_total";
/// Seconds to compile a grammar that was not in the cache.
pub const GRAMMAR_COMPILE_SECONDS: &str = "peregrine:grammar_compile_seconds";
/// Grammars looked up in the compiled-grammar cache.
pub const GRAMMAR_CACHE_QUERIES: &str = "peregrine:grammar_cache_queries_total";
/// Grammars found in the compiled-grammar cache.
pub const GRAMMAR_CACHE_HITS: &str = "peregrine:grammar_cache_hits_total";
/// Seconds to compute one row's token mask (on the host, while the forward runs).
pub const GRAMMAR_MASK_SECONDS: &str = "peregrine:grammar_mask_seconds";
/// Tokens a grammar forced, taken without a sampling step each.
pub const GRAMMAR_FORCED_TOKENS: &str = "peregrine:grammar_forced_tokens_total";

/// Buckets of the grammar histograms in seconds, from 10 µs to 10 s.
pub const GRAMMAR_BUCKETS: [f64; 16] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.5, 1.0, 10.0,
];

/// A constrained request of `kind` whose grammar came from the cache (`cached`) or took
/// `compile` to compile.
pub fn record_grammar(kind: &'static str, cached: bool, compile: Duration) {
    counter!(STRUCTURED_REQUESTS, "kind" => kind).increment(1);
    counter!(GRAMMAR_CACHE_QUERIES).increment(1);
    if cached {
        counter!(GRAMMAR_CACHE_HITS).increment(1);
    } else {
        histogram!(GRAMMAR_COMPILE_SECONDS).record(compile.as_secs_f64());
    }
}

/// One row's token mask took `elapsed`.
pub fn record_grammar_mask(elapsed: Duration) {
    histogram!(GRAMMAR_MASK_SECONDS).record(elapsed.as_secs_f64());
}

/// A grammar forced `tokens` tokens after a sampled one.
pub fn record_forced_tokens(tokens: usize) {
    counter!(GRAMMAR_FORCED_TOKENS).increment(tokens as u64);
}
