#!/usr/bin/env python3
"""Builds the prompt sets the EAGLE-3 head is trained and evaluated on: varied chat requests
(instructions, questions, code, maths, stories, lists, rewriting, multi-turn) and plain
completions, composed from templates and fillers with a seeded generator, so that the set
is reproducible and needs no download.

    tools/eagle3/build_prompts.py [--train N] [--heldout M] [--seed S] [--out DIR]

Writes DIR/train.jsonl and DIR/heldout.jsonl (no prompt in both). Each line is one of
  {"id": ..., "kind": "chat", "category": ..., "turns": ["user message", ...]}
  {"id": ..., "kind": "completion", "category": ..., "prompt": "text to continue"}
A chat item with several turns is answered turn by turn, each answer the target's own.
Standard library only.
"""

import argparse
import json
import os
import random

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "volcanoes", "the immune system",
    "electric cars", "the printing press", "the Roman Empire", "climate change", "vaccines",
    "the internet", "honey bees", "earthquakes", "the moon landing", "solar panels",
    "coral reefs", "the French Revolution", "gravity", "DNA", "rainbows", "tides",
    "the stock market", "inflation", "machine learning", "blockchains", "coffee",
    "sleep", "meditation", "recycling", "the Great Wall of China", "the pyramids of Giza",
    "jazz music", "the Olympic Games", "chess", "the human heart", "antibiotics",
    "the Renaissance", "plate tectonics", "hurricanes", "the speed of light",
    "compound interest", "the ozone layer", "bread making", "the Silk Road", "glaciers",
    "wind turbines", "the metric system", "penguins", "octopuses", "the Amazon rainforest",
    "the theory of evolution", "semiconductors", "nuclear fusion", "the periodic table",
    "democracy", "the Industrial Revolution", "public libraries", "the human brain",
    "origami", "tea ceremonies", "the Northern Lights", "deserts", "bicycles",
    "the steam engine", "composting", "quantum computers", "the Moon's phases",
    "vitamins", "bats", "the Pacific Ocean", "sourdough", "the telescope", "elections",
    "recycling plastic", "the human skeleton", "electricity", "magnets", "mushrooms",
    "the Cold War", "ancient Greece", "the Mars rovers", "time zones", "credit scores",
    "password security", "open source software", "the bicycle chain", "wolves",
    "the camera", "skyscrapers", "bridges", "trains", "airplanes", "submarines",
]
AUDIENCES = [
    "a five-year-old", "a high school student", "a busy manager", "a retired teacher",
    "a beginner", "an expert", "a tourist", "a new employee", "my grandmother", "a scientist",
]
ANIMALS = ["fox", "owl", "cat", "dragon", "robot", "turtle", "whale", "rabbit", "bear",
           "sparrow", "lion", "elephant", "mouse", "horse", "dolphin", "goat", "crow"]
PEOPLE = ["baker", "astronaut", "detective", "gardener", "pilot", "teacher", "inventor",
          "librarian", "fisherman", "nurse", "painter", "knight", "farmer", "musician",
          "sailor", "shopkeeper", "doctor", "student", "explorer", "chef"]
PLACES = ["a small village", "a busy city", "a lighthouse", "the desert", "a space station",
          "an old castle", "a quiet forest", "the bottom of the sea", "a mountain top",
          "a train station", "a market", "an island", "a school", "a hospital", "a farm"]
THINGS = ["a lost key", "a mysterious letter", "a broken clock", "a map", "a golden coin",
          "an umbrella", "a music box", "a red balloon", "a secret door", "a tiny seed",
          "a letter from the future", "a magic lamp", "an old photograph", "a compass"]
MOODS = ["funny", "sad", "hopeful", "spooky", "exciting", "calm", "heartwarming", "surprising"]
LANGS = ["Python", "JavaScript", "Rust", "C", "Java", "Go", "C++", "TypeScript", "Bash", "SQL"]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "sorts a list of numbers with bubble sort", "counts the vowels in a string",
    "finds the largest element of a list", "computes the factorial of n",
    "removes duplicates from a list", "checks whether a string is a palindrome",
    "merges two sorted lists", "converts Celsius to Fahrenheit", "sums the digits of a number",
    "finds the greatest common divisor of two numbers", "counts the words in a sentence",
    "flattens a nested list", "returns the second largest number in a list",
    "capitalizes the first letter of every word", "computes the average of a list",
    "checks whether two strings are anagrams", "implements binary search",
    "reads a file and prints its lines", "returns the prime factors of a number",
    "transposes a matrix", "counts how often each character appears in a string",
    "validates an email address", "generates a random password",
    "converts a binary string to an integer", "finds the longest word in a sentence",
    "computes the distance between two points", "rotates a list by k positions",
]
NAMES = ["Alice", "Bob", "Maria", "Chen", "Priya", "Omar", "Lena", "Tom", "Yuki", "Sam",
         "Ana", "Leo", "Fatima", "Jonas", "Emma", "Raj"]
FRUITS = ["apples", "oranges", "pencils", "books", "cookies", "marbles", "stickers", "cards",
          "eggs", "flowers"]
FOODS = ["pancakes", "tomato soup", "a vegetable curry", "banana bread", "a green salad",
         "fried rice", "lemonade", "pasta with garlic", "guacamole", "oatmeal cookies"]
ITEMS = ["programming languages", "healthy breakfasts", "ways to save money",
         "tips for better sleep", "famous scientists", "planets in the solar system",
         "board games", "ways to reduce stress", "houseplants that are easy to care for",
         "things to pack for a beach trip", "benefits of exercise", "countries in Europe",
         "musical instruments", "hobbies for a rainy day", "tips for learning a language",
         "common interview questions", "ways to stay productive", "types of clouds",
         "kitchen tools every cook needs", "famous paintings", "sources of protein",
         "rules for a good presentation", "ideas for a birthday party", "dog breeds",
         "reasons to read books", "ways to be kind to others", "mistakes new drivers make"]
EMAILS = ["ask my manager for a day off", "thank a colleague for their help",
          "invite my team to a lunch", "apologize to a customer for a late delivery",
          "ask a teacher for an extension on homework", "follow up after a job interview",
          "tell my landlord the heating is broken", "welcome a new team member",
          "decline a meeting politely", "ask a friend to return a borrowed book"]
SENTENCES = [
    "The meeting was moved to next week because many people were on holiday.",
    "I think that we should maybe try to finish the project sooner if possible.",
    "The cat sat on the warm windowsill and watched the birds outside.",
    "Our company is committed to delivering high quality products to every customer.",
    "She walked to the store, bought some milk, and came back home before dinner.",
    "Due to unforeseen circumstances, the concert has been cancelled.",
    "He was very tired after the long day, but he still finished his homework.",
    "The new phone has a bigger screen, a better camera and a longer battery life.",
    "Please remember to turn off the lights when you leave the room.",
    "Learning to play the piano takes patience and a lot of practice.",
]
COMPLETIONS = [
    "Once upon a time, in {place}, there lived a {person} who",
    "The history of {topic} begins",
    "Here is a simple explanation of {topic}:",
    "def {fn}(",
    "Dear {name},\n\nI hope this message finds you well. I am writing to",
    "Top 5 facts about {topic}:\n1.",
    "Chapter 1\n\nThe {animal} woke up early that morning and",
    "Q: What is {topic}?\nA:",
    "In this tutorial, we will learn how to",
    "The recipe for {food} is simple. First,",
    "Breaking news: scientists have discovered",
    "# {lang} tips\n\nOne of the most useful things to know about {lang} is",
    "Step 1: Gather your materials.\nStep 2:",
    "My favourite thing about {topic} is",
    "The {person} looked at {thing} and said,",
]
FN_NAMES = ["reverse_string", "is_prime", "fibonacci", "factorial", "count_vowels", "gcd",
            "merge_sorted", "is_palindrome", "flatten", "binary_search", "mean", "word_count"]


def chat(category, *turns):
    return {"kind": "chat", "category": category, "turns": list(turns)}


def make(rng):
    """One random prompt item."""
    t, a = rng.choice(TOPICS), rng.choice(AUDIENCES)
    pick = rng.random()
    if pick < 0.14:
        form = rng.choice([
            "Explain {t} to {a}.", "What is {t}?", "How does {t} work?",
            "Why is {t} important?", "Give me a short summary of {t}.",
            "What are the main facts about {t}?", "Tell me something interesting about {t}.",
            "Can you describe {t} in simple words?", "What should {a} know about {t}?",
            "Explain {t} in three sentences.", "What are the pros and cons of {t}?",
        ])
        return chat("question", form.format(t=t, a=a))
    if pick < 0.26:
        lang, task = rng.choice(LANGS), rng.choice(CODE_TASKS)
        form = rng.choice([
            "Write a {lang} function that {task}.", "How do I write a {lang} program that {task}?",
            "Show me {lang} code that {task}, with comments.",
            "Write a short {lang} script that {task} and explain how it works.",
            "Can you give me an example in {lang} of a function that {task}?",
        ])
        return chat("code", form.format(lang=lang, task=task))
    if pick < 0.38:
        x, y, z = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
        n1, n2, f = rng.choice(NAMES), rng.choice(NAMES), rng.choice(FRUITS)
        form = rng.choice([
            f"What is {x} times {y}?", f"What is {x} plus {y} minus {z}?",
            f"{n1} has {x} {f}. {n1} gives {z} of them to {n2}. How many {f} does {n1} have left?",
            f"A shop sells {f} for {z} dollars each. How much do {x} {f} cost?",
            f"If a train travels at {x} kilometres per hour for {z} hours, how far does it go?",
            f"Solve for x: {z}x + {x} = {x + z * y}.", f"What is {x}% of {y * 10}?",
            f"Is {x * y + 1} a prime number? Explain.",
            f"{n1} is {x} years old and {n2} is {z} years younger. How old is {n2}?",
            f"A rectangle is {x} cm long and {z} cm wide. What are its area and perimeter?",
            f"Explain step by step how to compute {x} divided by {z}.",
        ])
        return chat("maths", form)
    if pick < 0.52:
        form = rng.choice([
            "Write a short story about a {animal} in {place}.",
            "Write a {mood} story about a {person} who finds {thing}.",
            "Tell me a bedtime story about a {animal} and a {person}.",
            "Write a poem about {t}.", "Write a {mood} poem about a {animal}.",
            "Write a short story that begins in {place} with {thing}.",
            "Write a haiku about {t}.", "Write a limerick about a {person}.",
            "Describe {place} at night in a few sentences.",
        ])
        return chat("story", form.format(animal=rng.choice(ANIMALS), place=rng.choice(PLACES),
                                         person=rng.choice(PEOPLE), thing=rng.choice(THINGS),
                                         mood=rng.choice(MOODS), t=t))
    if pick < 0.64:
        n = rng.randint(3, 10)
        form = rng.choice([
            "List {n} {items}.", "Give me {n} {items}, with one sentence about each.",
            "What are {n} {items}?", "Make a numbered list of {n} {items}.",
            "List {n} facts about {t}.", "Give me {n} questions to ask about {t}.",
        ])
        return chat("list", form.format(n=n, items=rng.choice(ITEMS), t=t))
    if pick < 0.76:
        s = rng.choice(SENTENCES)
        form = rng.choice([
            f"Write an email to {rng.choice(EMAILS)}.",
            f"Rewrite this sentence to be more formal: {s}",
            f"Summarize this sentence in five words: {s}",
            f"Translate this sentence into French: {s}",
            f"Fix the grammar and make this clearer: {s}",
            f"Give me a recipe for {rng.choice(FOODS)}.",
            f"Write a short product description for {rng.choice(THINGS)}.",
            f"Give me a plan for a one-day trip to {rng.choice(PLACES)}.",
            f"Write a tweet about {t}.", f"Write a short speech for {a} about {t}.",
            f"Suggest a title for an article about {t}.",
            f"Write a job advertisement for a {rng.choice(PEOPLE)}.",
        ])
        return chat("instruction", form)
    if pick < 0.88:
        follow = rng.choice([
            "Can you make it shorter?", "Can you give me an example?", "Why is that?",
            "Thank you! Can you explain that more simply?", "Can you say more about that?",
            "Now write it as a list.", "What is the most important part?",
            "Can you add one more idea?", "How would you explain it to a child?",
        ])
        first = make(rng)
        while first["kind"] != "chat" or len(first["turns"]) != 1:
            first = make(rng)
        return chat("multi-turn", first["turns"][0], follow)
    form = rng.choice(COMPLETIONS)
    return {"kind": "completion", "category": "completion",
            "prompt": form.format(place=rng.choice(PLACES), person=rng.choice(PEOPLE),
                                  topic=t, fn=rng.choice(FN_NAMES), name=rng.choice(NAMES),
                                  animal=rng.choice(ANIMALS), food=rng.choice(FOODS),
                                  lang=rng.choice(LANGS), thing=rng.choice(THINGS))}


def key(item):
    return json.dumps(item.get("turns") or item.get("prompt"))


def draw(rng, n, taken):
    out = []
    while len(out) < n:
        item = make(rng)
        k = key(item)
        if k in taken:
            continue
        taken.add(k)
        out.append(item)
    return out


def write(path, prefix, items):
    with open(path, "w") as f:
        for i, item in enumerate(items):
            f.write(json.dumps({"id": f"{prefix}-{i:05d}", **item}) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=int, default=8000)
    p.add_argument("--heldout", type=int, default=200)
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "prompts"))
    a = p.parse_args()
    taken = set()
    heldout = draw(random.Random(a.seed + 1), a.heldout, taken)
    train = draw(random.Random(a.seed), a.train, taken)
    os.makedirs(a.out, exist_ok=True)
    write(os.path.join(a.out, "train.jsonl"), "train", train)
    write(os.path.join(a.out, "heldout.jsonl"), "heldout", heldout)
    cats = {}
    for item in train:
        cats[item["category"]] = cats.get(item["category"], 0) + 1
    print(f"{len(train)} training and {len(heldout)} held-out prompts; training by category: "
          + ", ".join(f"{k} {v}" for k, v in sorted(cats.items())))


if __name__ == "__main__":
    main()
