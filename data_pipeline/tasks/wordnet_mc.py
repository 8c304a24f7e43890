"""Multiple choice over WordNet glosses: "which word does this definition describe?"

Read straight from the WordNet 3.0 database files of Debian's ``wordnet-base`` package
(``data_pipeline/wordnet.py``; no nltk download). An item is a synset with a single-word lower-case
lemma: the definition is the gloss before its first ``;`` (the quoted examples after it often
contain the word), the answer is the first such lemma, and three distractors are lemmas of other
synsets of the same part of speech, drawn with a generator seeded by the item's id. Items whose
definition contains one of the synset's words are skipped.
"""

from __future__ import annotations

import hashlib
import random
import re

from data_pipeline.tasks.built import BuiltTask, stable_order
from data_pipeline import wordnet

LEMMA = re.compile(r"^[a-z]{3,}$")


def candidates(root: str | None = None) -> dict[str, list[dict]]:
    """Part of speech (``n v a r``, satellites with ``a``) -> items with a definition and an answer
    (distractors not drawn yet)."""
    out: dict[str, list[dict]] = {}
    for pos in wordnet.FILES:
        items = []
        for s in wordnet.synsets(pos, root=root):
            answer = next((w for w in s.lemmas if LEMMA.match(w)), None)
            definition = s.definition.split(";")[0].strip()
            words = [w.lower() for w in s.lemmas]
            if answer and len(definition.split()) >= 4 and not any(w in definition.lower() for w in words):
                items.append(
                    {
                        "id": f"wn30:{pos}{s.offset:08d}",
                        "pos": pos,
                        "definition": definition,
                        "answer": answer,
                        "words": words,
                    }
                )
        out[pos] = items
    return out


def with_choices(item: dict, pool: list[str], num_choices: int) -> dict:
    """The item with ``num_choices`` choices (the answer at a seeded position) and its label."""
    rng = random.Random(int(hashlib.sha1(item["id"].encode()).hexdigest()[:16], 16))
    distractors: list[str] = []
    while len(distractors) < num_choices - 1:
        word = rng.choice(pool)
        if word not in item["words"] and word not in distractors:
            distractors.append(word)
    label = rng.randrange(num_choices)
    choices = distractors[:label] + [item["answer"]] + distractors[label:]
    return {"id": item["id"], "pos": item["pos"], "definition": item["definition"], "choices": choices, "label": label}


def build(
    wordnet_dir: str | None = None, *, num_test: int = 1000, num_train: int = 200, num_choices: int = 4
) -> BuiltTask:
    root = str(wordnet.wordnet_dir(wordnet_dir))  # WNSEARCHDIR or /usr/share/wordnet, else a one-line error
    by_pos = candidates(root)
    pools = {pos: sorted({i["answer"] for i in items}) for pos, items in by_pos.items()}
    ordered = stable_order([i for items in by_pos.values() for i in items])
    rows = [with_choices(i, pools[i["pos"]], num_choices) for i in ordered[: num_test + num_train]]
    test, train = rows[:num_test], rows[num_test:]
    shortest = sum(min(range(num_choices), key=lambda k: (len(r["choices"][k]), k)) == r["label"] for r in test)
    baselines = {"acc: chance": 1 / num_choices, "acc: the shortest word": shortest / len(test)}
    card = f"""Source: WordNet 3.0 (Princeton University; WordNet licence), the database files of Debian's
`wordnet-base` package read directly ({", ".join(wordnet.FILES.values())} in {root}). Construction: one
item per synset with a single-word lower-case lemma of 3+ letters and a definition (the gloss before its
first ";") of 4+ words that contains none of the synset's words; the answer is that lemma, the
{num_choices - 1} distractors are lemmas of other synsets of the same part of speech drawn with a generator
seeded by the item id. Items are ordered by a hash of their id; the first {num_test} form the test split,
the next {num_train} the train split (few-shot examples). Item id: `wn30:<part of speech><synset offset>`."""
    return BuiltTask(
        "wordnet_mc", {"train": train, "test": test}, baselines, card, {"num_choices": num_choices, "wordnet_dir": root}
    )
