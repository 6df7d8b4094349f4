"""Write the open-chat prompt sets used to distill and to evaluate a chat draft (issue 7).

Training prompts are templates x topics (seeded sample); the evaluation set is
hand-written and disjoint from them (and from the built-in bench prompts it
adds to). Re-running rewrites the same files.

    .venv/bin/python benchmarks/make_chat_prompts.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "src" / "draftgate" / "data"

TEMPLATES = [
    "Explain {t} in simple terms.",
    "What are the main benefits of {t}?",
    "Give me three tips about {t}.",
    "Write a short paragraph about {t}.",
    "What is the history of {t}?",
    "How can a beginner get started with {t}?",
    "What are common mistakes people make with {t}?",
    "Write a short poem about {t}.",
    "Describe {t} to a ten-year-old.",
    "What are the pros and cons of {t}?",
    "Why is {t} important?",
    "Write a short story that involves {t}.",
    "Can you summarize the key ideas of {t}?",
    "List five interesting facts about {t}.",
]
TOPICS = [
    "photosynthesis", "gardening", "the solar system", "healthy eating", "learning a new language",
    "saving money", "climate change", "machine learning", "the water cycle", "public speaking",
    "meditation", "time management", "the Roman Empire", "volcanoes", "recycling", "electric cars",
    "the human heart", "sleep", "running", "cooking pasta", "chess", "the internet", "bees",
    "friendship", "job interviews", "renewable energy", "the ocean", "music lessons", "a balanced diet",
    "painting with watercolors", "camping", "the moon", "birds", "coffee", "rainforests", "writing a resume",
    "team work", "mountains", "dinosaurs", "the printing press", "yoga", "budget travel", "cats", "dogs",
    "baking bread", "video games", "volunteering", "the immune system", "electricity", "earthquakes",
    "a good night routine", "reading books", "honey", "weather forecasts", "robots", "the piano",
    "composting", "stress", "hiking safety", "smartphones",
]
# Free-form request shapes (the evaluation prompts are hand-written in this style, but none is generated).
SLOTS = {
    "character": ["a robot", "a young fox", "an old sailor", "a shy giant", "a curious girl", "a lost puppy",
                  "a retired teacher", "a tiny mouse", "a brave knight", "a talking tree", "a baker",
                  "two best friends", "a clumsy wizard", "a lonely astronaut", "a grandmother", "a street musician"],
    "situation": ["finds a hidden door", "loses its way home", "learns to swim", "wins a contest",
                  "makes a new friend", "discovers a secret map", "has to give a speech", "gets stuck in the rain",
                  "opens a small shop", "travels to the sea", "meets a ghost", "plants a magic seed"],
    "task": ["fix a flat bicycle tire", "start a vegetable garden", "write a cover letter", "learn to juggle",
             "save for a holiday", "make friends in a new city", "keep a plant alive", "cook rice",
             "organize my closet", "prepare for an exam", "train a puppy", "improve my handwriting",
             "fall asleep faster", "plan a birthday party", "reduce screen time", "memorize a speech",
             "choose a laptop", "clean a kitchen quickly", "start running", "write a good essay"],
    "occasion": ["a camping trip", "a job interview", "a wedding", "a long flight", "a snowy weekend",
                 "a first date", "a school play", "a picnic", "a family dinner", "moving house"],
    "text": ["a thank-you note to a teacher", "a short speech for a friend's birthday",
             "an apology message to a coworker", "a product description for a water bottle",
             "a welcome message for new club members", "a letter to my future self",
             "a reminder email about a meeting", "a short review of a favourite book",
             "a motivational message for a sports team", "an invitation to a board game night"],
    "phenomenon": ["is the sky blue", "do cats purr", "do we dream", "does bread rise", "do birds migrate",
                   "does ice float on water", "is the sea salty", "do we get hiccups", "do stars twinkle",
                   "do onions make people cry", "does the moon change shape", "does metal feel cold"],
    "thing": ["a good teacher", "a great movie", "a healthy breakfast", "a strong password", "a good leader",
              "a cozy home", "a fun holiday", "a good night's sleep", "a successful meeting", "a happy life"],
}
FREE = [
    "Tell me a story about {character} who {situation}.",
    "Write a short story about {character} who {situation}.",
    "How do I {task}?",
    "What is the best way to {task}?",
    "Can you help me {task}?",
    "What should I bring to {occasion}?",
    "How should I prepare for {occasion}?",
    "Write {text}.",
    "Please write {text}.",
    "Why {phenomenon}?",
    "What makes {thing}?",
    "Describe {thing} in a few sentences.",
]
EVAL = [
    "Tell me a short story about a dragon who is afraid of the dark.",
    "How do I make a good first impression at a new job?",
    "What should I pack for a weekend trip to the beach?",
    "Explain how a rainbow forms.",
    "Write a friendly email inviting my neighbors to a picnic.",
    "What are some fun activities to do on a rainy day?",
    "Why do leaves change color in autumn?",
    "Give me advice on how to stay motivated when studying.",
    "Describe a perfect morning routine.",
    "What makes a good friend?",
]


def main() -> None:
    rng = random.Random(0)
    pairs = [(tpl, t) for tpl in TEMPLATES for t in TOPICS]
    rng.shuffle(pairs)
    train = [tpl.format(t=t) for tpl, t in pairs[:480]]
    free: set[str] = set()
    while len(free) < 480:  # of about 500 distinct fillings
        tpl = rng.choice(FREE)
        free.add(tpl.format(**{k: rng.choice(v) for k, v in SLOTS.items() if "{" + k + "}" in tpl}))
    train += sorted(free)
    rng.shuffle(train)
    assert not set(train) & set(EVAL)
    with (DATA / "chat_train.jsonl").open("w") as f:
        for p in train:
            f.write(json.dumps({"prompt": p}) + "\n")
    with (DATA / "chat_eval.jsonl").open("w") as f:
        for i, p in enumerate(EVAL, 1):
            f.write(json.dumps({"question_id": 100 + i, "category": "open_chat", "turns": [p]}) + "\n")
    print(f"wrote {len(train)} training and {len(EVAL)} evaluation prompts to {DATA}")


if __name__ == "__main__":
    main()
