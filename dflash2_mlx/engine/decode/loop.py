"""The decode loops. They know nothing about text: token ids in, token ids out.

`speculative_generate_step` is spec §2.4: chunked prefill, then cycles of
draft -> walk -> verify -> accept -> roll back. `autoregressive_generate_step`
is the baseline through the same `Target`. Both take a `Pair` (the drafter,
its layer ids and block sizes are facts of the pair, worked out once), yield
one `DecodeStep` per target pass and leave their caches consistent when
closed early.
"""

from dataclasses import dataclass, field
from typing import Generator, Optional

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from ...errors import DFlashError
from .last_verify import LastVerify
from ..pair import Pair
from .plain import plain_steps
from .profile import CycleProfiler
from ..drafter.propose import propose
from ..sampling import SamplingParams, greedy_token, make_key, make_logprobs_transform, split_key
from ..tree.cycle import tree_cycle, tree_rows_for
from .verify import accept_greedy, accept_sampled


@dataclass(frozen=True)
class DecodeStep:
    """Tokens committed by one target pass (prefill, verify or AR step)."""

    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]
    drafted: int = 0  # draft positions in this pass (B - 1, a tree's depth); 0 for prefill/AR
    accepted: int = 0  # of those, how many the target accepted
    verify_rows: int = 0  # rows the target ran (B, a tree's rows, 1 for AR); 0 for prefill


@dataclass
class DecodeCache:
    """Target and drafter caches that persist across calls (multi-turn chat).

    At rest both hold every committed token except the last one, which the
    next call must pass as the first token of its prompt.
    """

    target: list
    drafter: Optional[list] = None
    tokens: list[int] = field(default_factory=list)
    # True when the caches hold rows past `tokens` that could not be rewound.
    stale: bool = False
    # The last verify block of a recurrent target, so `truncate` can rewind into it.
    last_verify: Optional[LastVerify] = None

    @property
    def offset(self) -> int:
        return self.target[0].offset if self.target else 0

    def truncate(self, n_tokens: int) -> None:
        """Forget committed tokens past the first `n_tokens` (an EOS or stop
        string ended the answer inside a verified block, or the caller broke
        off), keeping the at-rest invariant."""
        if len(self.tokens) <= n_tokens:
            return
        del self.tokens[n_tokens:]
        keep = max(n_tokens - 1, 0)
        if self.last_verify is not None and not can_trim_prompt_cache(self.target):
            # Recurrent layers: replay the rows of the last verified block that stay
            # (a no-op returning False when the cut is not inside that block).
            self.last_verify.rewind(self.target, self.offset, self.offset - keep)
        for caches in (self.target, self.drafter):
            if caches:
                excess = caches[0].offset - keep
                if excess > 0:
                    # Recurrent state cannot be rewound past its last verified
                    # block, and a window cache only by about one block:
                    # callers must re-prefill before continuing.
                    if not can_trim_prompt_cache(caches):
                        self.stale = True
                        return
                    try:
                        trim_prompt_cache(caches, excess)
                    except ValueError:
                        self.stale = True
                        return


def _prefill(prompt: mx.array, pair: Pair, cache: DecodeCache, prefill_step_size: int) -> mx.array:
    """Run the prompt through the target (and its features into the drafter
    cache) chunk by chunk; return the last row's logits [V]."""
    target, drafter = pair.target, pair.drafter
    logits = None
    for start in range(0, prompt.size, prefill_step_size):
        chunk = prompt[start : start + prefill_step_size][None]
        logits, features = target(chunk, cache.target, pair.layer_ids, last_logits_only=True)
        if drafter is not None:
            drafter.append_context(features, cache.drafter)
            mx.eval([c.state for c in cache.drafter])
        mx.eval([c.state for c in cache.target])
    return logits[0, -1]


def _check_continuation(cache: DecodeCache, prompt: mx.array) -> None:
    if cache.stale:
        raise DFlashError(
            "this prompt cache could not be rewound after the last answer (recurrent state): "
            "make a new one and prefill the conversation again"
        )
    if cache.tokens and prompt[0].item() != cache.tokens[-1]:
        raise DFlashError(
            "a continuing prompt must start with the cache's last committed token "
            f"({cache.tokens[-1]}), then the new tokens"
        )


def _first_token(logits: mx.array, sampling: SamplingParams, transform, key) -> mx.array:
    if sampling.greedy:
        return greedy_token(logits)
    return mx.random.categorical(transform(logits), key=key).astype(mx.int32)


def _plain_step(token: int) -> DecodeStep:
    return DecodeStep((token,), (False,), verify_rows=1)  # one target row, like an AR step


def _check_prompt(prompt) -> mx.array:
    prompt = mx.array(prompt, dtype=mx.int32).reshape(-1)
    if prompt.size == 0:
        raise DFlashError("the prompt is empty: give some text to continue")
    return prompt


def _joined(pending: list) -> Optional[mx.array]:
    """Pending feature chunks [1, n, F] as one array (None when there are none)."""
    if not pending:
        return None
    return pending[0] if len(pending) == 1 else mx.concatenate(pending, axis=1)


def speculative_generate_step(
    prompt,
    pair: Pair,
    *,
    max_tokens: int = 256,
    block_size: Optional[int] = None,
    sampling: SamplingParams = SamplingParams(),
    prefill_step_size: int = 2048,
    prompt_cache: Optional[DecodeCache] = None,
    profiler: Optional[CycleProfiler] = None,
    tree_rows: int = 0,
    policy=None,
) -> Generator[DecodeStep, None, None]:
    """Lossless block speculative decoding; yields one step per target pass.

    `block_size` (default: the checkpoint's) counts the anchor, so each cycle
    drafts `block_size - 1` tokens. `policy` (an `adaptive.BlockPolicy`), when
    given, picks every cycle's block size instead, 1 meaning a plain decoding
    step. `tree_rows` > 0 verifies a tree of that many rows from the drafter's
    lattice instead of the chain (docs/tree.md). `prompt_cache`, when given,
    already holds earlier context; `prompt` then starts with the cache's last
    committed token (committed, never run) followed by the new tokens.
    """
    target, drafter = pair.target, pair.drafter
    if drafter is None:
        raise DFlashError("speculative decoding needs a pair with a drafter")
    B_max = pair.block_size(block_size)
    mask_id = pair.mask_token_id
    prompt = _check_prompt(prompt)
    cache = prompt_cache or DecodeCache(target.make_cache(), drafter.make_cache())
    profiler = profiler or CycleProfiler()
    transform = make_logprobs_transform(sampling)
    key = make_key(sampling)
    if prompt_cache is not None:
        _check_continuation(prompt_cache, prompt)
    tree_rows = tree_rows_for(pair, tree_rows)
    if tree_rows:
        policy = None  # the cost model is the chain's: a tree drafts the fixed block

    def sample(logits, key):
        return _first_token(logits, sampling, transform, key)

    key, sub = split_key(key)
    first = sample(_prefill(prompt, pair, cache, prefill_step_size), sub)
    anchor = first.item()
    # A continuing call's prompt starts with the cache's last token (committed,
    # not yet run): record it once.
    cache.tokens.extend(prompt.tolist()[1 if cache.tokens else 0 :])
    pending = []  # features [1, n, F] of committed rows not yet in the drafter cache
    try:
        cache.tokens.append(anchor)
        yield DecodeStep((anchor,), (False,))
        generated, decided = 1, None
        while generated < max_tokens:
            left = max_tokens - generated
            B = decided or (policy.next_block(left) if policy else min(B_max, left + 1))
            decided = None
            if B == 1:
                anchor, decided, key, n = yield from plain_steps(
                    anchor, pair, cache, pending, tokens_left=left, sample=sample, key=key,
                    next_block=policy.next_block, make_step=_plain_step, fetch=profiler.fetch)
                generated += n
                continue
            profiler.start()
            key, k_draft, k_accept = split_key(key, 3)
            if tree_rows:
                # The drafter takes `pending` into its cache: never append it twice.
                fed = _joined(pending)
                pending.clear()
                cache.last_verify = None  # trees run on attention caches only: they trim
                tree = tree_cycle(pair, cache, anchor, fed, block=B, rows=tree_rows, sampling=sampling,
                                  transform=transform, key=k_accept, left=left,
                                  profiler=profiler)
                pending.append(tree.pending)
                tokens = tree.tokens
                cache.tokens.extend(tokens)
                anchor = tokens[-1]
                generated += len(tokens)
                flags = ((True,) * tree.accepted + (False,))[: len(tokens)]
                yield DecodeStep(tokens, flags, drafted=tree.tree.max_depth, accepted=tree.accepted,
                                 verify_rows=tree.tree.rows)
                continue
            block = mx.array([[anchor] + [mask_id] * (B - 1)], dtype=mx.int32)
            hidden, draft_logits = drafter.draft(block, _joined(pending), cache.drafter, target)
            pending.clear()  # now in the drafter cache: never append it twice
            profiler.lap("draft", draft_logits)
            prop = propose(drafter, draft_logits, hidden, anchor, sampling, transform, k_draft,
                           pair.selector_transform)
            # Start the drafter now and build the verify graph while it runs.
            mx.async_eval(prop.draft)
            profiler.lap("select", prop.draft)
            verify_in = mx.concatenate([mx.array([anchor], dtype=mx.int32), prop.draft])[None]
            cache.last_verify = None  # about to change: no longer the block the cache ends with
            logits, features, undo = target.forward_undoable(verify_in, cache.target, pair.layer_ids)
            profiler.lap("verify", logits, features)
            if sampling.greedy:
                a, bonus = accept_greedy(prop.draft, logits[0])
            else:
                a, bonus = accept_sampled(prop.draft, prop.q_full, logits[0], transform, k_accept)
            out = profiler.fetch(mx.concatenate([prop.draft, bonus[None], a[None]]))
            a, bonus = out[-1], out[-2]
            tokens = tuple(out[:a]) + (bonus,)
            # Keep the anchor and the accepted rows: committed tokens but the last.
            keep = a + 1
            left = max_tokens - generated
            if len(tokens) > left:  # the last block verified one draft past the limit
                tokens, keep = tokens[:left], left
            target.rollback(cache.target, undo, keep)
            cache.last_verify = LastVerify.after_rollback(target, undo, keep)
            pending.append(features[:, :keep])
            cache.tokens.extend(tokens)
            anchor = tokens[-1]
            generated += len(tokens)
            if policy is not None:
                policy.observe(B - 1, a)
            flags = ((True,) * a + (False,))[: len(tokens)]
            yield DecodeStep(tokens, flags, drafted=B - 1, accepted=a, verify_rows=B)
    finally:
        # Leave the drafter cache level with the target cache (both hold every
        # committed token but the last), so a later call can continue from it.
        if pending:
            drafter.append_context(_joined(pending), cache.drafter)
            mx.eval([c.state for c in cache.drafter])


def autoregressive_generate_step(
    prompt,
    pair: Pair,
    *,
    max_tokens: int = 256,
    sampling: SamplingParams = SamplingParams(),
    prefill_step_size: int = 2048,
    prompt_cache: Optional[DecodeCache] = None,
) -> Generator[DecodeStep, None, None]:
    """Plain decoding through the same target and sampling code, for baselines.

    The next token is computed before the current one is yielded (as mlx-lm
    does), so the device never idles while the caller handles a token. A
    drafter in `pair` is ignored.
    """
    target = pair.target
    prompt = _check_prompt(prompt)
    if prompt_cache is not None:
        _check_continuation(prompt_cache, prompt)
    cache = prompt_cache or DecodeCache(target.make_cache())
    transform = make_logprobs_transform(sampling)
    key = make_key(sampling)

    undo = None  # of the latest step, to undo the look-ahead

    def step(token: mx.array, key: mx.array) -> mx.array:
        nonlocal undo
        logits, _, undo = target.forward_undoable(token.reshape(1, 1), cache.target)
        return _first_token(logits[0, -1], sampling, transform, key)

    key, sub = split_key(key)
    y = _first_token(_prefill(prompt, pair.without_drafter(), cache, prefill_step_size), sampling, transform, sub)
    # A continuing call's prompt starts with the cache's last token (committed,
    # not yet run): record it once.
    cache.tokens.extend(prompt.tolist()[1 if cache.tokens else 0 :])
    generated = 0
    try:
        while True:
            next_y = None
            if generated + 1 < max_tokens:
                key, sub = split_key(key)
                next_y = step(y, sub)
                mx.async_eval(next_y)
            token = y.item()
            cache.tokens.append(token)
            generated += 1
            yield DecodeStep((token,), (False,), verify_rows=int(generated > 1))
            if next_y is None:
                return
            y = next_y
    finally:
        # The look-ahead may have run one token past what was committed (the
        # last step's input): undo it (recurrent layers cannot just trim).
        excess = cache.offset - (len(cache.tokens) - 1)
        if excess > 0:
            target.rollback(cache.target, undo, keep=0)
