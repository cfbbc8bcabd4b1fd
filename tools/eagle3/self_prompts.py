#!/usr/bin/env python3
"""Makes training prompts that the target writes itself: a second prompt source for the
EAGLE-3 head, independent of build_prompts.py's templates.

    tools/eagle3/self_prompts.py OUT.jsonl [--count 1000] [--url http://127.0.0.1:8000]
        [--model smollm2-135m] [--seeds tools/eagle3/seeds.jsonl] [--seed 1]
        [--temperature 1.0] [--top-p 0.95] [--max-tokens 200] [--concurrency 64]
        [--deadline S] [--max-rounds N] [--multi-turn 0.2] [--max-overlap 0.5] [--ngram 3]
        [--exclude tools/eagle3/prompts/heldout.jsonl]

Each round picks a task and three of its hand-written seed requests (seeds.jsonl, one
{"task", "text"} a line; the round's own RNG comes from --seed and the round number), shows
them to the running Peregrine server (/v1/chat/completions, hot sampling with a per-request
seed) and asks for one new user message about that task. The reply is cleaned (labels,
quotes and trailing commentary removed) and rejected if too short, too long, cut off,
repetitive, or if it reads like an assistant's answer. A kept message must not overlap
the seeds, the --exclude prompts (the held-out set) or any message kept before: word
n-gram overlap: at most --max-overlap of its n-grams may occur in any one of those.
For a --multi-turn share of the kept messages the model is then asked for the user's
follow-up, making a two-turn item. Rounds run until --count messages are kept, --max-rounds
rounds have run, or --deadline seconds have passed.

OUT gets one item a line in the prompt format generate.py reads:
  {"id": "self-00000", "kind": "chat", "category": TASK, "turns": [...], "source": "self"}
and a summary is printed: requests, kept, rejections by reason, time.
Standard library only.
"""

import argparse
import collections
import json
import os
import random
import re
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))

ASK = ("Here are examples of messages users send to an AI assistant:\n\n{examples}\n\n"
       "Write one new, different message a user might send about {task}. "
       "Reply with the message only.")
ASK_FOLLOW_UP = ("A user sent this message to an AI assistant:\n\n\"{first}\"\n\n"
                 "The assistant answered it. Write the user's next message in the same "
                 "conversation: a short follow-up question or request. "
                 "Reply with the message only.")

# Labels a reply may put before the message: "Message 4:", "**New request:**", "User:".
LABEL = re.compile(r"^\s*(?:[*_#>]+\s*)*(?:here(?:'s| is)\s+)?(?:(?:a|an|the|my|one)\s+)?"
                   r"(?:(?:new|different|example|user'?s?|next|follow[- ]up)\s+)*"
                   r"(?:message|request|prompt|query|question|user|example|follow[- ]up)"
                   r"(?:\s*#?\d+)?\s*(?:[*_]+\s*)?(?::|(?<=\s)[-–—])\s*(?:[*_]+)?\s*", re.I)
NUMBERED = re.compile(r"^\s*\d+[.)]\s+")
# A first line that only introduces the message: "Sure! Here is a new message:".
PREAMBLE = re.compile(r"^(?:sure|okay|ok|certainly|of course|here)\b[^\n]*:\s*\n", re.I)
# Openings of an assistant's answer rather than a user's request.
ANSWER = re.compile(r"^(?:sure\b|certainly\b|of course\b|absolutely\b|great question|"
                    r"as an ai\b|i'?m sorry|i am sorry|i can'?t\b|"
                    r"i cannot\b|i'?d be (?:happy|glad)|i would be (?:happy|glad)|"
                    r"how can i (?:help|assist)|hello!? how can i)", re.I)
ECHO = re.compile(r"users send to an ai assistant|reply with the message only|"
                  r"write one new, different message", re.I)
QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}


def clean_reply(reply, truncated=False, min_words=4, max_words=150):
    """The user message in a model's reply and None, or None and the reason it is rejected.

    Drops a preamble line and leading labels, takes what a pair of quotes encloses, keeps
    the first paragraph (extended while it is under min_words, ends with ':', leaves a
    ``` fence open or is followed by a fenced block), and strips stray quotes and markdown
    emphasis. `truncated` (the reply hit max_tokens) rejects a message that runs to the
    end of the reply."""
    text = PREAMBLE.sub("", reply.strip().replace("\r\n", "\n"), count=1).strip()
    for _ in range(2):
        text = NUMBERED.sub("", LABEL.sub("", text, count=1), count=1).strip()
    close = QUOTES.get(text[:1])
    m = close and re.compile(re.escape(close) + r"(?=[\s.,!?]|$)").search(text, 1)
    # A quoted message: keep the inside unless the quote is only a short phrase at the start.
    if m and (len(text[1:m.start()].split()) >= min_words or not text[m.end():].strip()):
        text, truncated = text[1:m.start()], False
    blocks = [b.strip() for b in re.split(r"\n\s*\n", text) if b.strip()]
    if not blocks:
        return None, "empty"
    take = 1
    while take < len(blocks):
        head = "\n\n".join(blocks[:take])
        if (len(head.split()) < min_words or head.endswith(":")
                or head.count("```") % 2 == 1 or blocks[take].startswith("```")):
            take += 1
        else:
            break
    if truncated and take == len(blocks):
        return None, "cut off"
    text = "\n\n".join(blocks[:take])
    text = text.strip().strip("*").strip()
    if text[:1] in QUOTES and text.count(text[0]) == 1:
        text = text[1:]
    if text[-1:] in QUOTES.values() and text.count(text[-1]) == 1:
        text = text[:-1]
    text = text.strip()
    n = len(text.split())
    if ECHO.search(text):
        return None, "echoes the instruction"
    if n < min_words:
        return None, "too short"
    if n > max_words:
        return None, "too long"
    if ANSWER.match(text):
        return None, "reads like an answer"
    words = tokens(text)
    if len(words) >= 20 and len(set(words)) < 0.4 * len(words):
        return None, "repetitive"
    return text, None


def tokens(text):
    """Lowercased words and numbers of a text."""
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower())


def ngrams(text, n=3):
    """The set of word n-grams of a text (the whole text as one gram if it is shorter)."""
    words = tokens(text)
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def overlap(a, b):
    """The share of n-gram set `a` that `b` holds (containment of a in b): how much of a
    new text is already there. A long text that merely contains a short stock phrase
    scores low; a text copied with a sentence added scores high."""
    if not a:
        return 0.0
    return len(a & b) / len(a)


class NgramIndex:
    """Near-duplicate detection over many short texts by word n-gram overlap.

    An inverted index maps each n-gram to the texts holding it, so a look-up touches only
    texts that share a gram with the query. Grams held by more than `common` texts (stock
    phrases such as "can you help") are not followed to find candidates, which keeps a
    look-up fast at 50,000 texts; they still count in the overlap of the candidates found."""

    def __init__(self, n=3, max_overlap=0.5, common=500):
        self.n, self.max_overlap, self.common = n, max_overlap, common
        self.grams = []  # per text, its n-gram set
        self.postings = collections.defaultdict(list)

    def __len__(self):
        return len(self.grams)

    def add(self, text):
        """Adds a text; returns its id."""
        return self.add_grams(ngrams(text, self.n))

    def add_grams(self, grams):
        i = len(self.grams)
        self.grams.append(grams)
        for g in grams:
            self.postings[g].append(i)
        return i

    def match(self, text):
        """(id, overlap) of the indexed text holding the largest share (above
        max_overlap) of `text`'s n-grams, or None."""
        return self.match_grams(ngrams(text, self.n))

    def match_grams(self, grams):
        hits, skipped = collections.Counter(), 0
        for g in grams:
            ids = self.postings.get(g)
            if ids and len(ids) > self.common:
                skipped += 1
            elif ids:
                hits.update(ids)
        best = None
        for i, shared in hits.items():
            other = self.grams[i]
            # `shared + skipped` bounds the overlap from above: skip hopeless candidates.
            if shared + skipped <= self.max_overlap * len(grams):
                continue
            score = overlap(grams, other)
            if score > self.max_overlap and (best is None or score > best[1]):
                best = (i, score)
        return best

    def add_if_new(self, text):
        """Adds `text` unless it is a near-duplicate. Returns (True, id) or (False, the id
        it duplicates)."""
        grams = ngrams(text, self.n)
        m = self.match_grams(grams)
        if m:
            return False, m[0]
        return True, self.add_grams(grams)


def load_seeds(path):
    """{task: [seed texts]} from a seeds JSONL file."""
    by_task = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            if line.strip():
                s = json.loads(line)
                by_task[s["task"]].append(s["text"])
    return dict(by_task)


def prompt_texts(path):
    """Every user turn / completion prompt of a prompt-format JSONL file."""
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                item = json.loads(line)
                out.extend(item.get("turns") or [item.get("prompt", "")])
    return out


def ask_message(task, examples):
    """The instruction asking for a new message about `task` after `examples`."""
    shown = "\n\n".join(f"Message {i + 1}: {e}" for i, e in enumerate(examples))
    return ASK.format(examples=shown, task=task)


def post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Run:
    """The shared state of one generation run: counters, the dedup index and kept items."""

    def __init__(self, a, seeds):
        self.a, self.seeds, self.tasks = a, seeds, sorted(seeds)
        self.lock = threading.Lock()
        self.index = NgramIndex(a.ngram, a.max_overlap)
        self.origin = []  # per index id: "seed", "excluded" or "kept"
        for task in self.tasks:
            for t in seeds[task]:
                self.index.add(t)
                self.origin.append("seed")
        for path in a.exclude:
            for t in prompt_texts(path):
                self.index.add(t)
                self.origin.append("excluded")
        self.kept, self.rounds, self.requests, self.errors = [], 0, 0, 0
        self.rejected = collections.Counter()
        self.start = time.time()

    def chat(self, content, seed):
        """One sampled chat request; returns (text, finish_reason)."""
        a = self.a
        with self.lock:
            self.requests += 1
        r = post(a.url + "/v1/chat/completions", {
            "model": a.model, "messages": [{"role": "user", "content": content}],
            "temperature": a.temperature, "top_p": a.top_p, "max_tokens": a.max_tokens,
            "seed": seed})
        c = r["choices"][0]
        return c["message"]["content"] or "", c.get("finish_reason")

    def reject(self, reason):
        with self.lock:
            self.rejected[reason] += 1

    def next_round(self):
        """The next round's number, or None when the run is over."""
        a = self.a
        with self.lock:
            if (len(self.kept) >= a.count or self.rounds >= a.max_rounds
                    or time.time() - self.start > a.deadline
                    or (self.errors >= 10 and self.errors == self.requests)):
                return None
            self.rounds += 1
            return self.rounds - 1

    def one_round(self, i):
        """Asks for one message (and perhaps its follow-up) and keeps it if it passes."""
        a = self.a
        rng = random.Random(f"{a.seed}-{i}")
        task = rng.choice(self.tasks)
        pool = self.seeds[task]
        examples = rng.sample(pool, min(3, len(pool)))
        want_follow_up = rng.random() < a.multi_turn
        seed = rng.randrange(2 ** 31)
        try:
            reply, finish = self.chat(ask_message(task, examples), seed)
        except Exception as e:  # a failed request only loses its round
            with self.lock:
                self.errors += 1
                self.rejected[f"request failed ({type(e).__name__})"] += 1
            return
        text, why = clean_reply(reply, finish == "length", a.min_words, a.max_words)
        if why:
            return self.reject(why)
        with self.lock:
            if len(self.kept) >= a.count:
                return
            new, j = self.index.add_if_new(text)
            if not new:
                self.rejected[{"seed": "duplicate of a seed", "excluded":
                               "duplicate of an excluded prompt"}.get(self.origin[j],
                                                                      "duplicate")] += 1
                return
            self.origin.append("kept")
            item = {"round": i, "kind": "chat", "category": task, "turns": [text]}
            self.kept.append(item)
            if len(self.kept) % 1000 == 0:
                print(f"{len(self.kept)}/{a.count} kept after {self.requests} requests, "
                      f"{time.time() - self.start:.0f} s", flush=True)
        if want_follow_up:
            try:
                reply, finish = self.chat(ASK_FOLLOW_UP.format(first=text), seed + 1)
            except Exception as e:
                with self.lock:
                    self.errors += 1
                    self.rejected[f"follow-up: request failed ({type(e).__name__})"] += 1
                return
            follow, why = clean_reply(reply, finish == "length", a.min_words, a.max_words)
            if not why and overlap(ngrams(follow, a.ngram),
                                   ngrams(text, a.ngram)) > a.max_overlap:
                why = "repeats the first message"
            if why:
                return self.reject("follow-up: " + why)
            with self.lock:
                item["turns"].append(follow)

    def worker(self):
        while True:
            i = self.next_round()
            if i is None:
                return
            self.one_round(i)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--count", type=int, default=1000, help="prompts to keep")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--seeds", default=os.path.join(HERE, "seeds.jsonl"))
    p.add_argument("--exclude", nargs="*",
                   default=[os.path.join(HERE, "prompts", "heldout.jsonl")],
                   help="prompt files no kept message may overlap")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--deadline", type=float, default=1e9, help="seconds")
    p.add_argument("--max-rounds", type=int, default=None, help="default 10 x --count")
    p.add_argument("--multi-turn", type=float, default=0.2)
    p.add_argument("--max-overlap", type=float, default=0.5)
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--min-words", type=int, default=4)
    p.add_argument("--max-words", type=int, default=150)
    a = p.parse_args(argv)
    if a.max_rounds is None:
        a.max_rounds = 10 * a.count
    return a


def main(argv=None):
    """Runs the generation; returns the summary dict it prints."""
    a = parse_args(argv)
    run = Run(a, load_seeds(a.seeds))
    threads = [threading.Thread(target=run.worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = sorted(run.kept, key=lambda item: item["round"])[: a.count]
    with open(a.out, "w") as f:
        for k, item in enumerate(kept):
            f.write(json.dumps({"id": f"self-{k:05d}", "kind": "chat",
                                "category": item["category"], "turns": item["turns"],
                                "source": "self"}, ensure_ascii=False) + "\n")
    el = time.time() - run.start
    multi = sum(len(item["turns"]) > 1 for item in kept)
    summary = {"requests": run.requests, "rounds": run.rounds, "kept": len(kept),
               "multi_turn": multi, "rejected": dict(run.rejected.most_common()),
               "tasks": len({item["category"] for item in kept}), "seconds": round(el, 1)}
    print(f"{a.out}: kept {len(kept)} of {a.count} wanted ({multi} two-turn, "
          f"{summary['tasks']} tasks) from {run.rounds} rounds, {run.requests} requests "
          f"in {el:.1f} s ({run.requests / max(el, 1e-9):.1f} requests/s)")
    for reason, n in run.rejected.most_common():
        print(f"  rejected, {reason}: {n}")
    if not kept:
        sys.exit("no prompts kept")
    return summary


if __name__ == "__main__":
    main()
