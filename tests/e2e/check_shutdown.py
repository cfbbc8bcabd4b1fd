"""Scenario 9: SIGTERM with streams in flight.

--mode drain: the streams are short enough to finish within the shutdown timeout; each
  finishes normally (finish_reason "length", full usage, [DONE]), and a request sent while
  the server drains gets 503 or a refused connection; so does the readiness probe
  (`/ready`), where it gets an answer.
--mode deadline: the streams cannot finish within the (short) shutdown timeout; each is
  cancelled cleanly: an error event (503), then [DONE], soon after the deadline.

The Rust test then checks that the process exits 0 in time.
"""

import http.client
import os
import signal
import threading
import time

from e2e_common import RawStream, expect, expect_eq, get, log, parser, post, run


def main():
    p = parser(__doc__)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--mode", choices=["drain", "deadline"], required=True)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--shutdown-timeout", type=float, default=1.0, help="the server's, for --mode deadline")
    args = p.parse_args()
    base, model, n = args.base, args.model, args.streams
    max_tokens = args.max_tokens or (2000 if args.mode == "drain" else 4000)

    results = [None] * n
    started = [threading.Event() for _ in range(n)]
    ended_at = [None] * n

    def worker(i):
        try:
            body = {
                "model": model,
                "prompt": "stream %d" % i,
                "max_tokens": max_tokens,
                "stream": True,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            }
            stream = RawStream(base, "/v1/completions", body, timeout=120)
            expect_eq(stream.status, 200, "stream %d status" % i)
            finishes, usage, errors, done, chunks = [], None, [], False, 0
            for event in stream.events():
                if event == "[DONE]":
                    done = True
                    continue
                if "error" in event:
                    errors.append(event["error"])
                    continue
                chunks += 1
                started[i].set()
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event["choices"]:
                    if choice.get("finish_reason"):
                        finishes.append(choice["finish_reason"])
            ended_at[i] = time.monotonic()
            stream.close()
            results[i] = (finishes, usage, errors, done, chunks)
        except Exception as err:  # noqa: BLE001
            results[i] = err
        finally:
            started[i].set()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for event in started:
        expect(event.wait(30), "a stream never started")
    running = sum(1 for r in results if r is None)
    expect_eq(running, n, "streams still in flight when SIGTERM is sent")
    os.kill(args.pid, signal.SIGTERM)
    signalled = time.monotonic()
    log("SIGTERM sent with %d streams in flight" % running)

    if args.mode == "drain":
        # A new request while draining: 503, or a refused connection.
        time.sleep(0.2)
        try:
            resp = post(base, "/v1/completions", {"model": model, "prompt": "late", "max_tokens": 2}, timeout=10)
            outcome = "HTTP %d" % resp.status
            expect_eq(resp.status, 503, "a request sent while draining (%r)" % resp)
            error = resp.json().get("error", {})
            expect_eq(error.get("code"), 503, "the 503's error.code")
            log("a request while draining: 503 %s" % error.get("message"))
        except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected) as err:
            outcome = type(err).__name__
            log("a request while draining: %s" % outcome)
        try:
            ready = get(base, "/ready", timeout=10)
            expect_eq(ready.status, 503, "the readiness probe while draining (%r)" % ready)
            log("/ready while draining: 503 %s" % ready.json().get("error", {}).get("message"))
        except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected) as err:
            log("/ready while draining: %s" % type(err).__name__)
        still = sum(1 for r in results if r is None)
        expect(still > 0, "every stream had finished before the late request (%s): the test needs longer streams" % outcome)

    for t in threads:
        t.join(timeout=120)
    expect(not any(t.is_alive() for t in threads), "some streams never ended")
    for i, result in enumerate(results):
        expect(not isinstance(result, Exception), "stream %d failed: %r" % (i, result))
        finishes, usage, errors, done, chunks = result
        expect(done, "stream %d did not end with [DONE]" % i)
        after = ended_at[i] - signalled
        if args.mode == "drain":
            expect_eq(errors, [], "stream %d's error events" % i)
            expect_eq(finishes, ["length"], "stream %d's finish_reasons" % i)
            expect(usage is not None, "stream %d has no usage" % i)
            expect_eq(usage["completion_tokens"], max_tokens, "stream %d's completion_tokens" % i)
            log("stream %d finished normally %.2fs after SIGTERM" % (i, after))
        else:
            expect_eq(finishes, [], "stream %d's finish_reasons (it should have been cancelled)" % i)
            expect_eq(len(errors), 1, "stream %d's error events" % i)
            expect_eq(errors[0].get("code"), 503, "stream %d's error code" % i)
            expect(
                after < args.shutdown_timeout + 3,
                "stream %d ended %.2fs after SIGTERM (shutdown timeout %.1fs)" % (i, after, args.shutdown_timeout),
            )
            log("stream %d cancelled %.2fs after SIGTERM: %s" % (i, after, errors[0].get("message")))


if __name__ == "__main__":
    run(main)
