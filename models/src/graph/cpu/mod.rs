//! What every model's CPU graphs are built of, whichever the model (the Llama family's
//! recorded forward in `llama::record`, an EAGLE-3 head's in `eagle3::record`, an MTP
//! layer's in `mtp`): a step's inputs staged into pooled buffers, padded up to a size by one
//! code path (`step_io`), the recorded ops a decoder forward is made of (`ops`), and what a
//! draft head shows the graphs of its decode step (`head`). The recording itself and its
//! buffers are `peregrine_runtime::cpu`'s.

pub mod head;
pub(crate) mod ops;
pub mod step_io;
