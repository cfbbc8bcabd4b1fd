//! The serving engine on the GPU backend: requests through the scheduler, the KV allocator
//! and the target runner with the model on the device, sized by gpu_memory_utilization.
//! In deterministic mode a request's tokens are the same alone and among many others,
//! however the scheduler cuts its prompt into chunks and whatever the prefix cache holds.

use crate::common::engine::{collect, requests, submit};
use crate::common::tiny_model::{TinyModel, TinySpec};
use crate::model::gpu_sized;
use crate::setup;
use peregrine_actors::backend::{cuda_backend, GpuSettings};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::messages::{FinishReason, SchedulerLimits};
use std::path::Path;

const MAX_TOKENS: usize = 16;

fn gpu_engine(dir: &Path, deterministic: bool) -> peregrine_actors::engine::Engine {
    let settings = GpuSettings {
        gpu_memory_utilization: 0.05,
        block_size: 16,
        max_num_batched_tokens: 64,
        max_num_seqs: 32,
        deterministic,
        kernel_cache: std::env::temp_dir().join("peregrine-test-kernels"),
    };
    let backend = cuda_backend(dir, &settings).unwrap();
    let pool = backend.pool().clone();
    eprintln!(
        "GPU pool: {} blocks, {} bytes per layer, audit: largest byte offset {} in {}",
        pool.layout.num_blocks,
        pool.bytes_per_layer,
        pool.audit.largest_byte_offset,
        pool.computed_in
    );
    let engine = EngineSettings {
        block_size: 16,
        // Steps of 64 tokens cut the batch's prompts into chunks, and the solo runs find
        // their prompts' full blocks in the prefix cache: neither may change a token.
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: 32,
            max_num_batched_tokens: 64,
            max_waiting: 1000,
            num_speculative_tokens: 0,
        },
        max_model_len: None,
    };
    start_engine(backend, &engine, None).unwrap()
}

#[test]
fn deterministic_gpu_engine_gives_each_request_the_same_tokens_alone_and_batched() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 21).write_hf(dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let engine = gpu_engine(dir.path(), true);
        let reqs = requests(1000, 24, 21);
        let mut streams = Vec::new();
        for (i, (prompt, params)) in reqs.iter().enumerate() {
            streams.push(submit(&engine.scheduler, i as u64, prompt, params, MAX_TOKENS).await);
        }
        let mut together = Vec::new();
        for rx in streams {
            let (tokens, reason, usage) = collect(rx).await;
            assert_eq!(reason, FinishReason::Length);
            assert_eq!(usage.completion_tokens, MAX_TOKENS);
            together.push(tokens);
        }
        for (i, (prompt, params)) in reqs.iter().enumerate() {
            let id = (100 + i) as u64;
            let (alone, _, _) =
                collect(submit(&engine.scheduler, id, prompt, params, MAX_TOKENS).await).await;
            assert_eq!(
                alone,
                together[i],
                "request {i}: alone vs among {}",
                reqs.len()
            );
        }
    });
}
