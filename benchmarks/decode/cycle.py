"""Break a DFlash / DFlash 2 decode cycle down by phase on this machine.

    python benchmarks/decode/cycle.py --json benchmarks/results/cycle-cpu.json

Without --model/--drafter it builds random synthetic pairs (real formats, no
download): a mid-size one with realistic proportions (vocab 32k, target 8
layers of 512, one-layer drafter) and the tiny test-size one, so the share of
fixed per-cycle costs is visible at both ends. Acceptance is irrelevant here:
every phase's cost does not depend on what is accepted.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash2_mlx.tools.cycle_profile import cycle_breakdown  # noqa: E402
from dflash2_mlx.loading.load_pair import load_pair  # noqa: E402
from dflash2_mlx.engine.sampling import SamplingParams  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from dflash2_mlx.tools.synthetic import drafter_config_dict, write_drafter, write_target  # noqa: E402

SIZES = {
    "mid": dict(target=dict(vocab_size=32768, hidden_size=512, num_hidden_layers=8, intermediate_size=1536,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=64),
                drafter=dict(num_layers=1, selector_rank=256)),
    "tiny": dict(target=dict(), drafter=dict(num_layers=2)),
}


def synthetic_pair(root: Path, size: str):
    spec = SIZES[size]
    tdir, ddir = root / f"{size}-target", root / f"{size}-drafter"
    write_target(tdir, "qwen3", **spec["target"])
    tcfg = json.loads((tdir / "config.json").read_text())
    dcfg = drafter_config_dict(tcfg, "dflash2", num_layers=spec["drafter"]["num_layers"])
    if "selector_rank" in spec["drafter"]:
        dcfg["dflash_config"]["selector_rank"] = spec["drafter"]["selector_rank"]
    dcfg.update(num_attention_heads=tcfg["num_attention_heads"], num_key_value_heads=tcfg["num_key_value_heads"],
                head_dim=tcfg["head_dim"], intermediate_size=tcfg["intermediate_size"])
    write_drafter(ddir, dcfg)
    return str(tdir), str(ddir)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--drafter")
    ap.add_argument("--sizes", default="mid,tiny", help="synthetic pairs to run when no --model")
    ap.add_argument("--block-size", type=int, nargs="+", default=[16, 4])
    ap.add_argument("--cycles", type=int, default=12)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--markdown", dest="md_path", help="also write a markdown table here")
    args = ap.parse_args()

    prompt = list(range(10, 74))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        pairs = [(args.model, args.drafter, "given")] if args.model else [
            (*synthetic_pair(Path(tmp), s), s) for s in args.sizes.split(",")]
        for model, drafter_ref, label in pairs:
            pair, _ = load_pair(model, drafter_ref)
            for B in args.block_size:
                rec = cycle_breakdown(pair, prompt, cycles=args.cycles, block_size=B,
                                      sampling=SamplingParams(temperature=args.temp, seed=0))
                rec["pair"] = label
                runs.append(rec)
                ph = rec["phase_ms"]
                print(f"{label:5s} B={B:2d} cycle {rec['cycle_ms_untimed']:8.2f} ms | draft {ph['draft']:7.2f} "
                      f"select {ph['select']:6.2f} verify {ph['verify']:7.2f} else {ph['everything_else']:6.2f} ms "
                      f"({100 * rec['everything_else_share']:.1f} %) | syncs/cycle {rec['host_syncs_per_cycle']:.0f} "
                      f"| peak {rec['peak_memory_gb']:.3f} GB", flush=True)
    out = {**provenance(command_line("python benchmarks/decode/cycle.py", sys.argv[1:])), "runs": runs}
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    if args.md_path:
        Path(args.md_path).write_text(markdown(out))


def markdown(out: dict) -> str:
    rows = ["| pair | B | cycle ms | draft ms | select ms | verify ms | everything else ms | else share | "
            "host syncs / cycle | peak GB | drafter cache ≤ committed |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["runs"]:
        ph = r["phase_ms"]
        rows.append(f"| {r['pair']} | {r['block_size']} | {r['cycle_ms_untimed']:.2f} | {ph['draft']:.2f} | "
                    f"{ph['select']:.2f} | {ph['verify']:.2f} | {ph['everything_else']:.2f} | "
                    f"{100 * r['everything_else_share']:.1f} % | {r['host_syncs_per_cycle']:.0f} | "
                    f"{r['peak_memory_gb']:.3f} | {r['drafter_cache_never_ahead'] and r['drafter_cache_equals_committed_at_close']} |")
    first = out["runs"][0]
    return (f"# Decode cycle breakdown ({first['backend']}, mlx {first['mlx_version']}, {first['device']})\n\n"
            f"Command: `{out['command']}` at commit {out.get('commit') or 'unknown'}\n\n" + "\n".join(rows) + "\n\n"
            "`cycle ms` is the untimed run (one host sync per cycle); the phase columns come from a second,\n"
            "timed run that evaluates each phase as it ends; everything else = timed cycle − draft − select − verify\n"
            "(acceptance, the sync, cache trims, Python). The last column checks that the drafter cache never\n"
            "runs ahead of the committed context and equals it when the generator closes.\n")


if __name__ == "__main__":
    main()
