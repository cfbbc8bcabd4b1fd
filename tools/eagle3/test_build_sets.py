#!/usr/bin/env python3
"""Offline tests of build_sets.py: completions cut at sentence ends from documents, every
source's held-back slice kept out of training (and out of the completions), and an
evaluation prompt that a training source also holds refused.

    python3 -m unittest tools/eagle3/test_build_sets.py     (from the repository root)
"""

import json
import os
import sys
import tempfile
import unittest
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import build_sets  # noqa: E402


def chat(id_, text, source="pkg==1 (MIT)"):
    return {"id": id_, "kind": "chat", "category": "c", "turns": [text], "source": source}


def document(i):
    body = " ".join(f"Sentence {i}.{k} tells a fact." for k in range(40))
    return chat(f"squad-{i:05d}", f"{body}\n\nWhat does sentence {i}.3 tell?")


class Sets(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def write(self, name, items):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            for item in items:
                f.write(json.dumps(item) + "\n")
        return path

    def args(self, unseen, **kw):
        base = dict(self_prompts=self.write("self.jsonl", [chat(f"self-{i:05d}", f"self {i}", "self") for i in range(20)]),
                    collections=self.write("col.jsonl", [document(i) for i in range(30)] +
                                           [chat(f"bfcl-{i:05d}", f"call tool {i}") for i in range(30)]),
                    unseen=self.write("unseen.jsonl", unseen), templated=None, templated_count=0,
                    per_collection=25, completions=10, completion_chars=300, heldback=5, seed=3)
        base.update(kw)
        return SimpleNamespace(**base)

    def test_completions_end_at_a_sentence_and_come_from_trained_documents(self):
        sets, counts = build_sets.build(self.args([chat("mtbench-00001", "unseen question")]))
        completions = [i for i in sets["train"] + sets["heldback"] if i["kind"] == "completion"]
        # A source of its own, whose first five are held back like every source's.
        self.assertEqual(len(completions), 10)
        self.assertEqual(sum(i["kind"] == "completion" for i in sets["heldback"]), 5)
        held = {i["id"] for i in sets["heldback"]}
        for c in completions:
            self.assertLessEqual(len(c["prompt"]), 301)
            self.assertTrue(c["prompt"].endswith(". "), c["prompt"][-20:])
            self.assertNotIn(c["id"].removeprefix("doc-"), held)
        self.assertEqual(counts["per_source"], {"self": 20, "bfcl": 25, "squad": 25, "documents": 10})

    def test_the_held_back_slice_is_never_trained_on(self):
        sets, counts = build_sets.build(self.args([chat("mtbench-00001", "unseen question")]))
        train = {i["id"] for i in sets["train"]}
        held = [i["id"] for i in sets["heldback"]]
        self.assertEqual(len(held), 5 * 4)
        self.assertFalse(train & set(held))
        self.assertEqual(counts["train"] + counts["heldback"], 20 + 25 + 25 + 10)

    def test_an_evaluation_prompt_held_by_a_training_source_is_refused(self):
        with self.assertRaises(SystemExit) as e:
            build_sets.build(self.args([chat("mtbench-00001", "  Self 7 ")]))
        self.assertIn("mtbench-00001", str(e.exception))


if __name__ == "__main__":
    unittest.main()
