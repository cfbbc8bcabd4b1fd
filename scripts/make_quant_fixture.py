#!/usr/bin/env python3
"""Random ggml blocks of every format Peregrine reads, dequantized by gguf-py (llama.cpp's
own Python package, `pip install gguf`), written to kernels/tests/fixtures/ggml_blocks.json
for the kernels' dequantization test. Scales are set to finite f16 values; every other
byte is random. Also float values quantized to Q8_0 by gguf-py (bit-exact with ggml's
`quantize_row_q8_0_ref`), for the test of the kernels' own quantizer.
Usage: python3 scripts/make_quant_fixture.py"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

# (type, elements per block, bytes per block, byte offsets of f16 scales)
FORMATS = [
    ("Q8_0", T.Q8_0, 32, 34, [0]),
    ("Q4_0", T.Q4_0, 32, 18, [0]),
    ("Q4_1", T.Q4_1, 32, 20, [0, 2]),
    ("Q5_0", T.Q5_0, 32, 22, [0]),
    ("Q5_1", T.Q5_1, 32, 24, [0, 2]),
    ("Q4_K", T.Q4_K, 256, 144, [0, 2]),
    ("Q5_K", T.Q5_K, 256, 176, [0, 2]),
    ("Q6_K", T.Q6_K, 256, 210, [208]),
]
BLOCKS = 5

rng = np.random.default_rng(20261201)
out = {}
for name, ty, elems, size, scales in FORMATS:
    raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
    for at in scales:
        values = rng.uniform(-0.05, 0.05, size=BLOCKS).astype(np.float16)
        raw[:, at : at + 2] = values.view(np.uint8).reshape(BLOCKS, 2)
    deq = dequantize(raw.reshape(-1), ty).astype(np.float32).reshape(-1)
    assert deq.size == BLOCKS * elems and np.all(np.isfinite(deq))
    out[name] = {"bytes": raw.reshape(-1).tobytes().hex(), "values": [float(v) for v in deq]}

# Blocks of random scales, one of zeros, and one whose scale is 1 with values on halves
# (ties round away from zero); their own generator, so the blocks above stay as they were.
qrng = np.random.default_rng(20261206)
scales = qrng.uniform(1e-3, 4.0, size=(8, 1))
blocks = [qrng.standard_normal((8, 32)) * scales, np.zeros((1, 32))]
ties = np.array([127.0, -127.0] + [(k - 15) + 0.5 for k in range(30)])
blocks.append(ties.reshape(1, 32))
values = np.concatenate(blocks).astype(np.float32).reshape(-1)
out["quantized_Q8_0"] = {
    "values": [float(v) for v in values],
    "bytes": quantize(values.reshape(-1, 32), T.Q8_0).reshape(-1).tobytes().hex(),
}

path = pathlib.Path(__file__).resolve().parent.parent / "kernels/tests/fixtures/ggml_blocks.json"
path.write_text(json.dumps(out) + "\n")
print(f"wrote {path}")
