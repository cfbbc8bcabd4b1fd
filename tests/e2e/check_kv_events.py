"""KV-cache events (`--kv-events-config`) read as vLLM's own subscribers read them: a pyzmq SUB
socket on the PUB endpoint and a DEALER on the replay endpoint, every batch decoded by
msgspec with vLLM's types (below, as `vllm/distributed/kv_events.py` declares them since
vLLM 0.24: a positional batch of events that are maps tagged under `type`).

- Replay from sequence 0 returns the start-up batch, one `AllBlocksCleared`, then the end
  marker `(-1, b"")`.
- Prompts that share prefixes, sent one at a time through a pool small enough to evict:
  every live batch decodes, sequence numbers run without gaps (a gap is filled from the
  replay endpoint, as vLLM's example subscriber does), no block hash is stored twice or
  removed before it was stored, each `BlockStored` carries `block_size` tokens per hash;
  after each request the subscriber's view holds the request's prompt block by block
  (chained through `parent_block_hash`, the way a router matches a prompt).
- At the end, the blocks stored and not removed are exactly the pool's cached blocks
  (`peregrine:prefix_cache_blocks`), and the batches published match
  `peregrine:kv_events_published_total` (none dropped).
- With `--host-tier` (a server with `--kv-host-memory`): blocks move between `GPU` and
  `CPU` under the same hash, each removed from the medium it was stored in and never
  stored while live, both media taking part; at the end the `CPU` blocks are exactly
  `peregrine:kv_host_blocks`.
"""

import time
from typing import Any

import msgspec
import zmq
from e2e_common import client, expect, expect_eq, log, metric, metrics, parser, post, run

BLOCK_SIZE = 16


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
END = (-1).to_bytes(8, "big", signed=True)


class Subscriber:
    """A SUB socket, a replay DEALER, and the view of the pool the events build."""

    def __init__(self, endpoint, replay_endpoint, host_tier):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.replay = self.ctx.socket(zmq.DEALER)
        self.replay.connect(replay_endpoint)
        self.last_seq = -1
        self.batches = 0
        self.replayed = 0
        self.host_tier = host_tier
        self.live = {}  # hash -> (medium, parent hash, tokens)
        self.ever = set()
        self.stored = {"GPU": 0, "CPU": 0}
        self.removed = {"GPU": 0, "CPU": 0}
        self.cleared = 0

    def replay_from(self, start):
        """[(sequence, batch)] the replay endpoint sends from `start`, up to its end marker."""
        self.replay.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            expect(self.replay.poll(5000), "no replay answer for sequence %d" % start)
            delimiter, seq, payload = self.replay.recv_multipart()
            expect_eq(delimiter, b"", "the replay reply's delimiter frame")
            if seq == END:
                expect_eq(payload, b"", "the end marker's payload")
                return out
            out.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))

    def apply(self, seq, batch):
        expect_eq(seq, self.last_seq + 1, "the next sequence number")
        self.last_seq = seq
        self.batches += 1
        expect_eq(batch.data_parallel_rank, 0, "data_parallel_rank")
        for event in batch.events:
            if isinstance(event, BlockStored):
                expect_eq(event.block_size, BLOCK_SIZE, "BlockStored.block_size")
                media = ("GPU", "CPU") if self.host_tier else ("GPU",)
                expect(event.medium in media, "BlockStored.medium %r: expected one of %s (vLLM's "
                       "names for the primary pool and host memory)" % (event.medium, media))
                expect_eq(len(event.token_ids), BLOCK_SIZE * len(event.block_hashes), "tokens per stored block")
                expect(event.parent_block_hash is None or event.parent_block_hash in self.ever,
                       "a BlockStored whose parent was never stored")
                parent = event.parent_block_hash
                for i, h in enumerate(event.block_hashes):
                    expect(h not in self.live, "block hash %r stored while live" % h)
                    expect(self.host_tier or h not in self.ever, "block hash %r stored twice" % h)
                    self.ever.add(h)
                    tokens = tuple(event.token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE])
                    self.live[h] = (event.medium, parent, tokens)
                    parent = h
                    self.stored[event.medium] += 1
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    expect(h in self.live, "block hash %r removed while not stored" % h)
                    expect_eq(self.live[h][0], event.medium, "BlockRemoved.medium of block hash %r" % h)
                    del self.live[h]
                    self.removed[event.medium] += 1
            else:
                self.live.clear()
                self.cleared += 1

    def drain(self, quiet=0.5):
        """Applies every batch until none comes for `quiet` seconds, filling gaps by replay."""
        while self.sub.poll(int(quiet * 1000)):
            _topic, seq, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq, "big")
            if seq > self.last_seq + 1:
                for missed, batch in self.replay_from(self.last_seq + 1):
                    if self.last_seq < missed < seq:
                        self.replayed += 1
                        self.apply(missed, batch)
            self.apply(seq, DECODER.decode(payload))

    def matched_blocks(self, tokens):
        """How many of `tokens`' whole blocks the view holds, chained from the first."""
        by_parent = {}
        for h, (_medium, parent, block) in self.live.items():
            by_parent[(parent, block)] = h
        parent, n = None, 0
        for i in range(len(tokens) // BLOCK_SIZE):
            h = by_parent.get((parent, tuple(tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE])))
            if h is None:
                break
            parent, n = h, n + 1
        return n


def token_ids(base, model, prompt):
    resp = post(base, "/tokenize", {"model": model, "prompt": prompt})
    expect_eq(resp.status, 200, "POST /tokenize status")
    return resp.json()["tokens"]


def main():
    p = parser(__doc__)
    p.add_argument("--events", required=True, help="the PUB endpoint, as tcp://HOST:PORT")
    p.add_argument("--replay", required=True, help="the replay endpoint")
    p.add_argument("--host-tier", action="store_true", help="the server keeps a host tier")
    args = p.parse_args()
    base, model = args.base, args.model
    api = client(base)
    sub = Subscriber(args.events, args.replay, args.host_tier)

    start = sub.replay_from(0)
    expect(len(start) >= 1, "the replay from 0 sent nothing")
    seq, first = start[0]
    expect_eq(seq, 0, "the first batch's sequence number")
    expect_eq([type(e).__name__ for e in first.events], ["AllBlocksCleared"], "the start-up batch")
    for seq, batch in start:
        sub.apply(seq, batch)
    # The SUB socket's subscription reaches the publisher asynchronously: wait for it with
    # a request whose events must arrive, as vLLM's own tests do.
    deadline = time.monotonic() + 20
    warm = "warm-up " * 40
    while True:
        api.completions.create(model=model, prompt=warm + str(time.monotonic()), max_tokens=1, temperature=0)
        sub.drain(quiet=0.3)
        if sub.stored["GPU"] > 0 or time.monotonic() > deadline:
            break
    expect(sub.stored["GPU"] > 0, "no BlockStored arrived within 20 s")

    stems = [" ".join("%s%d" % (word, i) for i in range(60)) for word in ("alpha", "beta", "gamma")]
    for i in range(18):
        prompt = "%s turn %d:" % (stems[i % 3], i)
        ids = token_ids(base, model, prompt)
        api.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
        sub.drain()
        expect_eq(sub.matched_blocks(ids), len(ids) // BLOCK_SIZE,
                  "whole blocks of request %d's prompt of %d tokens held in the subscriber's view" % (i, len(ids)))

    sub.drain(quiet=1.0)
    samples = metrics(base)
    cached = metric(samples, "peregrine:prefix_cache_blocks", None)
    published = metric(samples, "peregrine:kv_events_published_total", None)
    dropped = metric(samples, "peregrine:kv_events_dropped_total", 0.0)
    live = {m: sum(1 for v in sub.live.values() if v[0] == m) for m in ("GPU", "CPU")}
    log("%d batches (%d filled by replay): blocks stored %s, removed %s, live %s; pool caches %s blocks; "
        "published %s, dropped %s" % (sub.batches, sub.replayed, sub.stored, sub.removed, live, cached,
                                      published, dropped))
    expect(sub.removed["GPU"] > 0, "the pool never evicted: the check needs a smaller pool")
    expect_eq(live["GPU"], cached, "GPU blocks stored and not removed vs peregrine:prefix_cache_blocks")
    if args.host_tier:
        host = metric(samples, "peregrine:kv_host_blocks", None)
        expect(sub.stored["CPU"] > 0 and sub.removed["CPU"] > 0, "no block moved to the host tier and back")
        expect_eq(live["CPU"], host, "CPU blocks stored and not removed vs peregrine:kv_host_blocks")
    else:
        expect_eq(live["CPU"], 0, "CPU blocks from a server without a host tier")
    expect_eq(dropped, 0.0, "peregrine:kv_events_dropped_total")
    expect_eq(sub.batches, published, "batches received vs peregrine:kv_events_published_total")


if __name__ == "__main__":
    run(main)
