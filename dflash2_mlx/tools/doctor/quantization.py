"""The quantization section: the pitfalls of --draft-quant and of drafters
saved quantized (fp16 activations, low-bit codebooks)."""

from typing import Optional

from .memory import text_config
from .report import Finding, Section


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
    t_quant = text_config(target_config).get("quantization") or target_config.get("quantization")
    if t_quant:
        findings.append(Finding("target", "info", f"{t_quant.get('bits')}-bit quantized target"))
    if not findings:
        findings.append(Finding("quantization", "ok", "no quantization asked for or found"))
    return Section("Quantization", tuple(findings))
