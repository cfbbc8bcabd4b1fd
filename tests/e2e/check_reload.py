"""Scenario 8: hot reload of the configuration file.

The server reads its configuration through a symlink (`--link`). The script stages each new
version under `--staged` and swaps the link atomically, which the file watcher (watching the
folder of `--watched`, the link's first target) does not see, so that each step is reloaded
by exactly the trigger it tests:

  a. an invalid file (max_num_seqs = 0, then broken TOML), POST /admin/reload: 400 naming
     the field; /admin/config still shows the running values, secrets masked;
  b. a file changing block_size (restart-only): 400 naming block_size;
  c. with 8 streams in flight under max_num_seqs = 4, a file with max_num_seqs = 2 and
     api_keys = ["k2"]: 200; every stream finishes normally; no more than 2 run afterwards;
     /admin/config shows 2; k2 is accepted and k1 refused;
  d. SIGHUP reloads a staged file (max_num_seqs = 3, api_keys = ["k3"]);
  e. an edit of the watched file reloads it (max_num_seqs = 5, api_keys = ["k5"]).
"""

import os
import signal
import threading
import time

from e2e_common import (
    RawStream,
    expect,
    expect_eq,
    expect_error,
    get,
    log,
    metrics,
    parser,
    post,
    run,
    wait_for,
)


def main():
    p = parser(__doc__)
    p.add_argument("--admin-token", required=True)
    p.add_argument("--link", required=True)
    p.add_argument("--watched", required=True)
    p.add_argument("--staged", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=1500)
    args = p.parse_args()
    base, model, admin = args.base, args.model, args.admin_token
    versions = [0]

    def stage(text):
        """Points the link at a new file holding `text` (atomically, unseen by the watcher)."""
        versions[0] += 1
        target = os.path.join(args.staged, "v%d.toml" % versions[0])
        with open(target, "w") as f:
            f.write(text)
        point_link(target)

    def point_link(target):
        tmp = args.link + ".tmp"
        if os.path.lexists(tmp):
            os.remove(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, args.link)

    def live():
        resp = get(base, "/admin/config", token=admin)
        expect_eq(resp.status, 200, "GET /admin/config (%r)" % resp)
        for secret in ('"k1"', '"k2"', '"k3"', '"k5"', '"%s"' % admin):
            expect(secret not in resp.body, "/admin/config shows the secret %s: %s" % (secret, resp.body))
        return resp.json()

    def expect_live(max_num_seqs, what):
        config = live()
        expect_eq(config["max_num_seqs"], max_num_seqs, "%s: /admin/config max_num_seqs" % what)
        expect_eq(config["api_keys"], ["***"], "%s: /admin/config api_keys (masked)" % what)
        expect_eq(config["admin_token"], "***", "%s: /admin/config admin_token (masked)" % what)
        expect_eq(config["block_size"], 16, "%s: /admin/config block_size" % what)
        return config

    def key_works(key):
        resp = post(base, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2}, token=key)
        if resp.status == 200:
            return True
        expect_error(resp, 401, ["API key"], what="a completion with key %r" % key)
        return False

    def expect_keys(accepted, refused, what):
        for key in accepted:
            expect(key_works(key), "%s: key %r is refused" % (what, key))
        for key in refused:
            expect(not key_works(key), "%s: key %r is still accepted" % (what, key))

    def reload():
        return post(base, "/admin/reload", token=admin)

    # The starting point.
    expect_live(4, "at start")
    expect_keys(["k1"], ["k2", None], "at start")
    expect_error(post(base, "/admin/reload"), 401, ["admin token"], what="reload without the admin token")
    expect_error(post(base, "/admin/reload", token="k1"), 401, ["admin token"], what="reload with a wrong admin token")

    # a. Invalid files are refused, naming the problem; nothing changes.
    log("a. invalid files")
    stage('max_num_seqs = 0\napi_keys = ["k2"]\n')
    expect_error(reload(), 400, ["max_num_seqs"], what="reload of max_num_seqs = 0")
    expect_live(4, "after max_num_seqs = 0")
    stage('max_num_seqs = "many"\napi_keys = ["k2"]\n')
    expect_error(reload(), 400, ["max_num_seqs"], what="reload of max_num_seqs = \"many\"")
    stage('max_num_seqs = 2\napi_keys = ["k2"\n')
    expect_error(reload(), 400, ["config.toml"], what="reload of broken TOML")
    expect_live(4, "after broken TOML")
    expect_keys(["k1"], ["k2"], "after the refused reloads")

    # b. A field that needs a restart is refused by name.
    log("b. a restart-only field")
    stage('max_num_seqs = 2\napi_keys = ["k2"]\nblock_size = 32\n')
    expect_error(reload(), 400, ["block_size"], what="reload changing block_size")
    expect_live(4, "after the block_size change")
    expect_keys(["k1"], ["k2"], "after the block_size change")

    # c. max_num_seqs and the keys change under load, dropping nothing.
    log("c. reload under load")
    n = args.streams
    results = [None] * n
    chunks_seen = [0] * n

    def worker(i):
        try:
            body = {
                "model": model,
                "prompt": "stream %d: the quick brown fox" % i,
                "max_tokens": args.max_tokens,
                "stream": True,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            }
            stream = RawStream(base, "/v1/completions", body, token="k1", timeout=300)
            expect_eq(stream.status, 200, "stream %d status" % i)
            finishes, usage, errors, done = [], None, [], False
            for event in stream.events():
                if event == "[DONE]":
                    done = True
                    continue
                if "error" in event:
                    errors.append(event["error"])
                    continue
                chunks_seen[i] += 1
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event["choices"]:
                    if choice.get("finish_reason"):
                        finishes.append(choice["finish_reason"])
            stream.close()
            results[i] = (finishes, usage, errors, done)
        except Exception as err:  # noqa: BLE001
            results[i] = err

    samples = []  # (seconds since the reload or None before it, running, waiting)
    reloaded_at = [None]
    stop_sampling = threading.Event()

    def sampler():
        while not stop_sampling.is_set():
            m = metrics(base)
            at = None if reloaded_at[0] is None else time.monotonic() - reloaded_at[0]
            samples.append((at, m.get("peregrine:num_requests_running"), m.get("peregrine:num_requests_waiting")))
            time.sleep(0.01)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    sampling = threading.Thread(target=sampler)
    sampling.start()
    try:
        full = wait_for(
            lambda: [m for m in [metrics(base)] if m.get("peregrine:num_requests_running") == 4 and m.get("peregrine:num_requests_waiting") == n - 4],
            20,
            "4 running and %d waiting under max_num_seqs = 4" % (n - 4),
            interval=0.005,
        )
        expect(full, "never saw the load")
        stage('max_num_seqs = 2\napi_keys = ["k2"]\n')
        resp = reload()
        reloaded_at[0] = time.monotonic()
        expect_eq(resp.status, 200, "reload under load (%r)" % resp)
        message = resp.json().get("message", "")
        for field in ("max_num_seqs", "api_keys"):
            expect(field in message, "the reload's answer does not name %s: %r" % (field, resp.body))
        in_flight = sum(1 for r in results if r is None)
        log("reloaded with %d of %d streams in flight: %s" % (in_flight, n, resp.body))
        expect(in_flight > 0, "every stream had finished before the reload: the test needs longer streams")
        for t in threads:
            t.join(timeout=300)
    finally:
        stop_sampling.set()
        sampling.join()
    expect(not any(t.is_alive() for t in threads), "some streams never finished")
    for i, result in enumerate(results):
        expect(not isinstance(result, Exception), "stream %d failed: %r" % (i, result))
        finishes, usage, errors, done = result
        expect_eq(errors, [], "stream %d's error events" % i)
        expect(done, "stream %d did not end with [DONE]" % i)
        expect_eq(finishes, ["length"], "stream %d's finish_reasons" % i)
        expect(usage is not None, "stream %d has no usage" % i)
        expect_eq(usage["completion_tokens"], args.max_tokens, "stream %d's completion_tokens" % i)
    after = [(at, running, waiting) for at, running, waiting in samples if at is not None]
    expect(after, "no metrics sampled after the reload")
    first_low = next((k for k, (_, running, _) in enumerate(after) if running is not None and running <= 2), None)
    expect(first_low is not None, "num_requests_running never fell to 2 after the reload: %r" % after[:50])
    over = [s for s in after[first_low:] if s[1] is not None and s[1] > 2]
    expect(not over, "more than 2 requests ran after max_num_seqs became 2: %r" % over[:10])
    binding = [s for s in after if s[1] == 2 and (s[2] or 0) > 0]
    expect(binding, "never saw 2 running with more waiting after the reload: %r" % after[:50])
    log("after the reload: %d samples, running <= 2 from %.3fs on, 2 running with others waiting in %d samples"
        % (len(after), after[first_low][0], len(binding)))
    expect_live(2, "after the reload under load")
    expect_keys(["k2"], ["k1", None], "after the reload under load")

    # d. SIGHUP.
    log("d. SIGHUP")
    stage('max_num_seqs = 3\napi_keys = ["k3"]\n')
    time.sleep(0.5)
    expect_live(2, "after staging without a trigger (the test expects the watcher not to see the link swap)")
    os.kill(args.pid, signal.SIGHUP)
    wait_for(lambda: live()["max_num_seqs"] == 3, 5, "max_num_seqs 3 after SIGHUP")
    expect_keys(["k3"], ["k2"], "after SIGHUP")

    # e. An edit of the watched file.
    log("e. file change")
    point_link(args.watched)
    time.sleep(0.5)
    expect_live(3, "after pointing the link back without a trigger")
    with open(args.watched, "w") as f:
        f.write('max_num_seqs = 5\napi_keys = ["k5"]\n')
    wait_for(lambda: live()["max_num_seqs"] == 5, 5, "max_num_seqs 5 after editing the watched file")
    expect_keys(["k5"], ["k3"], "after the file change")
    with open(args.watched, "w") as f:
        f.write('max_num_seqs = 5\napi_keys = ["k5"]\nblock_size = 64\n')
    time.sleep(1.0)
    expect_live(5, "after an edit changing block_size")


if __name__ == "__main__":
    run(main)
