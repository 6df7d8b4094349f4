"""Write the open-chat prompt sets used to distill and to evaluate a chat draft.

Chat training prompts are templates x topics (seeded sample); translation requests go to a file of
their own. The evaluation set is hand-written and disjoint from them, and no training prompt is one
of the benchmarks' prompts (held-out or built-in). Re-running rewrites the same files.

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
    "photosynthesis",
    "gardening",
    "the solar system",
    "healthy eating",
    "learning a new language",
    "saving money",
    "climate change",
    "machine learning",
    "the water cycle",
    "public speaking",
    "meditation",
    "time management",
    "the Roman Empire",
    "volcanoes",
    "recycling",
    "electric cars",
    "the human heart",
    "sleep",
    "running",
    "cooking pasta",
    "chess",
    "the internet",
    "bees",
    "friendship",
    "job interviews",
    "renewable energy",
    "the ocean",
    "music lessons",
    "a balanced diet",
    "painting with watercolors",
    "camping",
    "the moon",
    "birds",
    "coffee",
    "rainforests",
    "writing a resume",
    "team work",
    "mountains",
    "dinosaurs",
    "the printing press",
    "yoga",
    "budget travel",
    "cats",
    "dogs",
    "baking bread",
    "video games",
    "volunteering",
    "the immune system",
    "electricity",
    "earthquakes",
    "a good night routine",
    "reading books",
    "honey",
    "weather forecasts",
    "robots",
    "the piano",
    "composting",
    "stress",
    "hiking safety",
    "smartphones",
]
# Free-form request shapes (the evaluation prompts are hand-written in this style, but none is generated).
SLOTS = {
    "character": [
        "a robot",
        "a young fox",
        "an old sailor",
        "a shy giant",
        "a curious girl",
        "a lost puppy",
        "a retired teacher",
        "a tiny mouse",
        "a brave knight",
        "a talking tree",
        "a baker",
        "two best friends",
        "a clumsy wizard",
        "a lonely astronaut",
        "a grandmother",
        "a street musician",
    ],
    "situation": [
        "finds a hidden door",
        "loses its way home",
        "learns to swim",
        "wins a contest",
        "makes a new friend",
        "discovers a secret map",
        "has to give a speech",
        "gets stuck in the rain",
        "opens a small shop",
        "travels to the sea",
        "meets a ghost",
        "plants a magic seed",
    ],
    "task": [
        "fix a flat bicycle tire",
        "start a vegetable garden",
        "write a cover letter",
        "learn to juggle",
        "save for a holiday",
        "make friends in a new city",
        "keep a plant alive",
        "cook rice",
        "organize my closet",
        "prepare for an exam",
        "train a puppy",
        "improve my handwriting",
        "fall asleep faster",
        "plan a birthday party",
        "reduce screen time",
        "memorize a speech",
        "choose a laptop",
        "clean a kitchen quickly",
        "start running",
        "write a good essay",
    ],
    "occasion": [
        "a camping trip",
        "a job interview",
        "a wedding",
        "a long flight",
        "a snowy weekend",
        "a first date",
        "a school play",
        "a picnic",
        "a family dinner",
        "moving house",
    ],
    "text": [
        "a thank-you note to a teacher",
        "a short speech for a friend's birthday",
        "an apology message to a coworker",
        "a product description for a water bottle",
        "a welcome message for new club members",
        "a letter to my future self",
        "a reminder email about a meeting",
        "a short review of a favourite book",
        "a motivational message for a sports team",
        "an invitation to a board game night",
    ],
    "phenomenon": [
        "is the sky blue",
        "do cats purr",
        "do we dream",
        "does bread rise",
        "do birds migrate",
        "does ice float on water",
        "is the sea salty",
        "do we get hiccups",
        "do stars twinkle",
        "do onions make people cry",
        "does the moon change shape",
        "does metal feel cold",
    ],
    "thing": [
        "a good teacher",
        "a great movie",
        "a healthy breakfast",
        "a strong password",
        "a good leader",
        "a cozy home",
        "a fun holiday",
        "a good night's sleep",
        "a successful meeting",
        "a happy life",
    ],
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
# Translation requests, a file of their own (translate_train.jsonl; append it to chat_train.jsonl for a
# head that drafts translations): everyday sentences, each into two of five languages, in five
# phrasings. None is a benchmark prompt's sentence. In the 30 minutes they doubled the head's
# held-out translation agreement (0.12 -> 0.24) and cost it open chat (docs/BENCHMARKS.md).
SENTENCES = """Where is the nearest train station?
Could you please open the window? It is very warm in here.
My sister works as a nurse at the city hospital.
We are going to the mountains for the weekend.
The shop on the corner closes at six in the evening.
I forgot my umbrella at the restaurant last night.
How much does a ticket to the museum cost?
The children are playing football in the park.
Please send me the report before Friday.
I have been learning to play the guitar for two years.
The weather will be sunny tomorrow with a light wind.
Can you recommend a good book for a long flight?
Our flight was delayed by three hours because of the storm.
He drinks a cup of coffee every morning before work.
The new bridge will open to traffic next month.
I would like a room with a view of the sea.
She is studying medicine at the university.
Do you know a good place to eat near the hotel?
The concert starts at eight, so we should leave at seven.
My grandmother grows tomatoes and beans in her garden.
The bus to the airport leaves every twenty minutes.
I am sorry, I do not understand. Could you speak more slowly?
We need to buy bread, milk and eggs for breakfast.
The library is closed on Sundays and public holidays.
Thank you very much for your help yesterday.
My phone battery is almost empty.
The teacher asked the students to read the first chapter.
It takes about fifteen minutes to walk to the beach.
I have an appointment with the dentist on Tuesday morning.
The price includes breakfast and free parking.
Our neighbours have two dogs and a very old cat.
Could you tell me how to get to the city centre?
The film was long, but the ending was wonderful.
He lost his keys and had to wait outside for an hour.
We celebrated my father's birthday with a big dinner.
Please turn off the lights when you leave the office.
The river is too cold for swimming in April.
I usually take the train to work, but today I drove.
This soup is delicious. What is in it?
The company is looking for an experienced engineer.
Do you accept credit cards?
It rained all day, so we stayed at home and played cards.
The pharmacy is next to the post office.
My brother is moving to Canada in the summer.
I need a doctor. My son has a high fever.
The train was full, so I had to stand the whole way.
We watched the sunset from the top of the hill.
The meeting will start as soon as everyone arrives.
I prefer tea without sugar.
How long does it take to get to the border by car?
She speaks three languages and is learning a fourth.
The museum has a large collection of old maps.
Could we have the bill, please?
The road is closed because of an accident.
My favourite season is autumn because of the colours.
They built a small wooden house near the lake.
I will call you when I arrive at the station.
The market sells fresh fish every Saturday morning.
Is there a bank near here where I can change money?
The kitchen needs to be cleaned before the guests arrive.
Our team won the match by two goals.
Please wait here until your name is called.
The hotel room was small but very clean.
I have never seen so many stars in the sky.
The baker opens his shop at five in the morning.
Can I try on this jacket in a larger size?
We planted three apple trees behind the house.
The lecture was interesting, but the room was too hot.
My car broke down on the way to the airport.
The cat is sleeping on the sofa again.
I would like to learn more about the history of this city.
The students have an exam next Wednesday.
Please remember to bring your passport.
He repairs old bicycles in his free time.
The cafe serves the best hot chocolate in town.
It is dangerous to cross the street here.
We are expecting about fifty guests at the wedding.
The doctor said I should rest for a few days.
Our apartment is on the fourth floor, and there is no lift.
She wrote a letter to her friend in Brazil.
The festival takes place every year in July.
I cannot find my glasses anywhere.
The waiter brought us water and a basket of bread.
Do you have any vegetarian dishes?
The little boy is afraid of the dark.
We took a boat trip along the coast.
The office is closed for the holidays until January.
My computer is very slow today.
The farmer sells cheese and honey at the market.
I think it is going to snow tonight.
Excuse me, is this seat free?
The garden is full of flowers in the spring.
He has been waiting for the bus for half an hour.
We had a picnic by the river on Sunday.
The hospital is on the other side of the town.
Could you help me carry these boxes upstairs?
I enjoy reading newspapers on the weekend.
The price of vegetables has gone up this year.
My parents met at a dance forty years ago.
The plane lands at half past ten at night.
Please do not touch the paintings.
She bought a red dress for the party.
We are lost. Can you show us on the map?
The water in the lake is clear and cold.
I have two brothers and one sister.
The shop has a sale on winter coats this week.
It is my first time visiting this country.
The old castle on the hill is open to visitors.
Our son starts school in September.
I would like to order the fish with rice, please.
The wind was so strong that the trees were bending.
They are painting the walls of the living room blue.
What time does the last train leave?
My friend is a very good cook.
The streets are quiet early in the morning.
I need to charge my phone. Is there a socket here?
We walked along the beach and collected shells.
The package should arrive within three working days.
He plays the piano in a small jazz band.""".strip().splitlines()
LANGUAGES = ["Spanish", "French", "German", "Italian", "Portuguese"]
TRANSLATE = [
    "Translate into {lang}: {s}",
    "Translate the following sentence into {lang}: {s}",
    'How do you say this in {lang}? "{s}"',
    "Please translate to {lang}: {s}",
    "Translate this English sentence to {lang}.\n\n{s}",
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


def _bench_prompts() -> set[str]:
    """Every first turn of the held-out and built-in benchmark prompts."""
    root = Path(__file__).resolve().parent
    out: set[str] = set()
    for path in (root / "prompts" / "heldout.jsonl", DATA / "prompts.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                out.add(d["turns"][0] if "turns" in d else d["prompt"])
    return out


def main() -> None:
    rng = random.Random(0)
    pairs = [(tpl, t) for tpl in TEMPLATES for t in TOPICS]
    rng.shuffle(pairs)
    train = [tpl.format(t=t) for tpl, t in pairs[:480]]
    bench = _bench_prompts()  # never train on a prompt the benchmarks measure
    free: set[str] = set()
    while len(free) < 480:  # of about 500 distinct fillings
        tpl = rng.choice(FREE)
        p = tpl.format(**{k: rng.choice(v) for k, v in SLOTS.items() if "{" + k + "}" in tpl})
        if p not in bench:
            free.add(p)
    train += sorted(free)
    rng.shuffle(train)
    tr_rng = random.Random(13)  # its own stream: the 960 prompts above stay as they were
    translate = [
        tr_rng.choice(TRANSLATE).format(lang=lang, s=s) for s in SENTENCES for lang in tr_rng.sample(LANGUAGES, 2)
    ]
    tr_rng.shuffle(translate)
    assert not set(train + translate) & (set(EVAL) | bench)
    assert not any(s in b for s in SENTENCES for b in bench)
    for name, prompts in (("chat_train.jsonl", train), ("translate_train.jsonl", translate)):
        with (DATA / name).open("w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}) + "\n")
    with (DATA / "chat_eval.jsonl").open("w") as f:
        for i, p in enumerate(EVAL, 1):
            f.write(json.dumps({"question_id": 100 + i, "category": "open_chat", "turns": [p]}) + "\n")
    print(
        f"wrote {len(train)} chat and {len(translate)} translation training prompts and {len(EVAL)} evaluation"
        f" prompts to {DATA}"
    )


if __name__ == "__main__":
    main()
