"""`doctor`: is this machine and this target/drafter pair set up to work?

Runs in order, so the cheap answers come first: the MLX install and kernels
(`install`); a memory estimate read from config.json and safetensors headers,
no weights loaded (`memory`); quantization pitfalls (`quantization`); every
compatibility check, then a short greedy self-test that refuses a pair whose
drafts are almost never accepted, then the decode costs (`pair`). `run` yields
one `Section` (`report`) at a time. No UI here.
"""

from ...device import device_memory_bytes  # noqa: F401
from .install import environment  # noqa: F401
from .memory import GB, kv_bytes_per_token, memory_estimate, safetensors_header, size_text, weight_bytes  # noqa: F401
from .pair import DEFAULT_MIN_ACCEPTANCE, decode_costs, pair_checks, self_test  # noqa: F401
from .quantization import quantization_checks  # noqa: F401
from .report import Finding, Section, problems  # noqa: F401
from .run import run_doctor  # noqa: F401
