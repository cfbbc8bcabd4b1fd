#!/usr/bin/env python3
"""What the small operations between two decode graphs cost the device (PyTorch on the GPU
machine; `scripts/gpu_run.sh opcosts`).

A CUDA graph of about 100 us of kernels is replayed in a loop, each replay followed by some
of the operations a decode step queues between its graph and the next: copying a step's
ids to page-locked memory, copying them into the next step's token input, recording an
event, staging the next step's metadata from pageable memory (one i32 and one i64 array),
or a one-kernel copy instead of a copy operation. The host queues far ahead, so the time
per replay is the device's; each line prints it less the bare replay's.
"""
import time

import torch


def main():
    dev = torch.device("cuda")
    x = torch.randn(1 << 16, device=dev)
    ids = torch.zeros(64, dtype=torch.int32, device=dev)
    pinned = torch.zeros(64, dtype=torch.int32).pin_memory()
    tokens = torch.zeros(64, dtype=torch.int32, device=dev)
    tokens64 = torch.zeros(64, dtype=torch.int64, device=dev)
    host_ints = torch.arange(600, dtype=torch.int32)
    host_longs = torch.arange(64, dtype=torch.int64)
    dev_ints = torch.zeros(600, dtype=torch.int32, device=dev)
    dev_longs = torch.zeros(64, dtype=torch.int64, device=dev)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for _ in range(3):
            for _ in range(40):
                x.mul_(1.0000001)
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(40):
                x.mul_(1.0000001)
    event = torch.cuda.Event()
    ops = {
        "bare": [],
        "d2h ids->pinned": [lambda: pinned.copy_(ids, non_blocking=True)],
        "d2d ids->tokens (copy)": [lambda: tokens.copy_(ids)],
        "ids->tokens (kernel, i32->i64)": [lambda: tokens64.copy_(ids)],
        "event record": [lambda: event.record(stream)],
        "h2d ints (pageable)": [lambda: dev_ints.copy_(host_ints, non_blocking=True)],
        "h2d ints+longs (pageable)": [
            lambda: dev_ints.copy_(host_ints, non_blocking=True),
            lambda: dev_longs.copy_(host_longs, non_blocking=True),
        ],
        "ahead now: d2h, event, h2d x2, d2d": [
            lambda: pinned.copy_(ids, non_blocking=True),
            lambda: event.record(stream),
            lambda: dev_ints.copy_(host_ints, non_blocking=True),
            lambda: dev_longs.copy_(host_longs, non_blocking=True),
            lambda: tokens.copy_(ids),
        ],
        "twice-mode: h2d x2": [
            lambda: dev_ints.copy_(host_ints, non_blocking=True),
            lambda: dev_longs.copy_(host_longs, non_blocking=True),
        ],
    }
    replays = 2000
    with torch.cuda.stream(stream):
        base = None
        for name, queue in list(ops.items()) * 2:
            for _ in range(50):
                graph.replay()
                for op in queue:
                    op()
            stream.synchronize()
            start = time.perf_counter()
            for _ in range(replays):
                graph.replay()
                for op in queue:
                    op()
            stream.synchronize()
            us = (time.perf_counter() - start) / replays * 1e6
            if name == "bare":
                base = us
            print(f"{name:40s} {us:8.2f} us per replay, +{us - base:6.2f}")


if __name__ == "__main__":
    main()
