//! KV-cache events for prefix-aware routers, in vLLM's format (`vllm/distributed/kv_events.py`):
//! the prefix cache's journal ([`CacheEvent`](crate::kv_allocator::CacheEvent)s) leaves the
//! KV allocator after each step as one batch through a bounded queue ([`KvEventSink`]; a full
//! queue drops the batch and counts its events, so publishing never slows a step); a tokio
//! task encodes it ([`WireFormat`]) and sends it on a ZeroMQ PUB socket as
//! `(topic, 8-byte big-endian sequence number, msgpack batch)`, keeping the last batches for
//! subscribers that ask a ROUTER socket to replay from a sequence number ([`start_publisher`]).

mod publisher;
mod sink;
mod wire;

pub use publisher::start_publisher;
pub use sink::{EventBatch, KvEventSink};
pub use wire::WireFormat;
