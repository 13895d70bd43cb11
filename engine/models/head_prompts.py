"""Instructions a draft head is trained on, generated from templates written for Tandem.

None comes from a public benchmark or from Tandem's own evaluation prompts: the head is measured
on prompts it never saw. The mix follows what people ask a small chat model: explanations, lists,
short writing, code, rewriting, comparisons, advice and quick facts.
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


def training_instructions(count: int, seed: int = 0) -> list[str]:
    """`count` distinct instructions (as many as the templates allow), in a fixed order for a seed."""
    rng = random.Random(seed)
    seen: dict[str, None] = {}
    attempts = 0
    while len(seen) < count and attempts < count * 50:
        seen.setdefault(rng.choice(TEMPLATES)(rng), None)
        attempts += 1
    return list(seen)


def training_prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    """Chat-formatted prompt ids for `count` instructions."""
    from engine.models.chat_template import chat_prompt_ids

    return [
        chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
        for text in training_instructions(count, seed)
    ]
