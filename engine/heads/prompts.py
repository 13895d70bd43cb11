"""Instructions a draft head is trained on, generated from templates written for Tandem.

None comes from a public benchmark or from Tandem's own evaluation prompts: the head is measured
on prompts it never saw. The mix follows what people ask a small chat model: explanations, lists,
short writing, code, rewriting, comparisons, advice and quick facts (TEMPLATES), and work on a text
or a piece of code the user pastes: summaries, extraction, translation, questions answered from the
text, code explained or tested (PASSAGE_TASKS, over the docstrings and small functions of Python's
own standard library, which every machine that runs Tandem has), plus arithmetic word problems.
A head trained on the templates alone reached top-1 0.68 on unseen template prompts but only 0.39
on other kinds of prompt: the variety of the prompts matters more than their number.
"""

from __future__ import annotations

import random

TOPICS = [
    "photosynthesis",
    "black holes",
    "the water cycle",
    "volcanoes",
    "the immune system",
    "inflation",
    "compound interest",
    "machine learning",
    "the internet",
    "electric cars",
    "solar panels",
    "recycling",
    "the Roman Empire",
    "the printing press",
    "coffee",
    "sleep",
    "bees",
    "the moon",
    "glaciers",
    "vaccines",
    "the stock market",
    "democracy",
    "rainbows",
    "earthquakes",
    "batteries",
    "DNA",
    "gravity",
    "the human heart",
    "clouds",
    "magnets",
    "bread baking",
    "tides",
    "the piano",
    "chess",
    "meditation",
    "marathon training",
    "gardening",
    "composting",
    "the French Revolution",
    "smartphones",
    "password security",
    "public libraries",
    "wind turbines",
    "coral reefs",
    "the periodic table",
    "time zones",
    "credit scores",
    "jazz",
    "origami",
    "bicycles",
    "rivers",
    "deserts",
    "penguins",
    "the Olympic Games",
    "airplanes",
    "email",
    "spreadsheets",
    "budgeting",
    "first aid",
    "volunteering",
    "renewable energy",
    "antibiotics",
    "fermentation",
    "telescopes",
]
ACTIVITIES = [
    "learning a new language",
    "saving money",
    "studying for exams",
    "cooking for one",
    "running a meeting",
    "writing a CV",
    "keeping a plant alive",
    "travelling on a budget",
    "getting better sleep",
    "starting to exercise",
    "working from home",
    "reading more books",
    "moving to a new city",
    "preparing for a job interview",
    "learning to code",
    "organising a small kitchen",
    "taking better photos",
    "staying focused",
    "planning a birthday party",
    "camping for the first time",
    "speaking in public",
    "making friends as an adult",
    "cleaning a bicycle",
    "reducing food waste",
]
PAIRS = [
    ("a virus", "a bacterium"),
    ("weather", "climate"),
    ("a list", "a tuple in Python"),
    ("RAM", "storage"),
    ("tea", "coffee"),
    ("a lake", "a sea"),
    ("speed", "velocity"),
    ("an alligator", "a crocodile"),
    ("stocks", "bonds"),
    ("HTTP", "HTTPS"),
    ("a comet", "an asteroid"),
    ("baking soda", "baking powder"),
    ("a simile", "a metaphor"),
    ("mitosis", "meiosis"),
    ("a democracy", "a monarchy"),
    ("TCP", "UDP"),
    ("renting", "buying a home"),
    ("an essay", "a report"),
    ("frogs", "toads"),
    ("AC", "DC current"),
]
CODE_TASKS = [
    "reverses a string",
    "checks whether a number is prime",
    "counts the words in a text",
    "returns the largest item of a list",
    "converts Celsius to Fahrenheit",
    "removes duplicates from a list",
    "computes the factorial of n",
    "checks whether a word is a palindrome",
    "sums the even numbers in a list",
    "merges two sorted lists",
    "returns the n-th Fibonacci number",
    "finds the most common letter in a string",
    "reads a file and prints its line count",
    "validates an email address roughly",
    "sorts a list of names by length",
    "flattens a nested list",
]
LANGUAGES = ["Python", "JavaScript", "Python", "Rust", "Go", "C", "Bash"]
FORMS = [
    "a short poem",
    "a haiku",
    "a limerick",
    "a short story",
    "a product description",
    "a tweet",
    "a thank-you note",
    "a two-sentence horror story",
    "a slogan",
    "a diary entry",
    "a riddle",
]
AUDIENCES = ["a five-year-old", "a high-school student", "a busy manager", "a beginner", "my grandmother"]
SENTENCES = [
    "the meeting has been moved to thursday because the room was booked",
    "i think we should of left earlier, the traffic was terrible",
    "our team finished the project two weeks ahead of schedule",
    "please remember to bring your own water bottle to the event",
    "the new cafe on the corner serves the best pancakes in town",
    "he didnt know where he put his keys so he was late for work",
    "the library will be closed on monday for maintenance",
    "we are excited to announce the launch of our new app",
]
FACTS = [
    "What is the capital of Australia?",
    "How many legs does a spider have?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Fahrenheit?",
    "How many continents are there?",
    "What gas do plants absorb from the air?",
    "What is the largest planet in the solar system?",
    "How many minutes are in a day?",
    "What is the chemical symbol for gold?",
    "Which ocean is the largest?",
    "What language is spoken in Brazil?",
    "How many sides does a hexagon have?",
]

TEMPLATES = [
    lambda r: f"Explain {r.choice(TOPICS)} in simple terms.",
    lambda r: f"Explain {r.choice(TOPICS)} to {r.choice(AUDIENCES)}.",
    lambda r: f"What are the main benefits and drawbacks of {r.choice(TOPICS)}?",
    lambda r: f"Give me three tips for {r.choice(ACTIVITIES)}.",
    lambda r: f"Give me a step-by-step plan for {r.choice(ACTIVITIES)}.",
    lambda r: f"What are common mistakes people make when {r.choice(ACTIVITIES)}?",
    lambda r: "What is the difference between {} and {}?".format(*r.choice(PAIRS)),
    lambda r: f"Write a {r.choice(LANGUAGES)} function that {r.choice(CODE_TASKS)}.",
    lambda r: f"Write a Python function that {r.choice(CODE_TASKS)}, and explain how it works.",
    lambda r: f"Write {r.choice(FORMS)} about {r.choice(TOPICS)}.",
    lambda r: f"Correct the grammar of this sentence: {r.choice(SENTENCES)}",
    lambda r: f"Rewrite this sentence in a formal tone: {r.choice(SENTENCES)}",
    lambda r: f"Summarize in one sentence what {r.choice(TOPICS)} is.",
    lambda r: f"List five interesting facts about {r.choice(TOPICS)}.",
    lambda r: f"{r.choice(FACTS)}",
    lambda r: f"{r.choice(FACTS)} Explain your answer briefly.",
    lambda r: f"Write a short email to a colleague about {r.choice(ACTIVITIES)}.",
    lambda r: f"Why is {r.choice(TOPICS)} important?",
    lambda r: f"How does {r.choice(TOPICS)} work?",
    lambda r: f"Describe the history of {r.choice(TOPICS)} in a paragraph.",
    lambda r: f"Make a list of questions a student might ask about {r.choice(TOPICS)}.",
    lambda r: f"What should I know before {r.choice(ACTIVITIES)}?",
]


STDLIB_MODULES = (
    "argparse",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "enum",
    "fractions",
    "functools",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "html",
    "http.client",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "math",
    "mimetypes",
    "os",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "secrets",
    "shlex",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "tokenize",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "warnings",
    "zipfile",
)
TEXT_TASKS = (
    "Summarize the following text in two sentences.\n\n{text}",
    "Extract the key terms from this text as a bulleted list.\n\n{text}",
    "Translate the following text into {language}.\n\n{text}",
    "Using only the documentation below, explain when someone would use `{name}`.\n\n{text}",
    "Read this and answer: what does `{name}` do, and what does it return?\n\n{text}",
    "Rewrite this documentation so that a beginner can follow it.\n\n{text}",
    "Turn this text into three quiz questions with answers.\n\n{text}",
    "{text}\n\nWhat is the most important point of the text above?",
)
CODE_TASKS_ON_SOURCE = (
    "Explain what this Python code does, step by step.\n\n```python\n{code}\n```",
    "Is there a bug or an edge case this function does not handle?\n\n```python\n{code}\n```",
    "Write unit tests for this function with pytest.\n\n```python\n{code}\n```",
    "Rewrite this function to be easier to read, keeping its behaviour.\n\n```python\n{code}\n```",
    "Add type hints and a docstring to this function.\n\n```python\n{code}\n```",
)
WORD_PROBLEMS = (
    lambda r, a, b: (
        f"A shop sells {a} apples on Monday and {b} on Tuesday. How many apples did it sell? Show your work."
    ),
    lambda r, a, b: f"What is {a} times {b}? Explain each step.",
    lambda r, a, b: f"Solve for x: {a}x + {b} = {a * 3 + b}. Show the steps.",
    lambda r, a, b: f"A train travels {a * 10} km in {b % 9 + 1} hours. What is its average speed?",
    lambda r, a, b: f"If a shirt costs ${a} and is {b % 50 + 5}% off, what is the sale price?",
    lambda r, a, b: (
        f"I have {a} minutes of meetings and {b} minutes of focused work. How many hours is that in total?"
    ),
)
TRANSLATION_LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese")


def stdlib_passages() -> tuple[list[tuple[str, str]], list[str]]:
    """(name, docstring paragraph) pairs and small function sources from Python's standard library."""
    import importlib
    import inspect

    texts: list[tuple[str, str]] = []
    codes: list[str] = []
    for module_name in STDLIB_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, member in sorted(vars(module).items()):
            if name.startswith("_") or getattr(member, "__module__", None) != module.__name__:
                continue
            doc = inspect.getdoc(member) or ""
            if 150 <= len(doc) <= 1200:
                texts.append((f"{module_name}.{name}", doc))
            if inspect.isfunction(member):
                try:
                    source = inspect.getsource(member)
                except (OSError, TypeError):
                    continue
                if 4 <= source.count("\n") <= 30:
                    codes.append(source.rstrip())
    return texts, codes


def passage_instructions(count: int, seed: int = 0) -> list[str]:
    """`count` distinct instructions over standard-library texts and code, and word problems."""
    rng = random.Random(seed + 1)
    texts, codes = stdlib_passages()
    seen: dict[str, None] = {}
    attempts = 0
    while len(seen) < count and attempts < count * 50:
        attempts += 1
        kind = rng.random()
        if kind < 0.5 and texts:
            name, text = rng.choice(texts)
            task = rng.choice(TEXT_TASKS)
            text = text[:400] if "Translate" in task else text
            seen.setdefault(
                task.format(text=text, name=name, language=rng.choice(TRANSLATION_LANGUAGES)), None
            )
        elif kind < 0.8 and codes:
            seen.setdefault(rng.choice(CODE_TASKS_ON_SOURCE).format(code=rng.choice(codes)), None)
        else:
            seen.setdefault(rng.choice(WORD_PROBLEMS)(rng, rng.randint(2, 99), rng.randint(2, 99)), None)
    return list(seen)


TEMPLATE_SHARE = 0.6  # of the instructions; the rest work on a pasted text or code, or are word problems


def training_instructions(count: int, seed: int = 0) -> list[str]:
    """`count` distinct instructions in a fixed order for a seed: the template ones first, then the
    ones over a text or code. A longer list starts with the template instructions of a shorter one."""
    templated = round(count * TEMPLATE_SHARE)
    return template_instructions(templated, seed) + passage_instructions(count - templated, seed)


def distinct(draw, count: int) -> list:
    """Up to `count` distinct results of draw(), in the order first drawn (as many as 50 draws each allow)."""
    seen: dict = {}
    attempts = 0
    while len(seen) < count and attempts < count * 50:
        seen.setdefault(draw(), None)
        attempts += 1
    return list(seen)


def template_instructions(count: int, seed: int = 0) -> list[str]:
    """`count` distinct instructions from TEMPLATES (as many as they allow)."""
    rng = random.Random(seed)
    return distinct(lambda: rng.choice(TEMPLATES)(rng), count)


def training_prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    """Chat-formatted prompt ids for `count` instructions."""
    from engine.models.chat_template import chat_prompt_ids

    return [
        chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
        for text in training_instructions(count, seed)
    ]
