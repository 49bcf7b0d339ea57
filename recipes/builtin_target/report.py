"""Write OUT_DIR/TRAINING.md from the run's own records (no hand-copied numbers).

Usage: python report.py RUN_DIR OUT_DIR
Reads corpus.json, tokens.json, train_log.jsonl, final.json (absent if the run
was cut short), export_eval.json and verify.json from RUN_DIR.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from model_config import ARCH  # noqa: E402
import train  # noqa: E402  (hyper-parameters, so the doc cannot drift from the code)


def _load(p: Path):
    return json.loads(p.read_text()) if p.exists() else None


def main(run: Path, out: Path) -> None:
    corpus, toks = _load(run / "corpus.json"), _load(run / "tokens.json")
    final, ev, ver = _load(run / "final.json"), _load(run / "export_eval.json"), _load(run / "verify.json")
    exp = _load(run / "export.json")  # the checkpoint actually shipped
    log = [json.loads(l) for l in (run / "train_log.jsonl").read_text().splitlines()]
    start = next(r for r in log if r.get("event") == "start")
    steps = [r for r in log if "loss" in r]
    evals = [r for r in log if "heldout_loss" in r and "event" not in r]
    done = final is not None and final["step"] == exp["step"]
    elapsed, tokens = exp["elapsed"], exp["tokens"]
    steps = [r for r in steps if r["step"] <= exp["step"]]  # log lines past the checkpoint
    last = steps[-1]
    tail = steps[-10:]
    tail_loss = sum(r["loss"] for r in tail) / len(tail)
    tok_s = statistics.median(r["tok_s"] for r in steps)
    evals = [r for r in evals if r["step"] <= exp["step"]]
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    resumes = sum(1 for r in log if r.get("event") == "resume")

    L = []
    L.append("# Built-in target model: training record\n")
    L.append("A ~4M-parameter mlx-lm `qwen3` checkpoint trained from scratch on the CPython "
             "standard-library source, shipped so the tool runs offline. Produced by "
             "`recipes/builtin_target/` in this repository; every number below was written "
             "by `recipes/builtin_target/report.py` from the run's own logs.\n")
    L.append("## Recipe\n")
    L.append("```sh\nbash recipes/builtin_target/make.sh\n```\n")
    cmds = run / "commands.txt"
    if cmds.exists():
        L.append("Commands run for the shipped checkpoint, in order (from the run's `commands.txt`):\n")
        L.append("```sh\n" + cmds.read_text().strip() + "\n```\n")
    L.append("One command: creates the training venv (torch, CPU), selects the corpus, trains the "
             "tokenizer, trains (resuming exactly from `runs/builtin_target/ckpt.pt` when rerun), "
             "exports to `dflash2_mlx/builtin/target/`, checks the export in transformers and "
             "MLX, and writes this file. See `recipes/builtin_target/README.md`.\n")
    L.append("## Corpus\n")
    L.append(f"- Source: the `.py` files of the CPython {corpus['python']} standard library "
             f"(`sysconfig.get_paths()['stdlib']`, here `{corpus['root']}`), including `test/`; "
             "excluding `site-packages/`, `idlelib/`, `pydoc_data/`, `lib2to3` test data, "
             "machine-specific `_sysconfigdata*`/`config-*`, codec tables in `encodings/`, "
             "and files that are not UTF-8.")
    L.append(f"- Files: {len(corpus['train'])} train, {len(corpus['heldout'])} held out.")
    L.append(f"- Tokens: {toks['train_tokens']:,} train, {toks['heldout_tokens']:,} held out "
             f"({toks['train_bytes']:,} / {toks['heldout_bytes']:,} bytes; one `<|endoftext|>` after each file).")
    L.append(f"- Held-out rule (whole modules): {corpus['rule']}; their `test/test_<m>*` files are "
             f"dropped from training as well. Held-out modules: "
             + ", ".join(f"`{m}`" for m in corpus["heldout_modules"]) + ".")
    L.append("- Why `test/` is in training: it more than doubles the data; with only the "
             "non-test stdlib the token budget would repeat it ~6 times.\n")
    L.append("## Tokenizer\n")
    L.append(f"Byte-level BPE (`tokenizers`, GPT-2 pre-tokenizer, no prefix space), vocab "
             f"{toks['vocab_size']}, trained on the train split only. Special tokens: "
             f"`<|endoftext|>` = {toks['eos_id']} (EOS, also padding), `<|mask|>` = {toks['mask_id']} "
             "(reserved for the drafter's mask: a real embedding row, never seen as input in training). "
             "`tokenizer_config.json` is written by hand (PreTrainedTokenizerFast, "
             "`clean_up_tokenization_spaces: false`) so transformers 4/5 and `mlx_lm.load` read it; "
             "decode(encode(x)) == x was checked on every held-out file.\n")
    L.append("## Model\n")
    arch_keys = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
                 "rope_theta", "rms_norm_eps", "tie_word_embeddings"]
    L.append("HF `Qwen3ForCausalLM` (`model_type: qwen3`): "
             + ", ".join(f"{k}={ARCH[k]}" for k in arch_keys)
             + f". {start['params']:,} parameters. Stored as bf16 `model.safetensors`, HF key names, "
             "no `lm_head` (tied).\n")
    L.append("## Training\n")
    L.append(f"- Trainer: PyTorch {start['torch']} on CPU, {start['threads']} thread, transformers "
             "Qwen3ForCausalLM (eager attention), bf16 autocast with fp32 weights and optimizer.")
    L.append(f"- Sequence {train.SEQ}, batch {train.BATCH} ({start['tokens_per_step']} tokens/step), "
             f"{start['total_steps']} steps planned; AdamW lr {train.PEAK_LR} "
             f"(linear warm-up {train.WARMUP} steps, cosine to {train.MIN_LR_FRAC}x), betas (0.9, 0.95), "
             f"weight decay {train.WD} (not on norms), grad clip {train.CLIP}, seed {train.SEED}.")
    L.append(f"- Machine: {os.cpu_count()}-core {platform.machine()} CPU ({cpu}), {platform.system()}, shared with other work; "
             "the trainer ran under `nice -n 19`.")
    L.append(f"- Status: {'finished' if done else 'cut short at the deadline; shipped the last checkpoint'}"
             f" at step {exp['step']} of {exp['total_steps']}; resumed {resumes} time(s).")
    L.append(f"- Tokens trained: {tokens:,}.")
    L.append(f"- Training wall time: {elapsed / 3600:.2f} h ({elapsed:.0f} s, including periodic "
             "evaluation and checkpoints).")
    L.append(f"- Throughput: median {tok_s:,.0f} tokens/s over logging intervals; "
             f"{tokens / elapsed:,.0f} tokens/s overall.\n")
    L.append("## Results (nats/token)\n")
    L.append(f"- Train loss, mean of the last 100 steps (bf16 autocast): {tail_loss:.4f}.")
    if done:
        L.append(f"- Final checkpoint, fp32: train-probe loss {final['train_probe_loss']:.4f} "
                 f"(first {ev['heldout_windows'] if ev else 'N'} windows of the train stream), "
                 f"held-out loss {final['heldout_loss']:.4f}.")
    if ev:
        L.append(f"- Shipped bf16 weights in transformers fp32: held-out loss "
                 f"{ev['export_heldout_loss_fp32']:.4f} over {ev['heldout_windows']} windows of {train.SEQ}.")
    if evals:
        L.append("- Held-out loss during training (bf16 autocast): "
                 + ", ".join(f"step {r['step']}: {r['heldout_loss']:.3f}" for r in evals) + ".")
    L.append("")
    if ver:
        L.append("## Verification (MLX)\n")
        L.append("`recipes/builtin_target/verify.py`: `mlx_lm.load` loads the directory; "
                 f"vocab {ver['vocab_size']}, EOS id {ver['eos_id']}, mask id {ver['mask_id']}; "
                 f"tokenizer round-trip OK; {ver['safetensors_bytes']:,} bytes of weights.")
        if "logit_max_abs_diff_vs_torch" in ver:
            L.append(f"MLX fp32 vs transformers fp32 logits on one held-out window of {train.SEQ} tokens: "
                     f"max abs diff {ver['logit_max_abs_diff_vs_torch']:.2e} (logits up to "
                     f"{ver['logit_ref_max_abs']:.1f} in magnitude), argmax agreement "
                     f"{ver['argmax_agreement']:.4f}.")
        L.append(f"\nGreedy continuation of `{ver['prompt']}` (64 tokens, fp32):\n")
        L.append("```python\n" + ver["prompt"] + ver["greedy_continuation"] + "\n```\n")
    (out / "TRAINING.md").write_text("\n".join(L))
    print((out / "TRAINING.md").read_text())


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
