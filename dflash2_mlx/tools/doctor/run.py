"""The doctor's run: every section in order, the cheap answers first, stopping
where later checks cannot be meaningful."""

from typing import Iterator, Optional

from ...errors import DFlashError
from .install import environment
from .memory import memory_estimate
from .pair import DEFAULT_MIN_ACCEPTANCE, decode_costs, pair_checks, self_test
from .quantization import quantization_checks
from .report import Finding, Section


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
    from ...loading.hub import resolve
    from ...engine.pair import Pair
    from ...errors import BlockSizeError
    from ...loading.builtin import resolve_builtin
    from ...loading.checkpoints import load_drafter, load_target, read_config
    from ...loading.quantize import DraftQuant, quantize_drafter

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
                     min_acceptance=min_acceptance, folder=calibration_folder, again=recalibrate)
    yield test
    if not test.failed:
        yield decode_costs(pair, tokenizer, calibration_folder, recalibrate)


def _one_line(e: Exception) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if isinstance(e, DFlashError) else f"{type(e).__name__}: {text}"
