"""How often the target accepts the drafter's tokens, per draft position and by context band.

Acceptance changes with the text and with how much context the drafter
reads (a drafter trained on 2k-token sequences drafts worse at 32k, and a
drafter window cuts what it sees), so the estimate is kept per context band
and follows the text through decayed counts.
"""

import math
from typing import Optional, Sequence


class AcceptanceEstimate:
    """Per-position conditional acceptance, from decayed counts.

    Starts from `seed` (e.g. a calibration probe) worth `prior_weight` cycles;
    each observed cycle first decays every count by `decay`, so the estimate
    follows the text being generated. Positions a cycle did not reach (an
    earlier draft was rejected, or the block was shorter) are left alone.
    """

    def __init__(self, positions: int, seed: Sequence[float] = (), prior_weight: float = 4.0,
                 decay: float = 0.95, default: float = 0.5):
        seed = list(seed) or [default]
        # Past the seed's last position assume its last rate (acceptance decays slowly with depth).
        rates = [min(max(seed[min(t, len(seed) - 1)], 0.0), 1.0) for t in range(positions)]
        self.reached = [prior_weight] * positions
        self.hit = [r * prior_weight for r in rates]
        self.decay = decay
        self._expected: Optional[list[float]] = None  # expected_tokens by B, until the next observe

    def observe(self, drafted: int, accepted: int) -> None:
        self._expected = None
        self.reached = [r * self.decay for r in self.reached]
        self.hit = [h * self.decay for h in self.hit]
        for t in range(min(accepted + 1, drafted, len(self.reached))):
            self.reached[t] += 1.0
            if t < accepted:
                self.hit[t] += 1.0

    @property
    def rates(self) -> list[float]:
        return [h / r if r > 0 else 0.0 for h, r in zip(self.hit, self.reached)]

    def expected_tokens(self, B: int) -> float:
        """Mean tokens a B-row cycle commits (accepted drafts + the bonus)."""
        if self._expected is None:
            # Every B at once: the policy asks for each B at every plain step.
            totals, total, run = [1.0, 1.0], 1.0, 1.0
            for alpha in self.rates:
                run *= alpha
                total += run
                totals.append(total)
            self._expected = totals
        return self._expected[max(min(B, len(self._expected) - 1), 1)]

    def expected_by_block(self, top: int) -> list[float]:
        """`expected_tokens(B)` for B = 0..top in one list (0 and 1: 1.0), for the batch
        policy, which rates every block of every sequence each cycle."""
        self.expected_tokens(1)  # fills the cache
        E = self._expected
        return E[:top + 1] if top < len(E) else E + [E[-1]] * (top + 1 - len(E))

    def copy(self) -> "AcceptanceEstimate":
        twin = AcceptanceEstimate.__new__(AcceptanceEstimate)
        twin.reached, twin.hit, twin.decay, twin._expected = list(self.reached), list(self.hit), self.decay, None
        return twin


# Context bands: below FIRST_BAND rows, then each band BAND_RATIO times longer than the last.
FIRST_BAND, BAND_RATIO = 1024, 4


def context_band(context: int) -> int:
    """0 below FIRST_BAND rows of context, then 1 up to FIRST_BAND * BAND_RATIO, and so on."""
    if context < FIRST_BAND:
        return 0
    return 1 + int(math.log(context / FIRST_BAND, BAND_RATIO) + 1e-9)


class BandedAcceptance:
    """One `AcceptanceEstimate` per context band. A band met for the first time
    starts from the nearest shorter band's estimate as it stands then: the best
    guess until its own cycles say otherwise."""

    def __init__(self, first: AcceptanceEstimate):
        self.bands = {0: first}

    def at(self, context: int) -> AcceptanceEstimate:
        band = context_band(context)
        if band not in self.bands:
            nearest = max(b for b in self.bands if b < band) if any(b < band for b in self.bands) else min(self.bands)
            self.bands[band] = self.bands[nearest].copy()
        return self.bands[band]
