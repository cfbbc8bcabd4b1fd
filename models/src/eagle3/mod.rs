//! EAGLE-3 draft heads, in the format of the heads the EAGLE-3 authors publish.
//!
//! A head is one decoder layer over `2H`-wide input: the token's embedding next to a
//! feature `g`, which at step 0 is `fc` of the target's auxiliary hidden states (the inputs
//! of three target layers, low‖mid‖high) and at later steps the row's own previous output
//! `pre`. Its attention keeps a one-layer paged KV cache addressed by the target's block
//! ids and slot mapping, and its `lm_head` scores a reduced vocabulary whose ids `d2t`
//! maps to target ids.
//!
//! - [`config`]: the published `config.json`.
//! - [`load`]: the published tensors (`midlayer.*` or `layers.0.*`), checked against the
//!   target.
//! - [`forward`]: one forward of the head on the CPU.
//! - [`record`]: the forward, recorded into a CPU graph over the head's buffers.
//! - [`stage`]: a step's inputs and features, staged into those buffers.
//! - [`vocab`]: draft id → target id.
//! - `feature_ring` (`cuda` feature): the target's features handed to the head on the
//!   device.
//! - `gpu` (`cuda` feature): the head's kind on the GPU (its weights and forward), which
//!   `draft_head::cuda::head` runs eagerly and `draft_head::cuda::graph` through CUDA graphs.

pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod feature_ring;
pub mod forward;
pub mod load;
pub mod record;
pub mod stage;
pub mod vocab;

pub use config::{default_aux_layers, Eagle3Config};
pub use forward::{HeadInput, HeadOutput};
pub use load::Eagle3Head;
pub use record::{FeatureKind, HeadBuffers};
pub use stage::HeadStaging;
pub use vocab::DraftVocab;

use crate::config::ConfigError;
use crate::weights::WeightError;

/// An EAGLE-3 head that cannot be loaded, naming the field or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum Eagle3Error {
    #[error("EAGLE-3 head: {0}")]
    Config(#[from] ConfigError),
    #[error("EAGLE-3 head: {0}")]
    Weight(#[from] WeightError),
    #[error("EAGLE-3 head does not fit the target: {0}")]
    Target(String),
    #[error(
        "EAGLE-3 head: tensor `d2t`: d2t[{index}] = {offset} maps draft id {index} outside \
         the target vocabulary of {vocab}"
    )]
    D2t {
        index: usize,
        offset: i64,
        vocab: usize,
    },
    #[error(
        "EAGLE-3 head: tensor `d2t` maps draft ids {first} and {second} both to target id {target}"
    )]
    D2tRepeats {
        first: usize,
        second: usize,
        target: u32,
    },
}
