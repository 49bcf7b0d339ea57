"""Plain decoding steps inside the speculative loop (block size 1).

When drafting does not pay, the speculative loop decodes one token per target
pass through its own caches, with mlx-lm's look-ahead: the next step is
launched before the current token is fetched, so the device never waits for
Python. Each step also captures the drafter's target layers (references to
activations the pass computes anyway), so the rows decoded plainly reach the
drafter cache before the next draft, in one batch, and the caches stay level:
target cache = committed tokens - 1 = drafter cache + pending rows.
"""

from typing import Callable, Generator

import mlx.core as mx

from ..pair import Pair
from ..sampling import split_key

# Pending rows pushed into the drafter cache at once during long plain runs
# (bounds the memory the captured features hold).
FLUSH_ROWS = 256


def plain_steps(
    anchor: int,
    pair: Pair,
    cache,
    pending: list,
    *,
    tokens_left: int,
    sample: Callable[[mx.array, mx.array], mx.array],
    key: mx.array,
    next_block: Callable[[int], int],
    make_step: Callable[..., object],
    fetch: Callable[[mx.array, str], object],
) -> Generator[object, None, tuple[int, int, mx.array, int]]:
    """Decode plainly from `anchor` until `next_block` asks for a larger block
    or no tokens are left. Yields one step per token; returns
    (last token, the block size decided next (0: none left), key, tokens committed).

    `pending` (a list of feature arrays [1, n, F]) receives the features of
    every row run here; the caller owns it so an early close loses nothing.
    """
    target, drafter = pair.target, pair.drafter
    launched = None  # the look-ahead step: (token, features, undo), not yet committed

    def step(token: mx.array, key: mx.array):
        logits, features, undo = target.forward_undoable(token.reshape(1, 1), cache.target, pair.layer_ids)
        y = sample(logits[0, -1], key)
        mx.async_eval(y)
        return y, features, undo

    # The cache no longer ends with the last verified block (recurrent rewinds need that).
    cache.last_verify = None
    key, sub = split_key(key)
    current = step(mx.array([anchor], dtype=mx.int32), sub)
    n = 0
    rows = sum(f.shape[1] for f in pending)  # counted once, not per token
    try:
        while True:
            tokens_left -= 1
            # Decide the next cycle before fetching this token, so a plain next
            # step can be launched first.
            decided = next_block(tokens_left) if tokens_left > 0 else 0
            if decided == 1:
                key, sub = split_key(key)
                launched = step(current[0], sub)
            token = fetch(current[0], "plain")
            pending.append(current[1])
            rows += 1
            if rows >= FLUSH_ROWS:
                _flush(drafter, cache, pending)
                rows = 0
            cache.tokens.append(token)
            n += 1
            yield make_step(token)
            if launched is None:
                return token, decided, key, n
            current, launched = launched, None
    finally:
        if launched is not None:  # closed early: undo the look-ahead row
            target.rollback(cache.target, launched[2], keep=0)


def _flush(drafter, cache, pending: list) -> None:
    drafter.append_context(mx.concatenate(pending, axis=1), cache.drafter)
    mx.async_eval([c.state for c in cache.drafter])
    pending.clear()
