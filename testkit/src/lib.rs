//! Helpers shared by the tests of several crates (a dev-dependency only): tiny random models
//! in Hugging Face format, dense float64 reference forwards, random EAGLE-3 heads, the
//! DeepSeek-V3 fixture with a random multi-token prediction layer, and where the
//! workspace's fixtures lie.

pub mod eagle3_head;
pub mod fixtures;
pub mod mtp_checkpoint;
pub mod mtp_reference;
pub mod reference;
pub mod tiny_model;
