"""Scenario 26: the disk tier below the KV pool (`--kv-cache-dir`), across restarts.

--phase cold: a greedy prompt runs cold (its output saved to --state); other prompts then
fill the small pool, so its blocks leave memory for the disk
(peregrine:kv_disk_written_blocks_total grows); the same prompt again reports its whole
blocks as cached, read back from disk (peregrine:kv_disk_read_blocks_total grows), and
gives exactly the cold output.
--phase restart: a new server over the same directory: the prompt's whole blocks come
from disk at once, with the saved output.
--phase push: the other prompts again, pushing the prompt's blocks out of the pool (they
are on disk already: nothing is written for them).
--phase live: after a byte of every chain's first block was flipped in the file under the
running server: the prompt's request reads its blocks, the first fails its checks, and the
request goes back to wait and is computed again (nothing corrupt is served): it reports no
cached token and gives the saved output; the same request again finds the blocks it
computed in the pool (nothing read from disk) and gives the saved output.
--phase damaged: a new server over the damaged file: the blocks that fail their checks,
and so every block after them, miss (no cached tokens, nothing read from disk), and the
output is still the saved one."""

from e2e_common import (client, expect, expect_eq, greedy_completion, log, metric,
                         metrics, other_prompts, parser, run, tokenize)

WRITTEN = "peregrine:kv_disk_written_blocks_total"
READ = "peregrine:kv_disk_read_blocks_total"
DISK_BLOCKS = "peregrine:kv_disk_blocks"
DISK_HITS = 'peregrine:kv_hit_blocks_total{tier="disk"}'
COPY_SECONDS = "peregrine:kv_tier_copy_seconds"
BLOCK_SIZE = 16
# The pool holds 24 blocks (tests/serve_e2e.rs): eight other prompts of 6 blocks or more
# take every block the first one held.
OTHERS = 8
PROMPT = "a river runs past the old mill and under the stone bridge. " * 4


def main():
    p = parser(__doc__)
    p.add_argument("--phase", choices=["cold", "restart", "push", "live", "damaged"], required=True)
    p.add_argument("--state", required=True, help="where the cold output is kept")
    args = p.parse_args()
    base, model = args.base, args.model
    api = client(base)

    def greedy(prompt):
        return greedy_completion(api, model, prompt)

    count = tokenize(base, model, prompt=PROMPT)
    whole = (count - 1) // BLOCK_SIZE * BLOCK_SIZE
    expect(count >= 6 * BLOCK_SIZE, "the prompt has only %d tokens" % count)

    if args.phase == "cold":
        cold, cached = greedy(PROMPT)
        expect_eq(cached, 0, "cached_tokens of the cold request")
        with open(args.state, "w") as f:
            f.write(cold)
        before = metrics(base)
        for i, other in enumerate(other_prompts(OTHERS)):
            expect(tokenize(base, model, prompt=other) >= 6 * BLOCK_SIZE, "other prompt %d is short" % i)
            greedy(other)
        written = metric(metrics(base), WRITTEN) - metric(before, WRITTEN)
        expect(written > 0, "the other prompts wrote no block to disk")
        before = metrics(base)
        again, cached = greedy(PROMPT)
        read = metric(metrics(base), READ) - metric(before, READ)
        log("%d prompt tokens: %d blocks written by the others; again: cached %s, %d blocks read"
            % (count, written, cached, read))
        expect(cached >= whole, "only %s of %d tokens cached" % (cached, count))
        expect(read >= 1, "no block came back from disk")
        copies = metric(metrics(base), COPY_SECONDS + "_count") - metric(before, COPY_SECONDS + "_count")
        expect(copies >= 1, "no step's tier copies were timed")
        expect_eq(again, cold, "greedy output with blocks from disk")
        return

    if args.phase == "push":
        for other in other_prompts(OTHERS):
            greedy(other)
        return

    with open(args.state) as f:
        saved = f.read()
    if args.phase == "live":
        before = metrics(base)
        first, cached = greedy(PROMPT)
        read = metric(metrics(base), READ) - metric(before, READ)
        log("over the damaged block: cached %s, %d blocks read" % (cached, read))
        expect(read >= 1, "the damaged chain was not read")
        expect_eq(cached, 0, "cached_tokens of a request whose first block failed its read")
        expect_eq(first, saved, "greedy output over a damaged block, computed again")
    before = metrics(base)
    out, cached = greedy(PROMPT)
    after = metrics(base)
    read = metric(after, READ) - metric(before, READ)
    log("%s: cached %s, %d blocks read, %d blocks on disk"
        % (args.phase, cached, read, metric(after, DISK_BLOCKS)))
    expect_eq(metric(after, DISK_HITS) - metric(before, DISK_HITS), read, "disk-tier hits vs blocks read")
    if args.phase == "live":
        expect(cached >= whole, "only %s of %d tokens cached in the pool" % (cached, count))
        expect_eq(read, 0, "blocks read from disk for blocks computed again in the pool")
    elif args.phase == "restart":
        expect(cached >= whole, "after a restart only %s of %d tokens cached" % (cached, count))
        expect(read * BLOCK_SIZE >= whole, "%d blocks read for %d cached tokens" % (read, cached))
    else:
        expect_eq(cached, 0, "cached_tokens past a damaged first block")
        expect_eq(read, 0, "blocks read past a damaged first block")
        expect(metric(after, DISK_BLOCKS) > 0, "the undamaged blocks were dropped too")
    expect_eq(out, saved, "greedy output after a %s" % args.phase)


if __name__ == "__main__":
    run(main)
