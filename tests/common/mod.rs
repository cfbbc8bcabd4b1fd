//! Helpers shared by the integration tests: tiny random models in Hugging Face format, a
//! dense float64 reference forward, a GGUF writer, random EAGLE-3 heads, and the end-to-end
//! tests' Python environment.
#![allow(dead_code)]

pub mod draft_rounds;
pub mod eagle3_head;
pub mod engine;
pub mod first_two;
pub mod gguf_writer;
pub mod mtp_checkpoint;
pub mod mtp_reference;
pub mod python_env;
pub mod reference;
pub mod served;
pub mod tiny_model;
pub mod tiny_tokenizer;
