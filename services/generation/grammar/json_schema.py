"""JSON grammars patched where xgrammar 0.2.9 would admit invalid JSON.

xgrammar writes a string with minLength/maxLength as ``[^"\\\\\\r\\n]{min,max}``: a raw TAB or any other
control character passes, and the document is no longer JSON (json.loads rejects it; found by
tests/unit/generation/test_structured_output_properties.py). The grammar xgrammar builds from a
JSON schema (or from a structural tag's JSON arguments) is printed as EBNF, that character class
becomes ``[^"\\\\\\0-\\x1f]``, and the EBNF is parsed back: the same grammar with the same
counted-repetition rules, so compiling and masking cost what they did. (Rewriting such strings
as a JSON-schema ``pattern`` instead was measured: with bounds in the hundreds, xgrammar's regex
path made each mask 40 ms per row instead of ~10 us.) Nothing valid is lost: xgrammar's bounded
strings could not hold escapes before either.
"""

from __future__ import annotations

from services.generation.grammar.xgr import xgrammar

_UNSAFE = '[^\\"\\\\\\r\\n]'  # as xgrammar prints it: not a quote, a backslash, CR or LF
_SAFE = '[^\\0-\\x1f\\"\\\\]'  # not a control character (CR and LF included), a quote or a backslash


def safe_json_grammar(grammar):
    """grammar (xgrammar.Grammar), with raw control characters kept out of its JSON strings."""
    text = str(grammar)
    if _UNSAFE not in text:
        return grammar
    xgr = xgrammar()
    return xgr.Grammar.from_ebnf(text.replace(_UNSAFE, _SAFE))
