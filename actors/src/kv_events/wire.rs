//! The msgpack form of a batch, as vLLM's `KVEventBatch`: `[ts, events, data_parallel_rank]`,
//! each event a `BlockStored`, `BlockRemoved` or `AllBlocksCleared`, as a map of named fields
//! tagged under `type` (vLLM 0.24 and later) or as a positional array led by its tag (older
//! vLLM). A block's hash names its prefix-cache entry: a bijection of its chain id (unique
//! in the process, never reused) mixed with a 64-bit salt drawn at start, so a restarted
//! replica's hashes almost surely differ from those it sent before. Runs of stores that continue one chain become one
//! `BlockStored` (its hashes in order, its parent the first one's), as vLLM sends them.

use super::sink::EventBatch;
use crate::kv_allocator::{CacheEvent, ChainId, Medium};
use peregrine_config::KvEventsEncoding;
use serde::Serialize;
use std::hash::{BuildHasher, Hasher};

/// The `medium` of an entry's block as vLLM names it: `GPU` for the pool (vLLM's primary
/// pool, which routers credit in full; the CPU backend's pool is its primary pool too),
/// `CPU` for the host tier (vLLM's offloaded tier in host memory, which routers discount),
/// and `DISK` for the disk tier, in the same upper case (vLLM names no disk medium of its
/// own).
fn medium_name(medium: Medium) -> &'static str {
    match medium {
        Medium::Pool => "GPU",
        Medium::Host => "CPU",
        Medium::Disk => "DISK",
    }
}

/// How this replica's events are written.
#[derive(Clone, Debug)]
pub struct WireFormat {
    /// Map or array events.
    pub encoding: KvEventsEncoding,
    /// Tokens per block (each `BlockStored` says it).
    pub block_size: usize,
    /// Mixed into every hash; drawn per process by [`WireFormat::new`].
    salt: u64,
}

/// One event as sent: runs of stores along a chain and runs of removals merged.
#[derive(Debug, PartialEq)]
enum Merged {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        /// The chain the run ends (the next store in the same medium continues the run if
        /// it follows it).
        last: ChainId,
        medium: Medium,
    },
    Removed {
        hashes: Vec<u64>,
        medium: Medium,
    },
    Cleared,
}

/// vLLM 0.24's events: maps, tagged under `type`.
#[derive(Serialize)]
#[serde(tag = "type")]
enum MapEvent<'a> {
    BlockStored {
        block_hashes: &'a [u64],
        parent_block_hash: Option<u64>,
        token_ids: &'a [u32],
        block_size: usize,
        lora_id: Option<u32>,
        medium: &'a str,
        lora_name: Option<&'a str>,
    },
    BlockRemoved {
        block_hashes: &'a [u64],
        medium: &'a str,
    },
    AllBlocksCleared,
}

/// Older vLLM's `BlockStored` as an array: tag, block_hashes, parent_block_hash,
/// token_ids, block_size, lora_id, medium, lora_name.
type ArrayStored<'a> = (
    &'static str,
    &'a [u64],
    Option<u64>,
    &'a [u32],
    usize,
    Option<u32>,
    &'a str,
    Option<&'a str>,
);

/// Older vLLM's events: arrays, the tag first, fields in declaration order.
#[derive(Serialize)]
#[serde(untagged)]
enum ArrayEvent<'a> {
    BlockStored(ArrayStored<'a>),
    BlockRemoved((&'static str, &'a [u64], &'a str)),
    AllBlocksCleared((&'static str,)),
}

/// The data-parallel rank every batch names (one engine per process).
const DATA_PARALLEL_RANK: u32 = 0;

impl WireFormat {
    /// A format for `block_size`-token blocks, with a fresh salt.
    pub fn new(encoding: KvEventsEncoding, block_size: usize) -> Self {
        let salt = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        WireFormat::salted(encoding, block_size, salt)
    }

    /// A format with the given salt (tests fix it).
    pub fn salted(encoding: KvEventsEncoding, block_size: usize, salt: u64) -> Self {
        WireFormat {
            encoding,
            block_size,
            salt,
        }
    }

    /// The hash subscribers know the block ending `chain` by; `None` for the root.
    pub fn hash(&self, chain: ChainId) -> Option<u64> {
        (chain != ChainId::ROOT).then(|| mix(chain.get() ^ self.salt))
    }

    /// The msgpack bytes of `batch`.
    pub fn encode(&self, batch: &EventBatch) -> Result<Vec<u8>, rmp_serde::encode::Error> {
        self.encode_merged(batch.ts, &self.merge(&batch.events))
    }

    /// The msgpack bytes of a batch holding one `AllBlocksCleared` (the pool is empty).
    pub fn encode_cleared(&self, ts: f64) -> Result<Vec<u8>, rmp_serde::encode::Error> {
        self.encode_merged(ts, &[Merged::Cleared])
    }

    fn merge(&self, events: &[CacheEvent]) -> Vec<Merged> {
        let mut merged: Vec<Merged> = Vec::new();
        for event in events {
            match (event, merged.last_mut()) {
                (
                    CacheEvent::Stored {
                        chain,
                        parent,
                        tokens,
                        medium,
                    },
                    Some(Merged::Stored {
                        hashes,
                        tokens: run,
                        last,
                        medium: run_medium,
                        ..
                    }),
                ) if parent == last && medium == run_medium => {
                    hashes.extend(self.hash(*chain));
                    run.extend_from_slice(tokens);
                    *last = *chain;
                }
                (
                    CacheEvent::Stored {
                        chain,
                        parent,
                        tokens,
                        medium,
                    },
                    _,
                ) => merged.push(Merged::Stored {
                    hashes: self.hash(*chain).into_iter().collect(),
                    parent: self.hash(*parent),
                    tokens: tokens.to_vec(),
                    last: *chain,
                    medium: *medium,
                }),
                (
                    CacheEvent::Removed { chain, medium },
                    Some(Merged::Removed {
                        hashes,
                        medium: run_medium,
                    }),
                ) if medium == run_medium => {
                    hashes.extend(self.hash(*chain));
                }
                (CacheEvent::Removed { chain, medium }, _) => merged.push(Merged::Removed {
                    hashes: self.hash(*chain).into_iter().collect(),
                    medium: *medium,
                }),
            }
        }
        merged
    }

    fn encode_merged(
        &self,
        ts: f64,
        events: &[Merged],
    ) -> Result<Vec<u8>, rmp_serde::encode::Error> {
        match self.encoding {
            KvEventsEncoding::Map => {
                let events: Vec<MapEvent> = events.iter().map(|e| self.map_event(e)).collect();
                rmp_serde::to_vec_named(&(ts, events, DATA_PARALLEL_RANK))
            }
            KvEventsEncoding::Array => {
                let events: Vec<ArrayEvent> = events.iter().map(|e| self.array_event(e)).collect();
                rmp_serde::to_vec(&(ts, events, DATA_PARALLEL_RANK))
            }
        }
    }

    fn map_event<'a>(&'a self, event: &'a Merged) -> MapEvent<'a> {
        match event {
            Merged::Stored {
                hashes,
                parent,
                tokens,
                medium,
                ..
            } => MapEvent::BlockStored {
                block_hashes: hashes,
                parent_block_hash: *parent,
                token_ids: tokens,
                block_size: self.block_size,
                lora_id: None,
                medium: medium_name(*medium),
                lora_name: None,
            },
            Merged::Removed { hashes, medium } => MapEvent::BlockRemoved {
                block_hashes: hashes,
                medium: medium_name(*medium),
            },
            Merged::Cleared => MapEvent::AllBlocksCleared,
        }
    }

    fn array_event<'a>(&'a self, event: &'a Merged) -> ArrayEvent<'a> {
        match event {
            Merged::Stored {
                hashes,
                parent,
                tokens,
                medium,
                ..
            } => ArrayEvent::BlockStored((
                "BlockStored",
                hashes,
                *parent,
                tokens,
                self.block_size,
                None,
                medium_name(*medium),
                None,
            )),
            Merged::Removed { hashes, medium } => {
                ArrayEvent::BlockRemoved(("BlockRemoved", hashes, medium_name(*medium)))
            }
            Merged::Cleared => ArrayEvent::AllBlocksCleared(("AllBlocksCleared",)),
        }
    }
}

/// SplitMix64's finalizer: a bijection of u64, so distinct chain ids keep distinct hashes.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::{mix, WireFormat};
    use crate::kv_allocator::{BlockManager, CacheEvent, ChainId, Medium};
    use crate::kv_events::EventBatch;
    use crate::messages::{AdmitSeq, AllocateStep, ComputedSeq, RequestId};
    use peregrine_config::KvEventsEncoding;
    use serde_json::{json, Value};
    use std::sync::Arc;

    /// Admits request `id` with `tokens` into `blocks` and registers all but its last token
    /// as computed (freeing the request in the same step when `free`).
    fn cache_prompt(blocks: &mut BlockManager, id: u64, tokens: &[u32], free: bool) {
        blocks.allocate_step(AllocateStep {
            admit: vec![AdmitSeq {
                id: RequestId(id),
                tokens: Arc::from(tokens),
                scores_prompt: false,
            }],
            token_budget: usize::MAX,
            ..AllocateStep::default()
        });
        blocks.allocate_step(AllocateStep {
            computed: vec![ComputedSeq {
                id: RequestId(id),
                first_block: 0,
                tokens: tokens[..tokens.len() - 1].to_vec(),
            }],
            free: if free { vec![RequestId(id)] } else { vec![] },
            ..AllocateStep::default()
        });
    }

    /// A pool of 2-token blocks that caches [1 2][3 4][5 6], then [7 8] after [1 2]; with a
    /// copy of the first store and the removal of its block appended.
    fn journal() -> Vec<CacheEvent> {
        let mut blocks = BlockManager::new(8, 2, true).recording_events();
        for (id, tokens) in [(1, &[1, 2, 3, 4, 5, 6, 9][..]), (2, &[1, 2, 7, 8, 9])] {
            cache_prompt(&mut blocks, id, tokens, false);
        }
        let mut events = blocks.take_events();
        assert_eq!(events.len(), 4, "{events:?}");
        events.push(events[0].clone());
        if let CacheEvent::Stored { chain, .. } = events[0] {
            events.push(CacheEvent::Removed {
                chain,
                medium: Medium::Pool,
            });
        }
        events
    }

    /// The batch as JSON (msgpack maps become objects, arrays arrays).
    fn decode(bytes: Result<Vec<u8>, rmp_serde::encode::Error>) -> Value {
        rmp_serde::from_slice(&bytes.expect("encoded")).expect("msgpack")
    }

    #[test]
    fn mixing_is_a_bijection_on_what_it_sees() {
        let mut seen = std::collections::HashSet::new();
        for x in (0..100_000u64).chain(u64::MAX - 1000..=u64::MAX) {
            assert!(seen.insert(mix(x)));
        }
    }

    #[test]
    fn a_map_batch_is_vllm_s_positional_batch_of_tagged_maps() {
        let format = WireFormat::salted(KvEventsEncoding::Map, 2, 7);
        let events = journal();
        let hashes: Vec<Value> = events
            .iter()
            .filter_map(|e| match e {
                CacheEvent::Stored { chain, .. } => Some(json!(format.hash(*chain).unwrap())),
                CacheEvent::Removed { .. } => None,
            })
            .collect();
        let batch = decode(format.encode(&EventBatch { ts: 12.5, events }));
        assert_eq!(batch[0], json!(12.5));
        assert_eq!(batch[2], json!(0));
        let expected = json!([
            {
                "type": "BlockStored",
                "block_hashes": [hashes[0], hashes[1], hashes[2]],
                "parent_block_hash": null,
                "token_ids": [1, 2, 3, 4, 5, 6],
                "block_size": 2,
                "lora_id": null,
                "medium": "GPU",
                "lora_name": null,
            },
            {
                "type": "BlockStored",
                "block_hashes": [hashes[3]],
                "parent_block_hash": hashes[0],
                "token_ids": [7, 8],
                "block_size": 2,
                "lora_id": null,
                "medium": "GPU",
                "lora_name": null,
            },
            {
                // A store that does not continue the chain before it starts an event.
                "type": "BlockStored",
                "block_hashes": [hashes[0]],
                "parent_block_hash": null,
                "token_ids": [1, 2],
                "block_size": 2,
                "lora_id": null,
                "medium": "GPU",
                "lora_name": null,
            },
            {"type": "BlockRemoved", "block_hashes": [hashes[0]], "medium": "GPU"},
        ]);
        assert_eq!(batch[1], expected);
    }

    #[test]
    fn an_array_batch_is_older_vllm_s_positional_events() {
        let format = WireFormat::salted(KvEventsEncoding::Array, 2, 7);
        let events = journal();
        let hash = |i: usize| match &events[i] {
            CacheEvent::Stored { chain, .. } => json!(format.hash(*chain).unwrap()),
            CacheEvent::Removed { .. } => panic!("a store"),
        };
        let (first, fourth) = (hash(0), hash(3));
        let batch = decode(format.encode(&EventBatch {
            ts: 1.0,
            events: events.clone(),
        }));
        let events = &batch[1];
        assert_eq!(
            events[1],
            json!(["BlockStored", [fourth], first, [7, 8], 2, null, "GPU", null])
        );
        assert_eq!(events[3], json!(["BlockRemoved", [first], "GPU"]));
        let cleared = decode(format.encode_cleared(3.0));
        assert_eq!(cleared, json!([3.0, [["AllBlocksCleared"]], 0]));
    }

    #[test]
    fn host_tier_entries_are_cpu_events_under_the_same_hashes() {
        // A chain of two blocks whose first spills to the host tier and comes back: the
        // stores and removals of each medium are events of their own, never merged across
        // media, and the entry keeps its hash as it moves.
        let format = WireFormat::salted(KvEventsEncoding::Map, 2, 7);
        let mut blocks = BlockManager::new(3, 2, true)
            .with_host_tier(2)
            .recording_events();
        // [1, 2] cached in the pool, pushed to the host tier by [5, 6, 7, 8], then
        // loaded back by its own prompt again.
        cache_prompt(&mut blocks, 0, &[1, 2, 3], true);
        cache_prompt(&mut blocks, 1, &[5, 6, 7, 8, 9], true);
        cache_prompt(&mut blocks, 2, &[1, 2, 3], true);
        let events = blocks.take_events();
        let stored = |medium: Medium| {
            events.iter().find_map(|e| match e {
                CacheEvent::Stored {
                    chain,
                    tokens,
                    medium: m,
                    ..
                } if *m == medium && tokens[..] == [1, 2] => Some(*chain),
                _ => None,
            })
        };
        let chain = stored(Medium::Pool).expect("[1, 2] stored in the pool");
        assert_eq!(stored(Medium::Host), Some(chain), "{events:?}");
        let hash = json!(format.hash(chain).unwrap());
        let batch = decode(format.encode(&EventBatch { ts: 1.0, events }));
        let of = |kind: &str, medium: &str| -> usize {
            batch[1]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| {
                    e["type"] == kind
                        && e["medium"] == medium
                        && e["block_hashes"].as_array().unwrap().contains(&hash)
                })
                .count()
        };
        // Stored in the pool, removed from it and stored in the host tier, removed from
        // the host tier and stored in the pool again.
        assert_eq!(of("BlockStored", "GPU"), 2, "{batch}");
        assert_eq!(of("BlockRemoved", "GPU"), 1, "{batch}");
        assert_eq!(of("BlockStored", "CPU"), 1, "{batch}");
        assert_eq!(of("BlockRemoved", "CPU"), 1, "{batch}");
    }

    #[test]
    fn disk_tier_entries_are_disk_events() {
        // The disk tier's medium in both encodings, its stores merged along a chain as the
        // other media's are.
        let events = journal();
        let (first, second) = match (&events[0], &events[1]) {
            (CacheEvent::Stored { chain: a, .. }, CacheEvent::Stored { chain: b, .. }) => (*a, *b),
            _ => panic!("stores first: {events:?}"),
        };
        let on_disk = vec![
            CacheEvent::Stored {
                chain: first,
                parent: ChainId::ROOT,
                tokens: [1, 2].into(),
                medium: Medium::Disk,
            },
            CacheEvent::Stored {
                chain: second,
                parent: first,
                tokens: [3, 4].into(),
                medium: Medium::Disk,
            },
            CacheEvent::Removed {
                chain: second,
                medium: Medium::Disk,
            },
        ];
        let batch = EventBatch {
            ts: 1.0,
            events: on_disk,
        };
        let format = WireFormat::salted(KvEventsEncoding::Map, 2, 7);
        let (a, b) = (format.hash(first).unwrap(), format.hash(second).unwrap());
        let maps = decode(format.encode(&batch));
        assert_eq!(maps[1][0]["medium"], json!("DISK"));
        assert_eq!(maps[1][0]["block_hashes"], json!([a, b]));
        assert_eq!(
            maps[1][1],
            json!({"type": "BlockRemoved", "block_hashes": [b], "medium": "DISK"})
        );
        let format = WireFormat::salted(KvEventsEncoding::Array, 2, 7);
        let arrays = decode(format.encode(&batch));
        assert_eq!(
            arrays[1][0],
            json!([
                "BlockStored",
                [a, b],
                null,
                [1, 2, 3, 4],
                2,
                null,
                "DISK",
                null
            ])
        );
        assert_eq!(arrays[1][1], json!(["BlockRemoved", [b], "DISK"]));
    }

    #[test]
    fn a_cleared_map_batch_is_its_tag_alone() {
        let format = WireFormat::new(KvEventsEncoding::Map, 16);
        let cleared = decode(format.encode_cleared(3.0));
        assert_eq!(cleared, json!([3.0, [{"type": "AllBlocksCleared"}], 0]));
    }

    #[test]
    fn hashes_differ_between_processes_and_the_root_has_none() {
        let a = WireFormat::new(KvEventsEncoding::Map, 16);
        let b = WireFormat::new(KvEventsEncoding::Map, 16);
        let events = journal();
        let CacheEvent::Stored { chain, parent, .. } = &events[0] else {
            panic!("a store first");
        };
        assert_eq!(a.hash(*parent), None);
        assert_ne!(a.hash(*chain), b.hash(*chain));
    }
}
