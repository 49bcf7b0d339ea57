"""Random qwen3 targets of a real model's size, with a drafter whose proposals are scripted.

A trained drafter for a 1B or 6B target is not something this machine can
fetch, and acceptance is not what the GPU check measures: costs are. So the
target is random (bf16 on a GPU, real shapes, Qwen3's vocabulary of 151,936)
and the drafter is a random one-layer DFlash 2 drafter (the target's widths) that runs its real pass
and then proposes the target's own greedy continuation, keeping each position
with probability alpha once the earlier ones were kept. Its tau comes from the
script (1 + alpha + ... + alpha^(B-1) for a block of B), not from training;
every cost (drafter pass, selection, verify, bookkeeping) is the real one.
"""

import random

import mlx.core as mx
from mlx.utils import tree_flatten

from dflash2_mlx.device import backend_name
from dflash2_mlx.engine.decode.loop import generate_step
from dflash2_mlx.engine.drafter.model import Drafter
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.plan import plan
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.target.adapter import Target
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter

# hidden, layers, MLP width, heads, KV heads, head_dim, vocab. "1b": 2048 x 16 (1.1B with the
# tied embedding); "6b": 4096 x 32 (6.3B), Qwen3-8B's widths. --quick: a few million.
SIZES = {
    "1b": (2048, 16, 6144, 16, 8, 128, 151936),
    "6b": (4096, 32, 11008, 32, 8, 128, 151936),
}
QUICK = {"1b": (128, 2, 384, 4, 2, 32, 2048), "6b": (192, 3, 512, 4, 2, 48, 2048)}
# Prompt ids of the synthetic pairs (no tokenizer: the decode loop works on ids).
PROMPT_IDS = [(7 * i + 3) % 1999 + 10 for i in range(64)]


def synthetic_target(size: str, quick: bool) -> tuple[Target, dict]:
    from mlx_lm.models import qwen3

    H, L, I, heads, kv, hd, V = (QUICK if quick else SIZES)[size]
    config = dict(model_type="qwen3", hidden_size=H, num_hidden_layers=L, intermediate_size=I,
                  num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, rms_norm_eps=1e-6,
                  vocab_size=V, tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=40960)
    mx.random.seed(0)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    dtype = mx.float32 if backend_name() == "cpu" else mx.bfloat16
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    n = sum(v.size for _, v in tree_flatten(model.parameters()))
    return Target(model), {"config": config, "parameters": n, "dtype": str(dtype).replace("mlx.core.", "")}


def greedy_reference(target: Target, ids: list[int], tokens: int) -> list[int]:
    """The target's plain greedy continuation (the engine's plain loop)."""
    pair = Pair.make(target)
    decode = plan(pair, DecodeRequest(max_tokens=tokens, block_size=None), prompt_ids=ids)
    return [t for step in generate_step(ids, pair, decode) for t in step.tokens]


def scripted_pair(target: Target, config: dict, reference: list[int], prompt_len: int, alpha: float,
                  seed: int = 0) -> Pair:
    """`config`: the target's. The drafter has one layer with the target's attention and MLP widths."""
    dconf = drafter_config_dict(config, "dflash2", num_layers=1, block_size=16)
    dconf.update({k: config[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim",
                                         "intermediate_size")})
    base = random_drafter(dconf)
    base.set_dtype(target.activation_dtype)
    return Pair.make(target, ScriptedProposals(base, reference, prompt_len, alpha, target.vocab_size, seed))


def expected_tau(alpha: float, block: int) -> float:
    """Tokens per verify of a chain of `block` (anchor included) under the script."""
    return 1.0 + sum(alpha**k for k in range(1, block))


class ScriptedProposals(Drafter):
    """Runs the real drafter pass, then proposes the reference continuation,
    keeping position t with probability alpha once the earlier ones were kept."""

    def __init__(self, base: Drafter, reference, prompt_len: int, alpha: float, vocab: int, seed: int = 0):
        super().__init__(base.config, fc_in_features=base.fc.weight.shape[1])
        self.update(base.parameters())
        if self.is_dflash2:  # a zero successor codebook makes the walk follow the logits
            sel = self.candidate_selector
            sel.successor_codebook.weight = mx.zeros_like(sel.successor_codebook.weight)
        self.reference, self.prompt_len, self.alpha, self.vocab = reference, prompt_len, alpha, vocab
        self.rng = random.Random(seed)

    def draft(self, block_ids, features, cache, target):
        hidden, _ = super().draft(block_ids, features, cache, target)
        done = cache[0].offset - self.prompt_len + 1  # tokens generated before the anchor's successor
        B = block_ids.shape[1]
        wanted = list(self.reference[done : done + B - 1])
        wanted += [0] * (B - 1 - len(wanted))
        for t in range(B - 1):
            if self.rng.random() >= self.alpha:
                wanted[t] = (wanted[t] + 1) % self.vocab
                break
        logits = 10.0 * (mx.arange(self.vocab)[None, :] == mx.array(wanted)[:, None]).astype(mx.float32)
        return hidden, logits.astype(hidden.dtype)
