"""Scenario 25: the host tier below the KV pool (`--kv-host-memory`). A greedy prompt runs
cold; other prompts then fill the small pool, so its blocks go down to the host tier
(peregrine:kv_host_spilled_blocks_total grows); the same prompt again reports its whole
blocks as cached, brought back from the host (peregrine:kv_host_loaded_blocks_total grows
by at least as many blocks), and gives exactly the cold output. The tier's hits are
peregrine:kv_hit_blocks_total{tier="host"} (as many as it loaded), its pool hits those of
tier="pool", and peregrine:kv_host_bytes is its blocks times --block-bytes."""

from e2e_common import (client, expect, expect_eq, greedy_completion, log, metric, metrics,
                         other_prompts, parser, run, tokenize)

SPILLED = "peregrine:kv_host_spilled_blocks_total"
LOADED = "peregrine:kv_host_loaded_blocks_total"
HOST_BLOCKS = "peregrine:kv_host_blocks"
HOST_BYTES = "peregrine:kv_host_bytes"
HOST_HITS = 'peregrine:kv_hit_blocks_total{tier="host"}'
POOL_HITS = 'peregrine:kv_hit_blocks_total{tier="pool"}'
BLOCK_SIZE = 16
# The pool holds 24 blocks (tests/serve_e2e.rs): eight other prompts of 6 blocks or more
# take every block the first one held.
OTHERS = 8


def main():
    p = parser(__doc__)
    p.add_argument("--block-bytes", type=int, required=True, help="a block's KV bytes over every layer")
    args = p.parse_args()
    base, model = args.base, args.model
    api = client(base)

    def greedy(prompt):
        return greedy_completion(api, model, prompt)

    prompt = "a river runs past the old mill and under the stone bridge. " * 4
    count = tokenize(base, model, prompt=prompt)
    expect(count >= 6 * BLOCK_SIZE, "the prompt has only %d tokens" % count)
    cold, cached = greedy(prompt)
    expect_eq(cached, 0, "cached_tokens of the cold request")

    before = metrics(base)
    for i, other in enumerate(other_prompts(OTHERS)):
        expect(tokenize(base, model, prompt=other) >= 6 * BLOCK_SIZE, "other prompt %d is short" % i)
        greedy(other)
    spilled = metric(metrics(base), SPILLED) - metric(before, SPILLED)
    expect(spilled > 0, "the other prompts moved no block to the host tier")

    before = metrics(base)
    again, cached = greedy(prompt)
    after = metrics(base)
    loaded = metric(after, LOADED) - metric(before, LOADED)
    log(
        "%d prompt tokens: %d blocks spilled by the others; again: cached %s, %d blocks loaded, "
        "%d blocks in the host tier" % (count, spilled, cached, loaded, metric(after, HOST_BLOCKS))
    )
    expect(cached >= (count - 1) // BLOCK_SIZE * BLOCK_SIZE, "only %s of %d tokens cached" % (cached, count))
    expect(loaded >= 1, "no block came back from the host tier")
    expect(loaded * BLOCK_SIZE <= cached, "%d blocks loaded for %d cached tokens" % (loaded, cached))
    expect_eq(again, cold, "greedy output with blocks from the host tier")
    hits = metric(after, HOST_HITS) - metric(before, HOST_HITS)
    expect_eq(hits, loaded, "host-tier hits vs blocks loaded from it")
    expect_eq(metric(after, HOST_BYTES), metric(after, HOST_BLOCKS) * args.block_bytes,
              "peregrine:kv_host_bytes vs its blocks")
    # The prompt once more: its blocks are in the pool now.
    before = metrics(base)
    greedy(prompt)
    pool_hits = metric(metrics(base), POOL_HITS) - metric(before, POOL_HITS)
    expect(pool_hits >= (count - 1) // BLOCK_SIZE, "%d pool hits for the prompt again" % pool_hits)


if __name__ == "__main__":
    run(main)
