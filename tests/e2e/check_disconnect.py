"""Scenario 4: a client that closes its connection mid-stream is cancelled: its KV blocks are
freed (the KV and queue gauges return to their idle values within a few seconds), it
generates no more tokens, and request_success_total{finished_reason="abort"} counts it.

With --whole, the same for a client that sends a request without `stream` and closes the
connection while the server is still generating the answer."""

import json
import socket
import time

from e2e_common import (
    RawStream,
    connection,
    expect,
    expect_eq,
    idle,
    log,
    metric,
    metrics,
    parser,
    run,
    wait_for,
)

ABORTS = 'peregrine:request_success_total{finished_reason="abort"}'
GENERATED = "peregrine:generation_tokens_total"
USAGE = "peregrine:kv_cache_usage_perc"


def main():
    p = parser(__doc__)
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--whole", action="store_true", help="whole (non-streamed) requests")
    args = p.parse_args()
    base, model = args.base, args.model

    # One short request first: a fresh server may not export its gauges before its first
    # step (check_metrics.py checks that separately).
    warm = RawStream(base, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2, "stream": True})
    expect_eq(list(warm.events())[-1], "[DONE]", "the warm-up stream's end")
    wait_for(lambda: idle(metrics(base)), 5, "the KV metrics showing an idle server before the test")
    for path, body in [
        ("/v1/completions", {"prompt": "the quick brown fox"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "the lazy dog"}]}),
    ]:
        start = metrics(base)
        body = dict(body, model=model, max_tokens=args.max_tokens, ignore_eos=True)
        if args.whole:
            # Send the request, wait until it runs, and hang up before the answer.
            conn = connection(base)
            conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            wait_for(
                lambda: metric(base, GENERATED) - metric(start, GENERATED) >= 2,
                10,
                "%s: the whole request generating" % path,
                interval=0.005,
            )
            hang_up = conn
        else:
            stream = RawStream(base, path, dict(body, stream=True))
            expect_eq(stream.status, 200, "%s stream status" % path)
            events = stream.events()
            first, second = next(events), next(events)
            expect(isinstance(first, dict) and isinstance(second, dict), "two chunks: %r %r" % (first, second))
            hang_up = stream
        # The request holds blocks now (unless it finished already, which would void the test).
        during = metrics(base)
        expect(
            metric(during, USAGE) > 0 and metric(during, "peregrine:num_requests_running") == 1,
            "%s: the request is not running with blocks: %r" % (path, during),
        )
        close(hang_up)
        closed = time.monotonic()
        after = wait_for(lambda: idle(metrics(base)), 5, "%s: the KV metrics returning to idle after the disconnect" % path)
        log("%s: idle %.3fs after the disconnect" % (path, time.monotonic() - closed))
        generated = metric(after, GENERATED) - metric(start, GENERATED)
        expect(
            generated < args.max_tokens,
            "%s: the request was not cancelled: all %d tokens were generated for a client that "
            "hung up after %d" % (path, generated, metric(during, GENERATED) - metric(start, GENERATED)),
        )
        expect_eq(metric(after, ABORTS) - metric(start, ABORTS), 1, "%s: %s increase" % (path, ABORTS))
        time.sleep(0.3)
        later = metric(base, GENERATED) - metric(start, GENERATED)
        expect_eq(later, generated, "%s: tokens generated after the request was cancelled" % path)
        log("%s: cancelled after %d of %d tokens" % (path, generated, args.max_tokens))

    # The server still serves.
    stream = RawStream(base, "/v1/completions", {"model": model, "prompt": "hello", "max_tokens": 3, "stream": True})
    expect_eq(list(stream.events())[-1], "[DONE]", "a stream after the disconnects")


def close(connection_or_stream):
    """Closes a connection at once, as a client that goes away does."""
    if isinstance(connection_or_stream, RawStream):
        connection_or_stream.close()
        return
    sock = connection_or_stream.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    connection_or_stream.close()


if __name__ == "__main__":
    run(main)
