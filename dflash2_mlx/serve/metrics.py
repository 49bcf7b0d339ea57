"""Server counters and their Prometheus text exposition (format 0.0.4).

Written by hand: a dozen lines of text do not need a client library. The
worker thread and the request handlers update plain integers (the GIL makes
each update atomic); `render` reads them.
"""

from collections import Counter
from typing import Optional

from ..text.stats import GenerationStats


# Upper bounds of the batch size histogram's buckets.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


class Metrics:
    def __init__(self):
        self.requests: Counter = Counter()  # (route, status) -> count
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.cached_disk_tokens = 0  # of those, read from the disk tier
        self.generation_tokens = 0
        self.generations = 0
        self.cancelled = 0
        self.cache_hits = 0
        self.target_passes = 0  # after prefill: verify passes (or AR steps)
        self.committed = 0  # tokens those passes committed
        self.drafted = 0
        self.accepted = 0
        self.timed_generations = 0  # generations with final statistics, and their seconds
        self.generation_seconds = 0.0
        self.block_cycles: Counter = Counter()  # speculative cycles by block size (1: a plain step)
        self.batch_passes: Counter = Counter()  # batched target passes by how many sequences they ran
        self.batch_rows = 0  # rows those passes ran, and tokens they committed
        self.batch_tokens = 0

    def count_request(self, route: str, status: int) -> None:
        self.requests[(route, status)] += 1

    def record(self, prompt: int, cached: int, generated: int, stats: Optional[GenerationStats],
               cancelled: bool, cached_disk: int = 0) -> None:
        self.generations += 1
        self.prompt_tokens += prompt
        self.cached_prompt_tokens += cached
        self.cached_disk_tokens += cached_disk
        self.generation_tokens += generated
        self.cache_hits += cached > 0
        self.cancelled += cancelled
        if stats is not None:
            self.target_passes += stats.target_passes
            self.committed += round(stats.mean_acceptance_length * stats.target_passes)
            self.drafted += stats.drafted
            self.accepted += stats.accepted
            self.timed_generations += 1
            self.generation_seconds += _seconds(stats)
            self.block_cycles.update(stats.block_sizes or {})

    def record_pass(self, sequences: int, rows: int, committed: int) -> None:
        """One batched target pass: its sequences, its rows, the tokens it committed."""
        self.batch_passes[sequences] += 1
        self.batch_rows += rows
        self.batch_tokens += committed

    @property
    def mean_generation_s(self) -> Optional[float]:
        """Seconds a generation took, prefill included, on average (None before the first)."""
        return self.generation_seconds / self.timed_generations if self.timed_generations else None

    def render(self, queue_length: int, busy: bool, cache_entries: int, cache_bytes: int,
               in_progress: int = 0, tiers: Optional[dict] = None) -> str:
        """`tiers`: the prompt cache's `stats()` (hits and bytes by tier)."""
        tau = self.committed / self.target_passes if self.target_passes else 0.0
        lines = []

        def metric(name, kind, help_, samples):
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{labels} {value}")

        metric("dflash2_requests_total", "counter", "HTTP requests by route and status.",
               [(f'{{route="{r}",status="{s}"}}', n) for (r, s), n in sorted(self.requests.items())] or [("", 0)])
        metric("dflash2_generations_total", "counter", "Generations run on the model.", [("", self.generations)])
        metric("dflash2_cancelled_total", "counter", "Generations stopped because the client went away.",
               [("", self.cancelled)])
        metric("dflash2_prompt_tokens_total", "counter", "Prompt tokens of all generations.", [("", self.prompt_tokens)])
        metric("dflash2_cached_prompt_tokens_total", "counter", "Prompt tokens read from the prompt cache.",
               [("", self.cached_prompt_tokens)])
        metric("dflash2_generation_tokens_total", "counter", "Generated tokens.", [("", self.generation_tokens)])
        metric("dflash2_prompt_cache_hits_total", "counter", "Generations that reused cached prompt tokens.",
               [("", self.cache_hits)])
        metric("dflash2_target_passes_total", "counter", "Target forward passes after prefill.",
               [("", self.target_passes)])
        metric("dflash2_draft_tokens_total", "counter", "Draft tokens proposed.", [("", self.drafted)])
        metric("dflash2_accepted_tokens_total", "counter", "Draft tokens the target accepted.", [("", self.accepted)])
        metric("dflash2_mean_acceptance_length", "gauge", "Tokens committed per target pass (tau), all generations.",
               [("", f"{tau:.4f}")])
        metric("dflash2_block_cycles_total", "counter",
               "Speculative cycles by the block size they ran (1: a plain step; --block-size auto chooses per cycle).",
               [(f'{{block_size="{B}"}}', n) for B, n in sorted(self.block_cycles.items())] or [("", 0)])
        passes = sum(self.batch_passes.values())
        buckets = [(f'_bucket{{le="{le}"}}', sum(n for size, n in self.batch_passes.items() if size <= le))
                   for le in BATCH_BUCKETS]
        lines.extend(["# HELP dflash2_batch_size Sequences in each batched target pass.",
                      "# TYPE dflash2_batch_size histogram"])
        lines.extend(f"dflash2_batch_size{suffix} {n}" for suffix, n in buckets)
        lines.extend([f'dflash2_batch_size_bucket{{le="+Inf"}} {passes}',
                      f"dflash2_batch_size_sum {sum(k * n for k, n in self.batch_passes.items())}",
                      f"dflash2_batch_size_count {passes}"])
        metric("dflash2_batch_tokens_per_pass", "gauge", "Tokens committed per batched target pass, all sequences.",
               [("", f"{self.batch_tokens / passes:.4f}" if passes else "0")])
        metric("dflash2_batch_rows_per_pass", "gauge", "Rows (anchors, drafts, plain rows) per batched target pass.",
               [("", f"{self.batch_rows / passes:.4f}" if passes else "0")])
        metric("dflash2_requests_in_progress", "gauge",
               "Requests being answered (not /health or /metrics); a drain waits for them.", [("", in_progress)])
        metric("dflash2_queue_length", "gauge", "Requests waiting for the model.", [("", queue_length)])
        metric("dflash2_busy", "gauge", "1 while a generation runs.", [("", int(busy))])
        metric("dflash2_prompt_cache_entries", "gauge", "Conversations held in the prompt cache.",
               [("", cache_entries)])
        metric("dflash2_prompt_cache_bytes", "gauge", "Bytes held by the prompt cache.", [("", cache_bytes)])
        tiers = tiers or {}
        metric("dflash2_prompt_cache_tier_tokens_total", "counter", "Cached prompt tokens by the tier they came from.",
               [('{tier="memory"}', self.cached_prompt_tokens - self.cached_disk_tokens),
                ('{tier="disk"}', self.cached_disk_tokens)])
        metric("dflash2_prompt_cache_tier_hits_total", "counter", "Prompt-cache blocks reused, by tier.",
               [('{tier="memory"}', tiers.get("memory_hits", 0)), ('{tier="disk"}', tiers.get("disk_hits", 0))])
        metric("dflash2_prompt_cache_tier_bytes", "gauge", "Bytes the prompt cache holds, by tier.",
               [('{tier="memory"}', tiers.get("memory_bytes", cache_bytes)), ('{tier="disk"}', tiers.get("disk_bytes", 0))])
        metric("dflash2_prompt_cache_disk_skipped_total", "counter",
               "Cache files skipped as corrupt, truncated or foreign (each logged in one line).",
               [("", tiers.get("disk_skipped", 0))])
        return "\n".join(lines) + "\n"


def _seconds(stats: GenerationStats) -> float:
    prefill = stats.prompt_tokens / stats.prompt_tps if stats.prompt_tps else 0.0
    decode = (stats.generation_tokens - 1) / stats.generation_tps if stats.generation_tps else 0.0
    return prefill + max(decode, 0.0)
