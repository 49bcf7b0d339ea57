"""Regenerate the announcement's tables (recall by draft position, τ at T = 0
and 1, overheads) for our own drafters, in one run.

For each variant (DFlash, DFlash + selector, DFlash + conv, DFlash 2):
- teacher-forced, on held-out blocks: Recall@1 and Recall@K by position, each
  conditioned on every earlier position being right (top-1 right for Recall@1,
  in the top-K for Recall@K), the selector walk's top-1 under the same
  conditioning, and the implied τ and oracle τ;
- decoded, on held-out prompts: τ at T=0 and T=1 (greedy parity with
  autoregressive decoding checked on the way);
- parameter counts, and cycle latency measured in the same run, as overhead
  relative to DFlash.
"""

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from .analyze_progress import AnalyzeStep, StepCounter
from .cycle_profile import cycle_breakdown
from ..engine.pair import Pair
from ..engine.decode.loop import generate_step
from ..engine.plan import plan
from ..engine.request import DecodeRequest
from ..errors import DFlashError
from ..engine.sampling import SamplingParams
from ..engine.logit_transform import apply_logit_transform
from ..engine.drafter.selector import top_k_candidates
from ..train.data import Packed, pack_examples, read_examples
from ..train.forward import packed_forward, target_features
from ..train.packing import make_blocks, sample_anchors
from ..train.setup import is_heldout

TF_BATCH = 8  # held-out sequences per teacher-forced forward pass
Tick = Optional[Callable[[str], None]]  # called before each unit of work with what it is


@dataclass
class Tally:
    """Counts per position for conditional recalls and leading-run τ."""

    B: int

    def __post_init__(self):
        z = lambda: np.zeros(self.B - 1)  # noqa: E731
        self.hit1, self.reach1, self.hitK, self.reachK, self.hitW, self.reachW = z(), z(), z(), z(), z(), z()
        self.runs1, self.runsK, self.runsW = [], [], []

    def add(self, hits: np.ndarray, which: str) -> None:
        """hits [NB, B-1] bool: was position t right (by this criterion)?"""
        ok_before = np.concatenate([np.ones((hits.shape[0], 1), bool), np.cumprod(hits, axis=1)[:, :-1] > 0], axis=1)
        hit, reach, runs = {"1": (self.hit1, self.reach1, self.runs1), "K": (self.hitK, self.reachK, self.runsK),
                            "W": (self.hitW, self.reachW, self.runsW)}[which]
        hit += (ok_before & hits).sum(0)
        reach += ok_before.sum(0)
        runs.extend((np.cumprod(hits, axis=1).sum(1) + 1).tolist())

    @staticmethod
    def rate(hit, reach) -> list[float]:
        return (hit / np.maximum(reach, 1)).tolist()


def teacher_forced(pair: Pair, sequences: np.ndarray, blocks_per_seq: int, seed: int = 0, tick: Tick = None,
                   answers: Optional[np.ndarray] = None) -> dict:
    """Recall and teacher-forced τ over `sequences`. With `answers` (data.Packed's marks) every
    block lies inside the answers, as the trainer's held-out evaluation draws them and as every
    block at inference does; without, anchors fall anywhere (prompts and templates included)."""
    target, drafter = pair.target, pair.drafter
    B, K = drafter.config.block_size, drafter.config.selector_top_k
    tally = Tally(B)
    mass, nblocks = np.zeros(B - 1), 0
    for start in range(0, len(sequences), TF_BATCH):
        rows = np.arange(start, min(start + TF_BATCH, len(sequences)))
        if tick:
            tick(f"sequences {start + 1}-{rows[-1] + 1} of {len(sequences)}")
        tokens = mx.array(sequences[rows])
        seq, anchors = sample_anchors([[seed, int(r)] for r in rows], tokens.shape[1], B, blocks_per_seq,
                                      None if answers is None else answers[rows])
        seq, anchors = mx.array(seq), mx.array(anchors)
        inputs, labels = make_blocks(tokens, seq, anchors, B, drafter.config.mask_token_id)
        feats = target_features(target, tokens, pair.layer_ids)
        hidden, logits = packed_forward(target, drafter, feats, inputs, seq, anchors)
        NB, Bm1, V = logits.shape
        flat = logits.reshape(NB * Bm1, V)
        values, cand = top_k_candidates(flat, K)
        # How much of the drafter's own T=1 distribution its top-K holds: a
        # sampled walk proposes only inside the top-K, v1 samples everywhere.
        mass += np.array(mx.exp(mx.logsumexp(values, axis=-1) - mx.logsumexp(flat, axis=-1)).reshape(NB, Bm1)).sum(0)
        nblocks += NB
        lab = labels.reshape(-1, 1)
        tally.add(np.array((cand[:, :1] == lab).reshape(NB, Bm1)), "1")
        tally.add(np.array(mx.any(cand == lab, axis=-1).reshape(NB, Bm1)), "K")
        if drafter.is_dflash2:
            pick = _selector_pick(drafter, pair.selector_transform, values, cand, hidden, inputs, labels)
            tally.add(np.array(pick == lab[:, 0])
                      .reshape(NB, Bm1), "W")
    out = {
        "recall1_by_position": tally.rate(tally.hit1, tally.reach1),
        "recallK_by_position": tally.rate(tally.hitK, tally.reachK),
        "tau_teacher_forced": float(np.mean(tally.runs1)),
        "tau_oracle": float(np.mean(tally.runsK)),
        "blocks": len(tally.runs1),
        "topK_mass_by_position": (mass / max(nblocks, 1)).tolist(),
    }
    if drafter.is_dflash2:
        out["walk_recall1_by_position"] = tally.rate(tally.hitW, tally.reachW)
        out["tau_walk_teacher_forced"] = float(np.mean(tally.runsW))
    return out


def _selector_pick(drafter, selector_transform, values, cand, hidden, inputs, labels) -> mx.array:
    """The greedy walk's pick at each position given the true predecessor."""
    unary = apply_logit_transform(values, selector_transform)
    pred = mx.concatenate([inputs[:, :1], labels[:, :-1]], axis=1).reshape(-1)
    scores = drafter.candidate_selector.true_predecessor_scores(
        unary, cand, hidden.reshape(unary.shape[0], -1), pred)
    return mx.take_along_axis(cand, mx.argmax(scores, axis=-1)[:, None], axis=-1)[:, 0]


def decoded_tau(pair: Pair, prompts: list[list[int]], max_tokens: int, temperature: float,
                block_size: Optional[int] = None, check_parity: bool = False, tree_rows: int = 0,
                tick: Tick = None) -> dict:
    """Mean τ over prompts (τ per prompt = committed tokens / verify passes),
    and the acceptance rate by draft position over all passes (P(position t
    accepted | every earlier one accepted)). `tree_rows` > 0 verifies trees of
    that many rows instead of the chain (a position is then a tree depth)."""
    taus, identical = [], 0
    B = pair.block_size(block_size)
    reached, accepted = np.zeros(B - 1), np.zeros(B - 1)
    for i, prompt in enumerate(prompts):
        if tick:
            tick(f"prompt {i + 1} of {len(prompts)}")
        sampling = SamplingParams(temperature=temperature, seed=i)
        request = DecodeRequest(max_tokens=max_tokens, block_size=block_size, sampling=sampling, tree_rows=tree_rows)
        steps = list(generate_step(prompt, pair, plan(pair, request, prompt_ids=prompt)))
        passes = steps[1:]
        taus.append(sum(len(s.tokens) for s in passes) / max(len(passes), 1))
        for s in passes:  # position t was tried if every earlier one was accepted
            reached[: min(s.accepted + 1, s.drafted)] += 1
            accepted[: s.accepted] += 1
        if check_parity:
            spec = [t for s in steps for t in s.tokens]
            plain = pair.without_drafter()
            ar = [s.tokens[0] for s in generate_step(prompt, plain, plan(plain, request, prompt_ids=prompt))]
            identical += spec == ar
    out = {"tau": float(np.mean(taus)), "tau_by_prompt": taus,
           "acceptance_by_position": (accepted / np.maximum(reached, 1)).tolist()}
    if check_parity:
        out["greedy_identical_to_ar"] = f"{identical}/{len(prompts)}"
    return out


def parameter_count(drafter) -> int:
    """Parameters that do anything: a DFlash 2 part still at its identity
    init (an ablation checkpoint carries both parts) is not counted."""
    total = 0
    for name, v in tree_flatten(drafter.parameters()):
        if name.startswith("candidate_selector.") and not _selector_active(drafter):
            continue
        if "_conv." in name and not _conv_active(drafter):
            continue
        total += v.size
    return total


def _selector_active(drafter) -> bool:
    # B = 0 makes every pairwise term vanish: the walk is the drafter's argmax.
    return bool(mx.any(drafter.candidate_selector.successor_codebook.weight != 0).item())


def _conv_active(drafter) -> bool:
    identity = mx.zeros((2, 2, drafter.config.hidden_size)).at[:, 0, :].add(1.0)
    for layer in drafter.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):
            if mx.any(conv.kernel_projection.weight != 0).item() or not mx.array_equal(conv.base_kernel, identity):
                return True
    return False


def variant_cycles(pairs: dict, prompt: list[int], cycles: int = 10, repeats: int = 5,
                   block_size: Optional[int] = None, counter: Optional[StepCounter] = None) -> dict:
    """Cycle latency of each variant: `repeats` rounds, the variants in
    alternating order each round, each round `cycles` cycles; the record of
    the median round per variant (its spread kept), so a burst of other work
    on the machine cannot land on one variant only."""
    rounds = {name: [] for name in pairs}
    for r in range(repeats):
        order = list(pairs) if r % 2 == 0 else list(reversed(pairs))
        for name in order:
            if counter:
                counter.start(name, "cycle latency", f"round {r + 1} of {repeats}")
            rounds[name].append(cycle_breakdown(pairs[name], prompt, cycles=cycles, block_size=block_size))
    out = {}
    for name, recs in rounds.items():
        ms = sorted(rec["cycle_ms_untimed"] for rec in recs)
        median = min(recs, key=lambda rec: abs(rec["cycle_ms_untimed"] - ms[len(ms) // 2]))
        out[name] = {**median, "repeats": repeats, "cycle_ms_untimed_rounds": [rec["cycle_ms_untimed"] for rec in recs]}
    return out


def analyze(pairs: dict, heldout: Packed, *, prompt_len: int = 64, n_prompts: int = 16,
            max_tokens: int = 64, blocks_per_seq: int = 8, block_size: Optional[int] = None,
            cycles: int = 10, cycle_repeats: int = 5, tree_rows: int = 0,
            on_step: Optional[Callable[[AnalyzeStep], None]] = None) -> dict:
    """Run every measurement for every variant; `pairs` maps variant names
    ("dflash", "dflash+selector", "dflash+conv", "dflash2") to pairs of the one
    target with each variant's drafter. `tree_rows` > 0 also decodes with trees
    of that many rows (τ beside the chain's and the oracle's). `on_step` is
    called before each unit of work (a teacher-forced batch, a decoded prompt,
    a cycle-latency round) and once at the end, never during one."""
    sequences = heldout.tokens
    prompts = [sequences[i, :prompt_len].tolist() for i in range(min(n_prompts, len(sequences)))]
    per_variant = -(-len(sequences) // TF_BATCH) + (4 if tree_rows else 2) * len(prompts) + cycle_repeats
    counter = StepCounter(len(pairs) * per_variant, on_step)
    base = pairs.get("dflash")
    result = {"variants": {}, "heldout_sequences": int(len(sequences)), "prompts": len(prompts),
              "max_tokens": max_tokens, "cycle_prompt": prompts[0], "tree_rows": tree_rows}
    for name, pair in pairs.items():
        ticker = partial(counter.ticker, name)
        rec = {"parameters": parameter_count(pair.drafter),
               "teacher_forced": teacher_forced(pair, sequences, blocks_per_seq, tick=ticker("teacher-forced recall"),
                                                answers=heldout.answers)}
        rec["T0"] = decoded_tau(pair, prompts, max_tokens, 0.0, block_size, check_parity=True,
                                tick=ticker("decode at T=0"))
        rec["T1"] = decoded_tau(pair, prompts, max_tokens, 1.0, block_size, tick=ticker("decode at T=1"))
        if tree_rows:
            rec["T0_tree"] = decoded_tau(pair, prompts, max_tokens, 0.0, block_size, True, tree_rows,
                                         tick=ticker("tree decode at T=0"))
            rec["T1_tree"] = decoded_tau(pair, prompts, max_tokens, 1.0, block_size, tree_rows=tree_rows,
                                         tick=ticker("tree decode at T=1"))
        result["variants"][name] = rec
    for name, record in variant_cycles(pairs, prompts[0], cycles, cycle_repeats, block_size, counter).items():
        result["variants"][name]["cycle"] = record
    counter.finish()
    if base is not None:
        relative_to_dflash(result)
    return result


def relative_to_dflash(result: dict) -> None:
    """Extra parameters, cycle overhead and τ ratios of every variant against DFlash."""
    b = result["variants"]["dflash"]
    for rec in result["variants"].values():
        rec["extra_parameters"] = rec["parameters"] - b["parameters"]
        rec["cycle_overhead"] = rec["cycle"]["cycle_ms_untimed"] / b["cycle"]["cycle_ms_untimed"] - 1
        rec["tau_ratio_T0"] = rec["T0"]["tau"] / b["T0"]["tau"]
        rec["tau_ratio_T1"] = rec["T1"]["tau"] / b["T1"]["tau"]


def heldout_sequences(paths: list[str], tokenizer, seq_len: int, fraction: float) -> Packed:
    """The held-out examples of `paths` packed into sequences with their answer marks, as the
    trainer packs its held-out split."""
    examples = read_examples(paths)
    held = [e for e in examples if is_heldout(e.source, fraction)]
    if not held:
        # Examples are held out whole (train's split, train.setup.is_heldout): a
        # slightly larger fraction rarely changes that for a few files.
        raise DFlashError(
            f"none of the {len(examples)} example(s) in --data is in the held-out {fraction:g} share (each text file, "
            "or JSONL line, is held out whole by a hash of its name): pass the --data the drafters were trained on "
            "(a folder or many files), or --heldout-fraction 1 if none of it was trained on")
    return pack_examples(held, tokenizer, seq_len, tokenizer.eos_token_id)


def markdown(result: dict, command: str) -> str:
    """The seed's two tables, for our models."""
    lines = [f"Command: `{command}`", ""]
    if "commit" in result:
        lines += [f"Commit: {result['commit'] or 'unknown (not run from a git checkout)'}", ""]
    lines += [f"Backend: {next(iter(result['variants'].values()))['cycle']['backend']}", ""]
    for name, rec in result["variants"].items():
        tf = rec["teacher_forced"]
        P = len(tf["recall1_by_position"])
        lines += [f"### {name}: teacher-forced recall by position ({tf['blocks']} held-out blocks)", "",
                  "| position | " + " | ".join(str(i) for i in range(P)) + " | τ |",
                  "|---" * (P + 2) + "|",
                  "| Recall@1 | " + " | ".join(f"{100 * x:.1f}" for x in tf["recall1_by_position"]) + f" | {tf['tau_teacher_forced']:.2f} |",
                  "| Recall@K | " + " | ".join(f"{100 * x:.1f}" for x in tf["recallK_by_position"]) + f" | {tf['tau_oracle']:.2f} (oracle) |"]
        if "walk_recall1_by_position" in tf:
            lines.append("| walk@1 | " + " | ".join(f"{100 * x:.1f}" for x in tf["walk_recall1_by_position"])
                         + f" | {tf['tau_walk_teacher_forced']:.2f} |")
        lines.append("")
    lines += ["### Decoded acceptance by draft position (P(accepted | earlier accepted)) and top-K mass", "",
              "The drafter's probability mass inside its own top-K (teacher-forced, mean by position): a "
              "sampled DFlash 2 walk proposes only inside the top-K, a DFlash v1 draft samples the full "
              "vocabulary.", "",
              "| method | T | " + " | ".join(f"pos {i}" for i in range(4)) + " |", "|---|---|---|---|---|---|"]
    for name, rec in result["variants"].items():
        for T in ("T0", "T1"):
            acc = rec[T]["acceptance_by_position"][:4]
            lines.append(f"| {name} | {T[1]} | " + " | ".join(f"{100 * x:.1f}" for x in acc) + " |")
        mass = rec["teacher_forced"]["topK_mass_by_position"][:4]
        lines.append(f"| {name} | top-K mass | " + " | ".join(f"{100 * x:.1f}" for x in mass) + " |")
    lines += ["", "### Decoded τ, parameters and cycle latency", "",
              "| method | params | extra params | cycle ms | cycle vs DFlash | τ (T=0) | τ (T=1) | τ ratio T=0 | τ ratio T=1 | greedy == AR |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, rec in result["variants"].items():
        lines.append(
            f"| {name} | {rec['parameters']:,} | {rec.get('extra_parameters', 0):+,} | {rec['cycle']['cycle_ms_untimed']:.2f} | "
            f"{100 * rec.get('cycle_overhead', 0):+.1f} % | {rec['T0']['tau']:.3f} | {rec['T1']['tau']:.3f} | "
            f"{rec.get('tau_ratio_T0', 1):.3f} | {rec.get('tau_ratio_T1', 1):.3f} | {rec['T0']['greedy_identical_to_ar']} |")
    if result.get("tree_rows"):
        N = result["tree_rows"]
        lines += ["", f"### Decoded τ: the chain, a tree of {N} rows (docs/tree.md) and the oracle", "",
                  "Oracle: teacher-forced on the held-out text, τ if a position counted as accepted whenever its "
                  "label is in the drafter's top-K. Decoded τ follows the target's own continuation instead, so "
                  "the oracle is a reference, not a bound.", "",
                  "| method | chain τ (T=0) | tree τ (T=0) | chain τ (T=1) | tree τ (T=1) | oracle τ | tree greedy == AR |",
                  "|---|---|---|---|---|---|---|"]
        for name, rec in result["variants"].items():
            lines.append(f"| {name} | {rec['T0']['tau']:.3f} | {rec['T0_tree']['tau']:.3f} | {rec['T1']['tau']:.3f} | "
                         f"{rec['T1_tree']['tau']:.3f} | {rec['teacher_forced']['tau_oracle']:.2f} | "
                         f"{rec['T0_tree']['greedy_identical_to_ar']} |")
    return "\n".join(lines) + "\n"
