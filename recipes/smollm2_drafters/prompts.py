"""Instruction prompts for SmolLM2's drafters, assembled offline from templates.

    python recipes/smollm2_drafters/prompts.py OUT_DIR [--per-family N]

An instruct model's drafter must learn what the model answers to requests, so
the corpus is requests (code, chat, maths) that the target itself completes
(make_data.py). Topics, tasks and numbers are drawn from fixed lists with a
fixed seed: the files are the same on every machine. The held-out prompts use
topics and tasks that never appear in training, so τ measured on them is not
measured on memorised text. Writes train.jsonl and heldout.jsonl ({"prompt",
"source"}; the source names the family and topic).
"""

import argparse
import json
import random
from pathlib import Path

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "merges two sorted lists", "removes duplicates from a list",
    "finds the largest element in a list", "computes the factorial of n", "checks if a string is a palindrome",
    "flattens a nested list", "sorts a list of dictionaries by a key", "reads a CSV file into a list of rows",
    "counts word frequencies in a text", "converts Celsius to Fahrenheit", "returns the greatest common divisor",
    "implements binary search", "transposes a matrix", "validates an email address with a regular expression",
    "computes the average of a list of numbers", "finds the second largest number in a list",
    "groups words by their first letter", "generates all permutations of a list", "implements bubble sort",
    "checks whether two strings are anagrams", "returns the sum of the digits of a number",
    "converts a decimal number to binary", "splits a list into chunks of size n", "capitalizes every word",
    "finds the common elements of two lists", "computes the median of a list", "rotates a list by k places",
    "parses a date string and returns the weekday", "counts the lines in a file", "implements a stack class",
    "implements a queue with two stacks", "computes the power set of a set", "checks balanced parentheses",
    "returns the longest word in a sentence", "zips two lists into a dictionary", "computes a running total",
]
HELDOUT_CODE_TASKS = [
    "finds the missing number in a list from 1 to n", "implements insertion sort",
    "counts the uppercase letters in a string", "returns the least common multiple of two numbers",
    "converts a Roman numeral to an integer", "checks whether a year is a leap year",
    "finds the first non-repeated character in a string",
]
LANGUAGES = ["Python", "Python", "Python", "JavaScript", "C", "Rust", "Go", "Java"]
CODE_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "How do I write a {lang} program that {task}?",
    "Show me {lang} code that {task}, with a short explanation.",
    "Can you write a function in {lang} that {task}? Add a docstring or comment.",
]

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "machine learning",
    "the immune system", "climate change", "the Roman Empire", "electric cars", "volcanoes",
    "the internet", "democracy", "honey bees", "the human heart", "renewable energy", "earthquakes",
    "the stock market", "vaccines", "the Moon", "coffee", "sleep", "recycling", "the printing press",
    "DNA", "rainbows", "gravity", "the Great Wall of China", "bread making", "meditation", "chess",
    "the Olympic Games", "dinosaurs", "jazz music", "the solar system", "inflation", "bicycles",
    "the ocean tides", "airplanes", "friendship", "time management", "healthy eating", "public speaking",
    "learning a new language", "gardening", "the Renaissance", "electricity", "the brain", "clouds",
]
HELDOUT_TOPICS = ["glaciers", "the Silk Road", "penguins", "solar panels", "opera", "the Amazon rainforest",
                  "submarines"]
CHAT_TEMPLATES = [
    "What is {topic}?", "Explain {topic} in simple terms.", "Give me three interesting facts about {topic}.",
    "Write a short paragraph about {topic}.", "Why is {topic} important?", "Write a short poem about {topic}.",
    "How would you explain {topic} to a child?", "What are the pros and cons of {topic}?",
    "Summarize what people should know about {topic} in a few sentences.",
    "Tell me a short story that involves {topic}.",
]
GREETINGS = ["Hi! How are you today?", "Hello, who are you?", "Can you help me plan my day?",
             "What can you do?", "Thank you for your help!", "Tell me a joke.",
             "I feel tired today. Any advice?", "What should I cook for dinner tonight?"]

OBJECTS = ["apples", "books", "pencils", "tickets", "oranges", "notebooks", "cookies", "marbles"]
NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo"]
HELDOUT_OBJECTS = ["stamps", "balloons"]
HELDOUT_NAMES = ["Ines", "Jonas"]


def maths_prompt(rng: random.Random, objects, names) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    obj, name = rng.choice(objects), rng.choice(names)
    forms = [
        f"What is {a} + {b}?", f"What is {a} times {c}?", f"What is {a * c} divided by {c}?",
        f"Solve for x: {c}x + {a} = {c * b + a}.", f"What is {c * 5}% of {a * 10}?",
        f"{name} has {a} {obj} and buys {b} more. How many {obj} does {name} have now?",
        f"{name} buys {c} {obj} at ${b} each. How much does {name} pay in total?",
        f"A train travels {a * 10} km in {c} hours. What is its average speed?",
        f"{name} had {a + b} {obj} and gave away {b}. How many are left? Explain step by step.",
        f"What is the area of a rectangle with sides {a} cm and {c} cm?",
    ]
    return rng.choice(forms)


def build(per_family: int, seed: int, heldout: bool) -> list[dict]:
    rng = random.Random(seed + (1 if heldout else 0))
    tasks = HELDOUT_CODE_TASKS if heldout else CODE_TASKS
    topics = HELDOUT_TOPICS if heldout else TOPICS
    objects, names = (HELDOUT_OBJECTS, HELDOUT_NAMES) if heldout else (OBJECTS, NAMES)
    rows = []
    for _ in range(per_family):
        task = rng.choice(tasks)
        rows.append({"prompt": rng.choice(CODE_TEMPLATES).format(lang=rng.choice(LANGUAGES), task=task),
                     "source": f"code:{task}"})
        topic = rng.choice(topics)
        rows.append({"prompt": rng.choice(CHAT_TEMPLATES).format(topic=topic), "source": f"chat:{topic}"})
        rows.append({"prompt": maths_prompt(rng, objects, names), "source": "maths:" + ("heldout" if heldout else "train")})
    if not heldout:
        rows += [{"prompt": g, "source": "chat:greeting"} for g in GREETINGS]
    seen, out = set(), []
    for r in rows:  # the same request twice teaches nothing new
        if r["prompt"] not in seen:
            seen.add(r["prompt"])
            out.append(r)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--per-family", type=int, default=900, help="training draws per family (code, chat, maths)")
    ap.add_argument("--heldout-per-family", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", build(args.per_family, args.seed, False)),
                       ("heldout", build(args.heldout_per_family, args.seed, True))):
        (args.out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{name}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
