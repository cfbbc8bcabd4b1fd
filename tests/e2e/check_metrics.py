"""The KV and queue gauges exist with their idle values on a freshly started server, before
any request (a dashboard or an `absent()` alert should not have to wait for traffic), and
return to those values after a request."""

from e2e_common import IDLE, RawStream, expect, expect_eq, idle, log, metrics, parser, run, wait_for


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


if __name__ == "__main__":
    run(main)
