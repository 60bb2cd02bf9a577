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


class PromptSource:
    """Hands out the fixed-seed prompts in order, never the same one twice in a run: a repeated
    prompt would be a prefix-cache hit (llama-server caches slot prompts, mstar has a prefix
    cache) and measure the cache instead of prefill. `reset()` before each system so every
    system gets the same sequence."""

    def __init__(self, words: int, seed: int = SEED, batch: int = 256) -> None:
        self.words, self.seed, self.batch = words, seed, batch
        self._prompts: list[str] = []
        self._next = 0

    def reset(self) -> None:
        self._next = 0

    def next(self) -> str:
        if self._next >= len(self._prompts):
            self._prompts = make_prompts(len(self._prompts) + self.batch, self.words, self.seed)
        self._next += 1
        return self._prompts[self._next - 1]
