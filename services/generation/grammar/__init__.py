"""Structured output: grammar-constrained decoding (constraint -> compiled grammar -> per-step token mask).
(The constraint itself, services/common/structured_output.py, is shared with the preprocess service.)

compiler.py    xgrammar compiles off the engine loop, cached by content hash (cache.py: bounded LRU)
matcher.py     one sequence's position in its grammar, advanced on each sampled token
bitmask.py     the per-step mask: fill the constrained rows, -inf the disallowed logits
"""
