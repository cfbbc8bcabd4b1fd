//! GGUF import: a tiny random Llama written as GGUF (with llama.cpp's q/k permutation and a
//! mix of Q8_0, Q4_0, Q4_1, F16, BF16 and F32 tensors) converts back to the source weights
//! within each type's quantization error, gives the source model's logits, and carries a
//! byte-level BPE tokenizer that round-trips text exactly.
//!
//! One test binary in topics: the converted weights and logits (`conversion`), the
//! tokenizer (`tokenizer`), and reading and refusing files (`reading`), over the tests' own
//! GGUF writer (`gguf_writer`) and the tiny model written with it (`tiny_gguf`).

mod conversion;
mod gguf_writer;
mod reading;
mod tiny_gguf;
mod tokenizer;
