#!/usr/bin/env python3
"""Summarises an `ncu --csv --metrics gpu__time_duration.sum` log of `peregrine bench
latency`: the kernels of the last STEPS decode steps (a step ends with the argmax's
`sample_argmax_finish`), grouped by name, with launches and microseconds per step; with
STEPS 0, every kernel of the log (a log of some kernels only, `ncu -k`), in total.

usage: ncu_step_summary.py NCU.csv [STEPS]
"""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rows = []
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for rec in csv.DictReader(lines):
        if rec.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(rec["Metric Value"].replace(",", ""))
        unit = rec.get("Metric Unit", "ns")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1e-3)
        rows.append((rec["Kernel Name"], value * scale))
    ends = [i for i, (name, _) in enumerate(rows) if name.startswith("sample_argmax_finish")]
    if steps == 0:
        window, steps = rows, 1
    elif len(ends) < steps + 1:
        sys.exit(f"{path}: {len(ends)} steps found, need {steps + 1}")
    else:
        window = rows[ends[-steps - 1] + 1 : ends[-1] + 1]
    by_name = collections.OrderedDict()
    for name, us in window:
        count, total = by_name.get(name, (0, 0.0))
        by_name[name] = (count + 1, total + us)
    total = sum(us for _, us in window) / steps
    print(f"{len(window) / steps:.0f} kernels, {total:.1f} us of kernel time per step")
    for name, (count, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{us / steps:10.1f} us {count / steps:6.1f}x  {name[:110]}")


if __name__ == "__main__":
    main()
