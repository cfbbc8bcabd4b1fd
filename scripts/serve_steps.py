#!/usr/bin/env python3
"""The engine's time per decode step from a server's log (`scripts/gpu_run.sh serve`).

Usage: serve_steps.py SERVE.LOG OUTPUT_LEN

Each request's time runs from the scheduler's `queued` line to its `finished` line; with
requests of OUTPUT_LEN tokens run one at a time, that time over OUTPUT_LEN is the engine's
time per step (the prefill included, spread over the steps). Prints the mean, the median and
the range over the requests that ran alone (no other request's time overlapping theirs).
"""
import re
import statistics
import sys
from datetime import datetime

STAMP = re.compile(
    r"^(\S+Z) .*peregrine_actors::scheduler(?:::\w+)?: (queued|finished) request_id=(\S+)"
)


def main(path, output_len):
    queued, finished = {}, {}
    for line in open(path):
        m = STAMP.match(line)
        if m:
            at = datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
            (queued if m.group(2) == "queued" else finished)[m.group(3)] = at
    spans = [(queued[r], finished[r]) for r in queued if r in finished]
    alone = [
        (end - start).total_seconds() * 1e3 / output_len
        for start, end in spans
        if not any(s < end and start < e for s, e in spans if (s, e) != (start, end))
    ]
    if not alone:
        print("serve_steps: no request ran alone")
        return
    print(f"engine ms/step over {len(alone)} requests run alone: mean {statistics.mean(alone):.3f}, "
          f"median {statistics.median(alone):.3f}, range {min(alone):.3f}-{max(alone):.3f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
