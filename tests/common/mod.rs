//! Helpers shared by the integration tests: driving the serving engine, the proposals of
//! the draft-graph tests, the distribution check of sampled speculation, the end-to-end
//! tests' Python environment and a tiny tokenizer; and, from `peregrine-testkit` (which
//! the member crates' tests share), tiny random models in Hugging Face format, dense
//! float64 reference forwards, random EAGLE-3 heads and the MTP checkpoint.
#![allow(dead_code)]

// Each test binary uses some of them.
#[allow(unused_imports)]
pub use peregrine_testkit::{eagle3_head, mtp_reference, reference, tiny_model};

pub mod draft_rounds;
pub mod engine;
pub mod first_two;
pub mod mtp_checkpoint;
pub mod python_env;
pub mod served;
pub mod tiny_tokenizer;
