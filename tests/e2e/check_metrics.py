"""The KV and queue gauges exist with their idle values on a freshly started server, before
any request (a dashboard or an `absent()` alert should not have to wait for traffic), and
return to those values after a request. After it, the series a vLLM dashboard, vLLM's
production-stack router and the Gateway API inference extension's endpoint picker read are
there under vLLM's names, with vLLM's types, every sample labelled with the served model's
`model_name`, and the same values as Peregrine's own series."""

import re

from e2e_common import IDLE, RawStream, expect, expect_eq, get, idle, log, metrics, parser, run, wait_for

# vLLM's names (vllm/v1/metrics/loggers.py; counters as exposed, with `_total`), their
# Prometheus types, the labels besides model_name, and the Peregrine series each copies.
VLLM = {
    "vllm:num_requests_running": ("gauge", (), "peregrine:num_requests_running"),
    "vllm:num_requests_waiting": ("gauge", (), "peregrine:num_requests_waiting"),
    "vllm:kv_cache_usage_perc": ("gauge", (), "peregrine:kv_cache_usage_perc"),
    "vllm:gpu_cache_usage_perc": ("gauge", (), "peregrine:kv_cache_usage_perc"),
    "vllm:prefix_cache_queries_total": ("counter", (), "peregrine:prefix_cache_queries_total"),
    "vllm:prefix_cache_hits_total": ("counter", (), "peregrine:prefix_cache_hits_total"),
    "vllm:prompt_tokens_total": ("counter", (), "peregrine:prompt_tokens_total"),
    "vllm:generation_tokens_total": ("counter", (), "peregrine:generation_tokens_total"),
    "vllm:request_success_total": ("counter", ("finished_reason",), "peregrine:request_success_total"),
    "vllm:time_to_first_token_seconds": ("histogram", (), "peregrine:time_to_first_token_seconds"),
    "vllm:inter_token_latency_seconds": ("histogram", (), "peregrine:inter_token_latency_seconds"),
    "vllm:time_per_output_token_seconds": ("histogram", (), "peregrine:inter_token_latency_seconds"),
    "vllm:e2e_request_latency_seconds": ("histogram", (), "peregrine:e2e_request_latency_seconds"),
    "vllm:request_queue_time_seconds": ("histogram", (), "peregrine:request_queue_time_seconds"),
}
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def exposition(base):
    """The /metrics text: {family: type} and [(name, {label: value}, value)]."""
    resp = get(base, "/metrics")
    expect_eq(resp.status, 200, "GET /metrics status")
    types, samples = {}, []
    for line in resp.body.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            samples.append((name, dict(_LABEL.findall(labels)), float(value)))
    return types, samples


def check_vllm_names(base, model):
    types, samples = exposition(base)
    own = {(name, tuple(sorted(labels.items()))): value for name, labels, value in samples}
    for vllm, (kind, labels, peregrine) in VLLM.items():
        expect_eq(types.get(vllm), kind, "the type of %s" % vllm)
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        copies = [(n, l, v) for n, l, v in samples if n in [vllm + s for s in suffixes]]
        expect(copies, "%s has no samples" % vllm)
        for name, got_labels, value in copies:
            expect_eq(got_labels.get("model_name"), model, "%s's model_name" % name)
            rest = {k: v for k, v in got_labels.items() if k != "model_name"}
            for label in labels:
                expect(label in rest, "%s lacks the label %s" % (name, label))
            original = (peregrine + name[len(vllm):], tuple(sorted(rest.items())))
            expect_eq(value, own.get(original), "%s%r against %s" % (name, got_labels, original[0]))
    info = [(l, v) for n, l, v in samples if n == "vllm:cache_config_info"]
    expect_eq(types.get("vllm:cache_config_info"), "gauge", "the type of vllm:cache_config_info")
    expect(len(info) == 1 and info[0][1] == 1.0, "vllm:cache_config_info: %r" % info)
    expect(int(info[0][0].get("block_size", "0")) > 0, "cache_config_info's block_size: %r" % info)
    expect(int(info[0][0].get("num_gpu_blocks", "0")) > 0, "cache_config_info's num_gpu_blocks: %r" % info)
    log("vLLM names: %d families checked, cache_config_info %r" % (len(VLLM), info[0][0]))


def main():
    args = parser(__doc__).parse_args()
    base, model = args.base, args.model
    fresh = metrics(base)
    log("fresh server: %r" % {k: v for k, v in fresh.items() if "bucket" not in k})
    missing = [name for name in IDLE if name not in fresh]
    wrong = {name: fresh[name] for name, value in IDLE.items() if name in fresh and fresh[name] != value}
    stream = RawStream(base, "/v1/completions", {"model": model, "prompt": "hello", "max_tokens": 4, "stream": True})
    expect_eq(list(stream.events())[-1], "[DONE]", "a stream's end")
    after = wait_for(lambda: idle(metrics(base)), 5, "the gauges showing an idle server after a request")
    log("after one request: %r" % {k: after[k] for k in IDLE})
    expect(not missing, "a freshly started server does not export %s (idle values: %r)" % (missing, IDLE))
    expect(not wrong, "a freshly started server exports non-idle values %r (idle values: %r)" % (wrong, IDLE))
    check_vllm_names(base, model)


if __name__ == "__main__":
    run(main)
