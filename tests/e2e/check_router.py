"""Three Peregrine replicas behind the routers built for vLLM and SGLang, installed from
PyPI: vLLM's router (`vllm-router`, as deploy/router/run.sh runs it) and the Shepherd model
gateway (`smg launch`, the SGLang router's successor). For each router:

- round robin: every request answered, each replica within 2 of an even share;
- cache-aware routing: requests sharing a long prefix land where it is cached, so the
  replicas' prefix-cache hits (their own /metrics) make a larger share of the prompt tokens
  than under round robin, with new prefixes for each run;
- behind vllm-router, also its `kv_aware` policy, which reads where each prefix is cached
  from the replicas' KV-cache events (`--kv-events-config`, ZeroMQ) rather than guessing
  from the requests it routed: its hit rate too is above round robin's.

Then, behind each router, a replica killed (SIGKILL) mid-run: every request sent after the
kill is answered (the router retries on the others and stops sending to the dead one), and
a request in flight on it ends with an error rather than hanging.
"""

import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from e2e_common import expect, get, log, metrics, parser, post, run

GROUPS = 4
PER_GROUP = 6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Each router's console script, run through this interpreter (the tests' venv is built in a
# temporary folder and moved into place, so the scripts' own #! lines name a path that is
# gone), and its name for the warning log level.
ROUTERS = {
    "vllm-router": ([sys.executable, "-c", "import sys; from vllm_router.launch_router import main; "
                     "sys.argv[0] = 'vllm-router'; sys.exit(main())"], "warning"),
    "smg": ([sys.executable, "-c", "import sys; from smg.cli import main; sys.argv[0] = 'smg'; "
             "sys.exit(main())", "launch"], "warn"),
}


class Router:
    """The router `name` over `replicas` with `policy` (and `extra` arguments), probing each
    replica's /ready."""

    def __init__(self, name, replicas, policy, extra=()):
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        prefix, warning = ROUTERS[name]
        command = prefix + ["--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
                   "--worker-urls", *replicas, "--health-check-endpoint", "/ready",
                   "--health-check-interval-secs", "1", "--log-level", warning,
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), *extra]
        # Its log to a file: a pipe nobody reads would fill and stall it.
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            expect(self.process.poll() is None, "%s exited: %s" % (name, self.tail()))
            try:
                if get(self.base, "/v1/models", timeout=5).status == 200:
                    log("%s (%s) on %s" % (name, policy, self.base))
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.3)
        expect(False, "%s did not answer within 30 s: %s" % (name, self.tail()))

    def tail(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def replica_counts(replicas):
    """Per replica: (finished requests, prefix-cache hit tokens, prompt tokens)."""
    out = []
    for base in replicas:
        samples = metrics(base)
        done = sum(v for k, v in samples.items() if k.startswith("peregrine:request_success_total"))
        out.append((done, samples.get("peregrine:prefix_cache_hits_total", 0.0),
                    samples.get("peregrine:prompt_tokens_total", 0.0)))
    return out


def send_all(base, model, prompts, concurrency, max_tokens, on_done=None):
    """Sends each prompt as a completion, `concurrency` at a time: [(start, end, status)].
    `on_done(n)` is called as the n-th request ends."""
    results = [None] * len(prompts)
    lock = threading.Lock()
    queue = list(enumerate(prompts))
    done = [0]

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                i, prompt = queue.pop(0)
            start = time.monotonic()
            try:
                resp = post(base, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                      "temperature": 0}, timeout=60)
                status = resp.status
            except (OSError, http.client.HTTPException) as err:
                status = type(err).__name__
            results[i] = (start, time.monotonic(), status)
            with lock:
                done[0] += 1
                n = done[0]
            if on_done:
                on_done(n)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    expect(all(r is not None for r in results), "some requests never ended")
    return results


def prompts(tag):
    """PER_GROUP prompts in each of GROUPS groups, each group sharing a prefix of about 400
    tokens (the tiny model's tokenizer is byte-level), interleaved."""
    out = []
    for i in range(PER_GROUP):
        for g in range(GROUPS):
            prefix = " ".join("%s-%d-%d" % (tag, g, w) for w in range(50))
            out.append("%s question %d:" % (prefix, i))
    return out


def routed_run(name, replicas, model, policy, tag, extra=()):
    router = Router(name, replicas, policy, extra)
    try:
        before = replica_counts(replicas)
        results = send_all(router.base, model, prompts(tag), 4, 4)
        after = replica_counts(replicas)
    finally:
        router.close()
    failed = [r for r in results if r[2] != 200]
    expect(not failed, "%s: %d of %d requests failed: %r" % (policy, len(failed), len(results), failed[:3]))
    share = [a[0] - b[0] for a, b in zip(after, before)]
    hits = sum(a[1] - b[1] for a, b in zip(after, before))
    tokens = sum(a[2] - b[2] for a, b in zip(after, before))
    rate = hits / max(tokens, 1)
    log("%s %s: %d requests answered, per replica %r, prefix-cache hits %d of %d prompt tokens (%.2f)"
        % (name, policy, len(results), share, hits, tokens, rate))
    return share, rate


def main():
    p = parser(__doc__)
    p.add_argument("--replicas", nargs=3, required=True)
    p.add_argument("--spare", required=True, help="a fourth replica, for the second kill run")
    p.add_argument("--kill-pids", type=int, nargs=2, required=True,
                   help="the processes of the third replica and of the spare")
    p.add_argument("--kv-events", nargs=3, required=True,
                   help="each replica's KV-cache event endpoint, as tcp://HOST:PORT")
    p.add_argument("--model-dir", required=True, help="the served model's folder (its tokenizer)")
    args = p.parse_args()
    replicas, model = args.replicas, args.model
    n = GROUPS * PER_GROUP

    for name in ROUTERS:
        share, round_robin = routed_run(name, replicas, model, "round_robin", name + "-rr")
        expect(sum(share) == n, "%s round robin: the replicas finished %d requests, not %d" % (name, sum(share), n))
        expect(all(abs(s - n / 3) <= 2 for s in share),
               "%s round robin: shares %r, not within 2 of %d" % (name, share, n // 3))
        share, cache_aware = routed_run(name, replicas, model, "cache_aware", name + "-ca")
        expect(sum(share) == n, "%s cache-aware: the replicas finished %d requests, not %d" % (name, sum(share), n))
        expect(cache_aware > round_robin,
               "%s: cache-aware routing's prefix-cache hit rate %.2f is not above round robin's %.2f"
               % (name, cache_aware, round_robin))
        log("%s: prefix-cache hit rate, cache-aware %.2f against round robin %.2f (%.2fx)"
            % (name, cache_aware, round_robin, cache_aware / max(round_robin, 1e-9)))

    # vLLM's router's KV-aware policy over the replicas' events (the default topic, "").
    sources = []
    for url, endpoint in zip(replicas, args.kv_events):
        sources += ["--kv-event-source", "%s=%s" % (url, endpoint)]
    sources += ["--kv-event-block-size", "16", "--kv-event-model", args.model_dir]
    share, kv_aware = routed_run("vllm-router", replicas, model, "kv_aware", "vllm-router-kv", sources)
    expect(sum(share) == n, "kv-aware: the replicas finished %d requests, not %d" % (sum(share), n))
    expect(kv_aware > round_robin,
           "vllm-router: kv-aware routing's prefix-cache hit rate %.2f is not above round robin's %.2f"
           % (kv_aware, round_robin))
    log("vllm-router: prefix-cache hit rate, kv-aware (KV events) %.2f against round robin %.2f (%.2fx)"
        % (kv_aware, round_robin, kv_aware / max(round_robin, 1e-9)))

    # Behind each router in turn, its pool's last replica killed: the third behind
    # vllm-router, then a spare fourth (put in its place) behind smg.
    for name, pool, pid in [("vllm-router", replicas, args.kill_pids[0]),
                            ("smg", replicas[:2] + [args.spare], args.kill_pids[1])]:
        kill_run(name, pool, model, pid)


def kill_run(name, pool, model, pid):
    """60 requests of 48 tokens at concurrency 6 through `name` over `pool`; once a fifth have
    ended, so that some are in flight on it and most are still to be sent, the pool's last
    replica (process `pid`) is killed."""
    router = Router(name, pool, "round_robin")
    try:
        killed = {}
        total = 60

        def kill_at(n):
            if n == total // 5 and "at" not in killed:
                killed["at"] = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                log("%s: replica %s killed after %d requests" % (name, pool[-1], n))

        prompts_ = ["%s kill run %d: tell me a story" % (name, i) for i in range(total)]
        results = send_all(router.base, model, prompts_, 6, 48, kill_at)
    finally:
        router.close()
    expect("at" in killed, "%s: the replica was never killed" % name)
    after = [r for r in results if r[0] > killed["at"]]
    before = [r for r in results if r[0] <= killed["at"]]
    failed_after = [r for r in after if r[2] != 200]
    failed_before = [r for r in before if r[2] != 200]
    log("%s kill run: %d requests started before the kill (%d failed: %r), %d after (%d failed)"
        % (name, len(before), len(failed_before), sorted({r[2] for r in failed_before}), len(after),
           len(failed_after)))
    expect(after, "%s: no request started after the kill: the run is too short" % name)
    expect(not failed_after, "%s: requests sent after the kill failed: %r" % (name, failed_after[:3]))
    expect(len(failed_before) <= 6, "%s: %d requests failed, more than were in flight" % (name, len(failed_before)))


if __name__ == "__main__":
    run(main)
