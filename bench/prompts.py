"""Fixed-seed synthetic prompts: every peer gets the very same texts, in the same order.

Words are drawn from a small common-English list so the tokenizer sees ordinary text (about
1.3 tokens a word for SmolLM2's BPE). Each prompt is different, so no peer gets prefix-cache help
that another would not.
"""

from __future__ import annotations

import random

WORDS = (
    "the of and to in is was for on that with as by at from his her an which are this be had not "
    "but have were it they one all their can more when there been would so what about if into only "
    "other new some could time these two may then first any like now over such our man me even most "
    "made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three small house water river stone garden "
    "music window market forest letter number station morning evening question answer story family city"
).split()

SEED = 20260101


def make_prompts(count: int, words: int, seed: int = SEED) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        out.append(text[0].upper() + text[1:] + ".")
    return out
