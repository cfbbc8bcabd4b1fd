//! What the scheduler keeps of speculative decoding: its statistics and log lines
//! (`stats`), the whole pool's acceptance alarm (`alarm`), and the alarm on acceptance
//! that depends on where a sequence's KV lives (`band_alarm`, over the `bands` of block ids
//! and bytes, each comparison a stratified test: `band_test`).

pub mod alarm;
pub mod band_alarm;
mod band_test;
pub mod bands;
pub mod stats;
