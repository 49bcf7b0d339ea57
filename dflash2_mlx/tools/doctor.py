"""`doctor`: is this machine and this target/drafter pair set up to work?

Runs in order, so the cheap answers come first: the MLX install and kernels;
a memory estimate read from config.json and safetensors headers (no weights
loaded); quantization pitfalls; every compatibility check; then a short greedy
self-test that refuses a pair whose drafts are almost never accepted. Yields
one `Section` at a time. No UI here. (Past 300 lines: many small checks, kept
together so the order of the run reads in one place.)
"""

import json
import os
import platform
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import mlx.core as mx

from ..errors import DFlashError

GB = 1e9
_FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
_ACT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_MIN_ACCEPTANCE = 0.2


@dataclass(frozen=True)
class Finding:
    name: str
    status: str  # "ok", "info", "warn" or "fail"
    message: str


@dataclass(frozen=True)
class Section:
    title: str
    findings: tuple[Finding, ...]
    data: dict = field(default_factory=dict)  # JSON-ready numbers behind the findings

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    def to_dict(self) -> dict:
        return {"title": self.title, "findings": [f.__dict__ for f in self.findings], "data": self.data}


# -- the install ----------------------------------------------------------------------


def environment() -> Section:
    import importlib.metadata as md

    from ..device import backend_name
    from ..engine.drafter.fused import kernel_status

    backend = backend_name()
    versions = {"mlx": mx.__version__, "python": platform.python_version()}
    for pkg in ("mlx-lm", "dflash2-mlx"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "not installed"
    info = _device_info()
    findings = [
        Finding("versions", "info", ", ".join(f"{k} {v}" for k, v in versions.items())),
        Finding("device", "info", f"{info.get('device_name') or platform.machine()} ({platform.platform()})"),
    ]
    if backend == "cpu":
        findings.append(Finding(
            "backend", "warn",
            "cpu: no Metal or CUDA here. Output is exact, but a block verify costs about as much per row as "
            "plain decoding (a 16-row forward is ~10x a 1-row one on the Linux CPU build), so speculation is "
            "slower than plain decoding on this backend"))
    else:
        findings.append(Finding("backend", "ok", backend))
    for name, how in kernel_status().items():
        if how == "kernel":
            findings.append(Finding(f"kernel {name}", "ok", "fused kernel active"))
        elif backend == "cpu":
            findings.append(Finding(f"kernel {name}", "ok", "plain-MLX twin (the fused kernel needs a GPU backend)"))
        else:
            findings.append(Finding(f"kernel {name}", "warn",
                                    f"plain-MLX twin on {backend}: the fused kernel is unavailable or disabled"))
    return Section("MLX", tuple(findings), {"backend": backend, "versions": versions, "device": info,
                                            "kernels": kernel_status()})


def _device_info() -> dict:
    try:
        return dict(mx.device_info())
    except Exception:  # older MLX
        return {}


def device_memory_bytes() -> Optional[int]:
    """What the models must fit in: the GPU's recommended working set, or RAM."""
    info = _device_info()
    for key in ("max_recommended_working_set_size", "memory_size"):
        if info.get(key):
            return int(info[key])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# -- memory, before loading anything --------------------------------------------------


def safetensors_header(path: Path) -> dict:
    """Tensor name -> {dtype, shape, data_offsets}, read without the weights."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise DFlashError(f"'{path}' is not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise DFlashError(f"'{path}' is not a safetensors file (header size {n})")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def weight_bytes(folder: Path, act_bytes: int, quant=None) -> int:
    """Bytes the weights take once loaded: float tensors in the activation
    dtype, packed quantized ones as stored; with `quant` (a DraftQuant), 2-D
    weights as they would be quantized (codebooks at 8 bits or more)."""
    from ..loading.quantize import CODEBOOK_MIN_BITS

    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        for name, t in safetensors_header(f).items():
            count = 1
            for d in t["shape"]:
                count *= d
            stored = t["data_offsets"][1] - t["data_offsets"][0]
            if t["dtype"] not in _FLOAT_BYTES:
                total += stored
            elif quant is not None and len(t["shape"]) == 2 and t["shape"][-1] % quant.group_size == 0:
                bits = max(quant.bits, CODEBOOK_MIN_BITS) if "codebook" in name else quant.bits
                total += count * bits // 8 + 2 * (count // quant.group_size) * act_bytes
            else:
                total += count * act_bytes
    return total


def size_text(gigabytes: float) -> str:
    return f"{gigabytes:.2f} GB" if gigabytes >= 0.1 else f"{gigabytes * 1e3:.1f} MB"


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def kv_bytes_per_token(config: dict, act_bytes: int, context: int, extra_rows: int = 16) -> float:
    """Average KV bytes per context token (sliding layers stop growing at their
    window; recurrent layers have a fixed state, not counted)."""
    c = _text_config(config)
    n_layers = c["num_hidden_layers"]
    heads = c.get("num_attention_heads", 1)
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    types = c.get("layer_types")
    if not types and c.get("full_attention_interval"):
        k = c["full_attention_interval"]
        types = ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n_layers)]
    types = types or ["full_attention"] * n_layers
    window = c.get("sliding_window") or context
    rows = 0
    for kind in types:
        if kind == "sliding_attention":
            rows += min(context, window + extra_rows)
        elif kind in ("full_attention", "attention"):
            rows += context
    return 2 * kv_heads * head_dim * act_bytes * rows / max(context, 1)


def memory_estimate(target_folder: Path, drafter_folder: Optional[Path], context: int,
                    draft_quant=None, act_dtype: Optional[str] = None) -> Section:
    from ..device import default_activation_dtype
    from ..loading.checkpoints import read_config

    act = act_dtype or str(default_activation_dtype()).split(".")[-1]
    act_bytes = _ACT_BYTES[act]
    t_config = read_config(Path(target_folder), "target")
    data = {"context_tokens": context, "activation_dtype": act,
            "target_weights_gb": weight_bytes(target_folder, act_bytes) / GB,
            "target_kv_gb": kv_bytes_per_token(t_config, act_bytes, context) * context / GB}
    findings = [
        Finding("target weights", "info", f"{size_text(data['target_weights_gb'])} ({act} activations)"),
        Finding("target KV cache", "info", f"{size_text(data['target_kv_gb'])} for {context:,} tokens"),
    ]
    if drafter_folder is not None:
        d_config = read_config(Path(drafter_folder), "drafter")
        d_act = act
        if draft_quant is not None:
            d_act = str(draft_quant.activation_dtype).split(".")[-1]
        d_bytes = _ACT_BYTES[d_act]
        data["drafter_weights_gb"] = weight_bytes(drafter_folder, d_bytes, draft_quant) / GB
        data["drafter_kv_gb"] = kv_bytes_per_token(d_config, d_bytes, context) * context / GB
        quant_note = f", quantized {draft_quant}" if draft_quant is not None else ""
        findings += [
            Finding("drafter weights", "info", f"{size_text(data['drafter_weights_gb'])} ({d_act} activations{quant_note})"),
            Finding("drafter KV cache", "info", f"{size_text(data['drafter_kv_gb'])} for {context:,} tokens of context"),
        ]
    total = sum(v for k, v in data.items() if k.endswith("_gb"))
    data["total_gb"] = total
    limit = device_memory_bytes()
    data["device_memory_gb"] = limit / GB if limit else None
    if limit is None:
        findings.append(Finding("total", "info", f"{size_text(total)} (estimate; device memory unknown)"))
    elif total * GB > limit:
        findings.append(Finding("total", "fail", f"{size_text(total)} does not fit in {limit / GB:.1f} GB: use a "
                                                 "quantized target, a smaller context, or --draft-quant"))
    elif total * GB > 0.75 * limit:
        findings.append(Finding("total", "warn", f"{size_text(total)} is over 75 % of {limit / GB:.1f} GB: expect "
                                                 "memory pressure"))
    else:
        findings.append(Finding("total", "ok", f"{size_text(total)} of {limit / GB:.1f} GB (estimate, before loading)"))
    return Section("Memory (estimated before loading)", tuple(findings), data)


# -- quantization pitfalls ----------------------------------------------------------------


def quantization_checks(draft_quant, drafter_config: Optional[dict], target_config: dict) -> Section:
    findings = []
    saved = (drafter_config or {}).get("quantization")
    saved_act = ((drafter_config or {}).get("dflash2_mlx") or {}).get("activation_dtype")
    if draft_quant is not None:
        if draft_quant.fp16_activations:
            findings.append(Finding(
                "draft activations", "fail",
                f"--draft-quant {draft_quant} runs the drafter with fp16 activations: DFlash residuals overflow "
                "fp16 and acceptance collapses to ~0 % (seen on M1/M2); use a32 or abf16, e.g. "
                f"w{draft_quant.bits}a32:gs{draft_quant.group_size}"))
        else:
            findings.append(Finding("draft activations", "ok", f"{draft_quant}: {draft_quant.activation} activations"))
        findings.append(Finding("draft quantization", "info",
                                "selector codebooks stay at 8 bits or more; norms and conv base kernels are not quantized"))
        if saved:
            findings.append(Finding("draft quantization", "fail",
                                    "the drafter is already quantized: drop --draft-quant, or quantize the original"))
    if saved_act == "float16":
        findings.append(Finding("saved drafter activations", "fail",
                                "this quantized drafter was saved with fp16 activations, which zero acceptance on "
                                "M1/M2: quantize the original again with a32 or abf16"))
    if saved:
        low = [k for k, v in saved.items() if "codebook" in k and isinstance(v, dict) and v.get("bits", 8) < 8]
        if low:
            findings.append(Finding("saved codebooks", "warn", f"{low[0]} is below 8 bits: selector scores lose "
                                                               "precision and acceptance drops"))
        else:
            findings.append(Finding("saved drafter", "ok", f"quantized {saved.get('bits')}-bit, codebooks >= 8 bits"))
    t_quant = _text_config(target_config).get("quantization") or target_config.get("quantization")
    if t_quant:
        findings.append(Finding("target", "info", f"{t_quant.get('bits')}-bit quantized target"))
    if not findings:
        findings.append(Finding("quantization", "ok", "no quantization asked for or found"))
    return Section("Quantization", tuple(findings))


# -- the pair -----------------------------------------------------------------------------


def pair_checks(target, drafter) -> Section:
    from ..engine.pair import compatibility_report

    checks = compatibility_report(drafter, target)
    findings = tuple(Finding(c.name, "ok" if c.ok else "fail", c.message) for c in checks)
    return Section("Target/drafter compatibility", findings,
                   {"drafter_kind": drafter.config.kind, "block_size": drafter.config.block_size})


def self_test(pair, tokenizer, *, block_size: Optional[int] = None, max_tokens: int = 48,
              min_acceptance: float = DEFAULT_MIN_ACCEPTANCE) -> Section:
    """A short greedy generation: refuse near-zero acceptance, check parity."""
    from ..text.generate import stream_generate
    from ..text.prompt import build_prompt
    from .suites import SUITES

    ids = build_prompt(tokenizer, SUITES["code"][0])
    spec = list(stream_generate(pair, tokenizer, ids, max_tokens=max_tokens, block_size=block_size))
    ar = [r.token for r in stream_generate(pair.without_drafter(), tokenizer, ids, max_tokens=max_tokens)]
    s = spec[-1].stats
    first = s.acceptance_by_position[0] if s.acceptance_by_position else 0.0
    data = {"prompt_tokens": len(ids), "generation_tokens": s.generation_tokens, "block_size": s.block_size,
            "mean_acceptance_length": s.mean_acceptance_length, "acceptance_rate": s.acceptance_rate,
            "acceptance_by_position": s.acceptance_by_position, "first_position_acceptance": first,
            "min_acceptance": min_acceptance}
    line = (f"greedy, {s.generation_tokens} tokens, block {s.block_size}: first-position acceptance {first:.2f}, "
            f"draft acceptance {s.acceptance_rate:.2f} ({s.accepted}/{s.drafted}), mean acceptance length {s.mean_acceptance_length:.2f}")
    if first < min_acceptance:
        findings = [Finding("acceptance", "fail",
                            f"{line}; below --min-acceptance {min_acceptance:.2f}: this drafter does not predict this "
                            "target (trained for another one, broken quantization, or wrong layer ids)")]
    else:
        findings = [Finding("acceptance", "ok", line)]
    tokens = [r.token for r in spec]
    diverged = next((i for i, (a, b) in enumerate(zip(ar, tokens)) if a != b), None)
    if diverged is None and len(ar) == len(tokens):
        findings.append(Finding("parity", "ok", "greedy DFlash output equals plain greedy decoding"))
    else:
        i = diverged if diverged is not None else min(len(ar), len(tokens))
        # Exact on CPU; on Metal one-row and block kernels differ and near-ties can flip.
        findings.append(Finding("parity", "warn" if s.backend == "metal" else "fail",
                                f"greedy output diverged from plain decoding at token {i}"))
    data["parity_index"] = diverged
    return Section("Acceptance self-test", tuple(findings), data)


def decode_costs(pair, tokenizer, folder=None, recalibrate: bool = False) -> Section:
    """The calibration `--block-size auto` decides with: cycle costs by block size
    against a plain decoding step (cached under `folder`, measured when missing)."""
    from ..engine.adaptive.calibrate import load_or_calibrate
    from ..text.prompt import build_prompt
    from .suites import SUITES

    cal = load_or_calibrate(pair, folder, build_prompt(tokenizer, SUITES["code"][0]), recalibrate)
    costs, plain = cal.costs, cal.costs.plain
    where = f"cached in {cal.path}" if cal.cached else (f"measured now, saved to {cal.path}" if cal.path else "measured now")
    findings = [Finding("plain step", "info", f"{1e3 * plain:.2f} ms per token ({where})")]
    for B in sorted(costs.cycles or costs.verify):
        cycle = costs.cycle(B)
        findings.append(Finding(
            f"block {B}", "info",
            f"cycle {1e3 * cycle:.2f} ms = {cycle / plain:.2f} plain steps (target pass over {B} rows "
            f"{1e3 * costs.verify[B]:.2f} ms, drafter + selector {1e3 * costs.draft[B]:.2f} ms): drafting pays "
            f"when a cycle commits more than {cycle / plain:.2f} tokens" + ("" if cycle / plain < B else
                                                                             ", which a block of this size never can")))
    policy = cal.policy(pair.max_block_size)
    B = policy.best_block(pair.max_block_size)
    seed = ", ".join(f"{a:.2f}" for a in cal.acceptance) or "none seen"
    if policy.rate(B) > policy.rate(1):
        verdict = f"auto would start at block {B} (expected {policy.rate(B) / policy.rate(1):.2f}x plain decoding)"
    else:
        verdict = (f"auto would start with plain decoding (best block {B} expected at "
                   f"{policy.rate(B) / policy.rate(1):.2f}x) and probe now and then")
    findings.append(Finding("auto", "info", f"acceptance by position on the calibration prompt ({seed}): {verdict}"))
    return Section("Decode costs (--block-size auto)", tuple(findings),
                   {**cal.to_dict(), "path": str(cal.path) if cal.path else None, "cached": cal.cached})


# -- all of it ------------------------------------------------------------------------------


def run_doctor(
    model: str,
    drafter: Optional[str],
    *,
    draft_quant: Optional[str] = None,
    block_size: Optional[int] = None,
    context: int = 8192,
    min_acceptance: float = DEFAULT_MIN_ACCEPTANCE,
    run_self_test: bool = True,
    max_tokens: int = 48,
    calibration_folder=None,
    recalibrate: bool = False,
) -> Iterator[Section]:
    """Yield sections in order; a section with a failure ends the run where
    later checks cannot be meaningful (nothing loads, the pair is incompatible)."""
    from ..loading.hub import resolve
    from ..engine.pair import Pair
    from ..errors import BlockSizeError
    from ..loading.builtin import resolve_builtin
    from ..loading.checkpoints import load_drafter, load_target, read_config
    from ..loading.quantize import DraftQuant, quantize_drafter

    yield environment()
    quant = DraftQuant.parse(draft_quant) if draft_quant else None
    try:
        t_folder = resolve(resolve_builtin(model, "target"), "target")
        d_folder = resolve(resolve_builtin(drafter, "drafter"), "drafter") if drafter else None
        t_config = read_config(t_folder, "target")
        d_config = read_config(d_folder, "drafter") if d_folder else None
        memory = memory_estimate(t_folder, d_folder, context, quant)
    except (DFlashError, KeyError, OSError, ValueError) as e:
        yield Section("Models", (Finding("find models", "fail", _one_line(e)),))
        return
    yield memory
    yield quantization_checks(quant, d_config, t_config)
    try:
        d = load_drafter(str(d_folder)) if d_folder else None
        target, tokenizer = load_target(str(t_folder))
    except DFlashError as e:
        yield Section("Loading", (Finding("load", "fail", _one_line(e)),))
        return
    if d is None:
        return
    checks = pair_checks(target, d)
    yield checks
    if checks.failed or not run_self_test:
        return
    pair = Pair.make(target, d)
    try:
        pair.block_size(block_size, "--block-size")
    except BlockSizeError as e:
        yield Section("Acceptance self-test", (Finding("block size", "fail", str(e)),))
        return
    if quant is not None and not d_config.get("quantization"):
        quantize_drafter(d, quant)
    test = self_test(pair, tokenizer, block_size=block_size, max_tokens=max_tokens,
                     min_acceptance=min_acceptance)
    yield test
    if not test.failed:
        yield decode_costs(pair, tokenizer, calibration_folder, recalibrate)


def _one_line(e: Exception) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if isinstance(e, DFlashError) else f"{type(e).__name__}: {text}"


def problems(sections: list[Section]) -> list[str]:
    return [f"{s.title.lower()}: {f.name}: {f.message}" for s in sections for f in s.failed]
