#!/usr/bin/env python3
"""Offline tests of self_prompts.py: reply cleaning, the n-gram dedup index, the seeds
file, and the request loop against a stub OpenAI-compatible server.

    python3 -m unittest tools/eagle3/test_self_prompts.py     (from the repository root)
    python3 tools/eagle3/test_self_prompts.py
"""

import contextlib
import http.server
import io
import json
import os
import random
import re
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import self_prompts as sp  # noqa: E402


class CleanReply(unittest.TestCase):
    def ok(self, reply, want, **kw):
        text, why = sp.clean_reply(reply, **kw)
        self.assertIsNone(why, reply)
        self.assertEqual(text, want)

    def rejected(self, reply, reason, **kw):
        text, why = sp.clean_reply(reply, **kw)
        self.assertIsNone(text)
        self.assertEqual(why, reason)

    def test_plain_message_kept(self):
        self.ok("  how do i center a div in css  \n", "how do i center a div in css")

    def test_labels_and_quotes_stripped(self):
        self.ok('Message 4: "How do I sort a dict by value in Python?"',
                "How do I sort a dict by value in Python?")
        self.ok("**User:** What is the capital of Peru and why is it there?",
                "What is the capital of Peru and why is it there?")
        self.ok("New request - can you plan my week of vegetarian lunches?",
                "can you plan my week of vegetarian lunches?")
        self.ok("4. Can you suggest a name for my coffee truck?",
                "Can you suggest a name for my coffee truck?")
        self.ok("\u201cWhat should I pack for a weekend in Oslo?\u201d",
                "What should I pack for a weekend in Oslo?")

    def test_words_that_look_like_labels_are_kept(self):
        self.ok("User-friendly note apps: which ones do you recommend?",
                "User-friendly note apps: which ones do you recommend?")
        self.ok('"Affect" vs "effect": when do I use which one?',
                '"Affect" vs "effect": when do I use which one?')
        self.ok("'I don't get why my cat hates the vacuum, any ideas?'",
                "I don't get why my cat hates the vacuum, any ideas?")

    def test_preamble_and_commentary_dropped(self):
        self.ok('Sure! Here is a new message:\n\n"can u help me plan 3 days in rome"\n\n'
                "This message asks about travel planning.",
                "can u help me plan 3 days in rome")
        self.ok("Why does my bread not rise?\n\nThis is a cooking question.",
                "Why does my bread not rise?")

    def test_pasted_content_kept(self):
        self.ok("Fix this please:\n\ndef f(x):\n    return x +\n\n(The user pasted code.)",
                "Fix this please:\n\ndef f(x):\n    return x +")
        self.ok("Why does this crash?\n\n```\nx = None\n\nprint(x[0])\n```\n\nThanks!",
                "Why does this crash?\n\n```\nx = None\n\nprint(x[0])\n```")

    def test_rejections(self):
        self.rejected("Hi there!", "too short")
        self.rejected("", "empty")
        self.rejected(" ".join(f"word{i}" for i in range(200)), "too long")
        self.rejected("Could you explain how tides work and why there are", "cut off",
                      truncated=True)
        self.rejected("Sure, here is a recipe for pancakes: mix flour, milk and eggs.",
                      "reads like an answer")
        self.rejected("I'm sorry, but I can't write that message for you.",
                      "reads like an answer")
        self.rejected("Here are examples of messages users send to an AI assistant: one",
                      "echoes the instruction")
        self.rejected("please please help help " * 8, "repetitive")

    def test_complete_quote_is_not_cut_off(self):
        # The closing quote shows the message is whole even if the reply ran on.
        self.ok('"How do I repot a cactus safely?"\n\nThe user wants to know about',
                "How do I repot a cactus safely?", truncated=True)


class Index(unittest.TestCase):
    BASE = "How do I make my sourdough bread rise higher in a cold kitchen during winter?"

    def test_near_duplicates_rejected(self):
        idx = sp.NgramIndex(n=3, max_overlap=0.5)
        self.assertEqual(idx.add_if_new(self.BASE), (True, 0))
        for near in [
            self.BASE,
            "how do i make my sourdough bread rise higher in a cold kitchen during the winter",
            "How do I make my sourdough bread rise higher in a cold kitchen during winter? "
            "Thanks a lot!",
            "make my sourdough bread rise higher in a cold kitchen",  # a fragment
        ]:
            self.assertEqual(idx.add_if_new(near), (False, 0), near)
        self.assertEqual(len(idx), 1)

    def test_distinct_kept(self):
        idx = sp.NgramIndex(n=3, max_overlap=0.5)
        texts = [self.BASE,
                 "How do I make my kids eat more vegetables without a fight?",
                 "Why does my sourdough starter smell like nail polish?",
                 "Write a limerick about a cat who steals socks.",
                 "Can you give me an example?",
                 # contains the short stock phrase above, but is mostly new
                 "Can you give me an example of a cover letter for a nursing job?"]
        for i, t in enumerate(texts):
            self.assertEqual(idx.add_if_new(t), (True, i), t)

    def test_match_reports_best(self):
        idx = sp.NgramIndex(n=3, max_overlap=0.5)
        idx.add("the quick brown fox jumps over the lazy dog")
        idx.add("a completely different sentence about sorting lists in python")
        i, score = idx.match("the quick brown fox jumps over the lazy dog today")
        self.assertEqual(i, 0)
        self.assertAlmostEqual(score, 7 / 8)
        self.assertIsNone(idx.match("sorting socks by colour takes forever"))

    def test_common_grams_still_scored(self):
        # With common=1 every shared gram is "common": no candidate is found through them,
        # but a candidate found through a rare gram is scored on all its grams.
        idx = sp.NgramIndex(n=3, max_overlap=0.5, common=1)
        idx.add("can you help me with my tax return this year")
        idx.add("can you help me with my garden this spring")
        m = idx.match("can you help me with my garden this spring please")
        self.assertEqual(m[0], 1)

    def test_many_texts(self):
        rng = random.Random(0)
        vocab = [f"w{i}" for i in range(3000)]
        texts = ["can you help me " + " ".join(rng.sample(vocab, 12)) for _ in range(5000)]
        idx = sp.NgramIndex()
        self.assertEqual(sum(idx.add_if_new(t)[0] for t in texts), 5000)
        edited = texts[1234].replace("can you help me", "could you please help me") + " ok?"
        self.assertEqual(idx.add_if_new(edited), (False, 1234))


class Seeds(unittest.TestCase):
    def test_seed_file(self):
        seeds = sp.load_seeds(os.path.join(HERE, "seeds.jsonl"))
        n = sum(len(v) for v in seeds.values())
        self.assertGreaterEqual(n, 300)
        self.assertGreaterEqual(len(seeds), 30)
        self.assertTrue(all(len(v) >= 3 for v in seeds.values()))

    def test_no_overlap_with_heldout(self):
        idx = sp.NgramIndex(n=3, max_overlap=0.3, common=10 ** 9)
        for t in sp.prompt_texts(os.path.join(HERE, "prompts", "heldout.jsonl")):
            idx.add(t)
        seeds = sp.load_seeds(os.path.join(HERE, "seeds.jsonl"))
        for task, texts in seeds.items():
            for t in texts:
                self.assertIsNone(idx.match(t), t)


VOCAB = ("garden python budget kitten recipe mountain invoice guitar sonnet spreadsheet "
         "passport vaccine tomato chess printer battery volcano salary lantern orbit "
         "marathon library pancake router quilt dentist harbour fossil violin tractor "
         "compass pepper bicycle ladder meadow pixel rocket saddle tunnel walnut").split()
EXCLUDED = "Tell me everything about the purple elephant parade in our town tonight please"


class Stub(http.server.BaseHTTPRequestHandler):
    """Answers /v1/chat/completions with canned replies chosen by the request's seed."""
    requests = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Stub.requests.append(body)
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        seed, content = body["seed"], body["messages"][-1]["content"]
        rng = random.Random(seed)
        if "next message" in content:  # a follow-up request
            reply = ("Thanks!" if seed % 4 == 0 else
                     "Follow-up: And what about the " + " ".join(rng.sample(VOCAB, 5)) + "?")
        else:
            kind = seed % 8
            if kind == 0:  # copies the first example it was shown
                reply = re.search(r"Message 1: (.*)", content).group(1)
            elif kind == 1:
                reply = "Hello!"
            elif kind == 2:
                reply = "Sure! Here is what you asked for: a list of ideas."
            elif kind == 3:
                reply = f'"{EXCLUDED}"'
            else:
                reply = ('Message 4: "Could you help me with ' + " ".join(rng.sample(VOCAB, 8))
                         + '?"\n\nThis message is about the task.')
        out = json.dumps({"id": "x", "object": "chat.completion", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": reply},
            "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


class AgainstStub(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()
        cls.url = f"http://127.0.0.1:{cls.server.server_address[1]}"

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()

    def test_main_loop(self):
        Stub.requests = []
        with tempfile.TemporaryDirectory() as d:
            out, excl = os.path.join(d, "self.jsonl"), os.path.join(d, "excluded.jsonl")
            with open(excl, "w") as f:
                f.write(json.dumps({"id": "h", "kind": "chat", "category": "c",
                                    "turns": [EXCLUDED]}) + "\n")
            log = io.StringIO()
            with contextlib.redirect_stdout(log):
                summary = sp.main([out, "--url", self.url, "--model", "test-model",
                                   "--count", "20", "--concurrency", "4",
                                   "--multi-turn", "0.5", "--exclude", excl])
            with open(out) as f:
                items = [json.loads(line) for line in f]
        print("\n" + log.getvalue(), end="")

        self.assertEqual(len(items), 20)
        self.assertEqual([it["id"] for it in items], [f"self-{i:05d}" for i in range(20)])
        seeds = sp.load_seeds(os.path.join(HERE, "seeds.jsonl"))
        all_seeds = {t for v in seeds.values() for t in v}
        for it in items:
            self.assertEqual(it["kind"], "chat")
            self.assertEqual(it["source"], "self")
            self.assertIn(it["category"], seeds)
            self.assertIn(len(it["turns"]), (1, 2))
            self.assertTrue(it["turns"][0].startswith("Could you help me with "), it)
            self.assertNotIn(it["turns"][0], all_seeds)
            if len(it["turns"]) == 2:
                self.assertTrue(it["turns"][1].startswith("And what about the "), it)
        self.assertGreater(sum(len(it["turns"]) == 2 for it in items), 0)

        self.assertEqual(summary["kept"], 20)
        self.assertEqual(summary["requests"], len(Stub.requests))
        for reason in ["duplicate of a seed", "too short", "reads like an answer",
                       "duplicate of an excluded prompt"]:
            self.assertGreater(summary["rejected"].get(reason, 0), 0, reason)
        self.assertIn("kept 20 of 20 wanted", log.getvalue())

        first = [b for b in Stub.requests if "next message" not in b["messages"][0]["content"]]
        self.assertEqual(len(first), summary["rounds"])
        for b in Stub.requests:
            self.assertEqual(b["model"], "test-model")
            self.assertEqual((b["temperature"], b["top_p"], b["max_tokens"]), (1.0, 0.95, 200))
            self.assertIsInstance(b["seed"], int)
            self.assertEqual([m["role"] for m in b["messages"]], ["user"])
        for b in first:
            c = b["messages"][0]["content"]
            self.assertIn("Message 3: ", c)
            self.assertRegex(c, r"might send about .+\. Reply with the message only\.$")

    def test_server_down(self):
        with socket_closed() as url, tempfile.TemporaryDirectory() as d:
            with contextlib.redirect_stdout(io.StringIO()), self.assertRaises(SystemExit):
                sp.main([os.path.join(d, "o.jsonl"), "--url", url, "--count", "5",
                         "--concurrency", "2"])


@contextlib.contextmanager
def socket_closed():
    """The URL of a local port nothing listens on."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    yield f"http://127.0.0.1:{port}"


if __name__ == "__main__":
    unittest.main()
