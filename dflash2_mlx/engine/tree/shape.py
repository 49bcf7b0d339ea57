"""Tree or chain, cycle by cycle, at T > 0: a sampled tree never stays below its chain.

A sampled tree spends its rows on a spine drawn from q and on siblings that the walk
reaches only through the residual max(p - q, 0) after a spine rejection. Where the
drafter is at least as sure as the target on its candidates (q >= p on them) the
residual has no mass there, the siblings are never reached, and a spine of half the
rows commits less than the chain of all of them (docs/tree.md: tree 5.57 against the
chain's 7.46 on the scripted case). Both shapes are exact, so which one runs may
depend on everything committed before; `ShapeChoice` measures each shape's committed
tokens per pass (both are one target pass over the same rows) and runs the better,
trying the other again after a waiting time that doubles each time it loses (the
acceptance it measured may have changed with the text).
"""

# Cycles of each shape measured before the first choice.
EXPLORE = 4
# Cycles the losing shape waits before it is tried again (doubled after each loss, at most MAX_WAIT).
FIRST_WAIT, MAX_WAIT = 16, 256
# Weight of a new cycle in a shape's running mean (recent acceptance counts more).
DECAY = 0.1


class ShapeChoice:
    """The shape of each sampled cycle of a tree request: the tree of its rows, or the
    chain of the same rows."""

    def __init__(self):
        self.mean = {True: None, False: None}  # committed tokens per pass, by `tree`
        self.runs = {True: 0, False: 0}
        self.wait, self.since = FIRST_WAIT, 0  # the losing shape's wait, cycles since it last ran
        self.retrying = False  # this cycle runs the losing shape again

    def next_is_tree(self) -> bool:
        """Whether the next cycle verifies the tree (else the chain)."""
        if min(self.runs.values()) < EXPLORE:  # alternate until both are measured
            return self.runs[True] <= self.runs[False]
        better = self.mean[True] >= self.mean[False]
        self.since += 1
        self.retrying = self.since >= self.wait
        if self.retrying:
            self.since = 0
        return better != self.retrying

    def observe(self, tree: bool, committed: int) -> None:
        """What a cycle of that shape committed (tokens, its bonus token included)."""
        before = self.mean[tree]
        self.mean[tree] = committed if before is None else (1 - DECAY) * before + DECAY * committed
        self.runs[tree] += 1
        if self.retrying:  # a loser that still loses waits twice as long; one that now wins, not at all
            self.retrying = False
            self.wait = min(MAX_WAIT, 2 * self.wait) if self.mean[tree] < self.mean[not tree] else FIRST_WAIT
