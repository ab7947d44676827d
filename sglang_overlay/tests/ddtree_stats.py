"""A chi-square goodness-of-fit test shared by the distribution tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 1e-3  # fixed significance: a correct sampler fails with probability 0.001 per seed set


@dataclass(frozen=True)
class FitResult:
    p_value: float
    chi2: float
    dof: int
    total_variation: float

    def __str__(self) -> str:
        return f"chi2={self.chi2:.1f} dof={self.dof} p={self.p_value:.3g} TV={self.total_variation:.4f}"


def chi_square_fit(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> FitResult:
    """Pearson's chi-square of observed ``counts`` against exact ``probs`` (same shape).

    Cells whose expected count is below ``min_expected`` are pooled into one cell (so the
    chi-square approximation holds); an observation in a cell of probability 0 gives p = 0.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    total = counts.sum()
    probs = probs / probs.sum()
    tv = 0.5 * float(np.abs(counts / total - probs).sum())
    if np.any((probs == 0) & (counts > 0)):
        return FitResult(0.0, float("inf"), 0, tv)
    expected = probs * total
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    obs_a, exp_a = np.array(obs), np.array(exp)
    chi2 = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    dof = len(obs_a) - 1
    return FitResult(float(stats.chi2.sf(chi2, dof)), chi2, dof, tv)
