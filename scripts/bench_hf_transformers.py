"""Decode and prefill speed of Hugging Face transformers (eager, bf16, random weights) on the
shapes of a config.json, for the same-run baseline of `peregrine bench latency`.

    python3 scripts/bench_hf_transformers.py --config scripts/configs/llama-3.2-1b.json \
        --batch-sizes 1,64 --input-len 128 --output-len 128
"""

import argparse
import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def timed_generate(model, ids, new_tokens):
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    args = p.parse_args()
    with open(args.config) as f:
        raw = json.load(f)
    config = LlamaConfig(**raw)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    print("command: %s" % " ".join(sys.argv))
    print("transformers eager, bf16, random weights of %s on %s" % (args.config, torch.cuda.get_device_name()))
    print("%6s %10s %14s %12s" % ("batch", "prefill_ms", "decode_ms/step", "decode_tok/s"))
    with torch.inference_mode():
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            ids = torch.randint(0, config.vocab_size, (batch, args.input_len), device="cuda")
            timed_generate(model, ids, 4)  # warm-up
            prefill = timed_generate(model, ids, 1)
            total = timed_generate(model, ids, args.output_len)
            step = (total - prefill) / (args.output_len - 1)
            print("%6d %10.2f %14.3f %12.0f" % (batch, prefill * 1e3, step * 1e3, batch / step))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
