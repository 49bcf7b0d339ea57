"""Greedy tree verification is token-identical to plain greedy decoding.

A scripted drafter gives every position the same graded logits profile, so
the tree the builder makes always has the same shape in candidate ranks. Each
cycle it puts the target's own continuation along the path to one scheduled
node of that shape and pushes the token after it out of every candidate
list: the cycle must accept exactly that node's depth. The schedule visits
every node, so every accepted depth and every branch occurs, and the output
must equal greedy autoregressive decoding token for token (on the CPU the
node logits are bitwise those of stepping the path).
"""

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.engine.drafter.model import Drafter
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.tree.build import build_tree, lattice_logprobs
from helpers import FAMILIES, ScriptedDrafter, ar_tokens, decode_steps, load_pair_for, node_ranks

ATTENTION_ONLY = FAMILIES + ["gemma3_text", "muse_glimmer"]
PROFILE = 8.0 - 0.8 * np.arange(6)  # logits of the six ranked candidates; every other token 0


class ScriptedTreeDrafter(ScriptedDrafter):
    """Cycle c steers the target's continuation to node c % rows of the tree."""

    def __init__(self, base, reference, prompt_len, vocab, rows, selector_transform):
        super().__init__(base, reference, prompt_len, lambda c: 0, vocab)
        self.rows, self.selector_transform, self.shape = rows, selector_transform, None
        self.scheduled: list[int] = []

    def _logits(self, ranked) -> mx.array:
        out = np.zeros((len(ranked), self.vocab), np.float32)
        for t, (tokens, absent) in enumerate(ranked):
            out[t, tokens] = PROFILE
            if absent is not None:
                out[t, absent] = -30.0  # below every candidate, in no list
        return mx.array(out)

    def _ranked(self, t, want=None, rank=None):
        """Six tokens for position t with `want` at `rank`; `want` is pushed out
        of the list when rank is None."""
        base = want if want is not None else 1
        fill = [(base + 1 + i + 3 * t) % self.vocab for i in range(len(PROFILE))]
        if rank is None:
            return fill, want
        return fill[:rank] + [want] + fill[rank : len(PROFILE) - 1], None

    def plan(self, B: int):
        """The tree's shape: it depends only on the profile (the selector's pair
        scores are zero, so its gate and the hidden states do not matter)."""
        hidden = mx.zeros((B - 1, self.config.hidden_size))
        logits = self._logits([self._ranked(t) for t in range(B - 1)])
        logq, cand = lattice_logprobs(self, logits, hidden, 0, 0.0, self.selector_transform)
        self.shape = build_tree(np.array(logq), np.array(cand), 0, self.rows)
        self.ranks = node_ranks(self.shape, np.array(cand))
        return self.shape

    def draft(self, block_ids, features, cache, target):
        hidden, _ = Drafter.draft(self, block_ids, features, cache, target)
        B = block_ids.shape[1]
        generated = cache[0].offset - self.prompt_len + 1
        want = list(self.reference[generated : generated + B - 1])
        node = self.cycle % self.rows
        self.cycle += 1
        self.scheduled.append(node)
        path = self.shape.path(node)[1:]
        ranked = [self._ranked(t, want[t], self.ranks[path[t]]) if t < len(path)
                  else self._ranked(t, want[t]) if t == len(path) else self._ranked(t)
                  for t in range(B - 1)]
        return hidden, self._logits(ranked)


def _run(target, base, prompt, rows):
    B = base.config.block_size
    drafter = ScriptedTreeDrafter(base, [], len(prompt), target.vocab_size, rows,
                                  Pair.make(target, base).selector_transform)
    # The first token, one cycle per node (each commits its depth + 1), then one more.
    n = 1 + sum(d + 1 for d in drafter.plan(B).depth) + 1
    drafter.reference = ar_tokens(target, prompt, n + B)
    request = DecodeRequest(max_tokens=n, block_size=None, tree_rows=rows)
    steps = list(decode_steps(prompt, Pair.make(target, drafter), request))
    return [t for s in steps for t in s.tokens], drafter.reference[:n], steps, drafter


@pytest.mark.parametrize("family", ATTENTION_ONLY)
def test_scripted_tree_hits_every_node_and_matches_ar(family):
    target, _, base = load_pair_for(family, "dflash2")
    for rows, prompt in ((4, [5]), (8, [17, 42, 99, 7, 250, 3, 61]), (16, list(range(20, 120, 3)))):
        out, reference, steps, drafter = _run(target, base, prompt, rows)
        assert out == reference, f"{family} N={rows}: diverged at {_first_diff(out, reference)}"
        shape, cycles = drafter.shape, steps[1:]
        assert [s.verify_rows for s in cycles] == [rows] * len(cycles)
        # Cycle c accepted exactly the depth of node c: every node, so every
        # depth and every branch (rank) of the tree, was the stopping point once.
        assert [s.accepted for s in cycles] == [shape.depth[c % rows] for c in range(len(cycles))]
        assert len(cycles) == rows + 1
        assert shape.max_depth > 1 and len(set(drafter.ranks)) > 1, "the tree has no depth or no branches"


def _first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"token {i}: {x} vs {y}"
    return f"length {len(a)} vs {len(b)}"


def test_scripted_tree_from_a_dflash_v1_lattice():
    """DFlash (v1): the tree comes from the per-position top-K."""
    target, _, base = load_pair_for("qwen3", "dflash")
    out, reference, steps, drafter = _run(target, base, [17, 42, 99, 7], 8)
    assert out == reference
    assert [s.accepted for s in steps[1:]] == [drafter.shape.depth[c % 8] for c in range(len(steps) - 1)]


@pytest.mark.parametrize("family", ATTENTION_ONLY)
def test_random_drafters_tree_parity(family):
    prompt = [17, 42, 99, 7, 250, 3, 61]
    for kind, rows in (("dflash", 5), ("dflash2", 16)):
        target, _, drafter = load_pair_for(family, kind)
        reference = ar_tokens(target, prompt, 16)
        request = DecodeRequest(max_tokens=16, block_size=None, tree_rows=rows)
        steps = decode_steps(prompt, Pair.make(target, drafter), request)
        out = [t for s in steps for t in s.tokens]
        assert out == reference, f"{family} {kind} N={rows}: diverged at {_first_diff(out, reference)}"
