"""How speculative drafts are proposed and accepted, as the engine simulator and
`specfleet simulate` both model it.

A verify step proposes `k` draft tokens; position `j` (0-based) is accepted
with probability `alpha·decay^j` provided every earlier position was accepted
(`decay = 1` is the i.i.d. model of Leviathan et al.). The target model always
adds one token of its own (the bonus token), so a step yields `1 + accepted`
tokens.
"""

from __future__ import annotations

import random

__all__ = ["PROMPT_LOOKUP", "draw"]

PROMPT_LOOKUP = frozenset({"ngram", "ngram_gpu", "suffix"})
"""Methods that draft only where the context holds a match (vLLM spelling)."""


def draw(alpha: float, k: int, rng: random.Random, decay: float = 1.0) -> int:
    """Number of draft tokens (0..k) the verifier accepts in one step."""
    accepted = 0
    p = alpha
    while accepted < k and rng.random() < p:
        accepted += 1
        p *= decay
    return accepted
