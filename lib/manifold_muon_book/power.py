"""What a study could have detected: the smallest true difference it would have called real.

A verdict of "not reproduced at this scale" says little unless it says how large an effect the study could
have seen. Two kinds of rule decide the book's comparisons, and each has its own answer:

* **A t-test** (``detectable_difference``): for a mean difference over ``n`` seeds with standard deviation
  ``sd`` (paired: the sd of the per-seed differences; two arms: Welch), the smallest true difference that a
  two-sided test at level ``alpha`` detects with probability ``power`` is

      MDE = (t_{1 - alpha/2, df} + t_{power, df}) * SE,   SE = sd / sqrt(n)  (paired),

  the textbook power formula with Student's t in place of the normal (Cohen 1988, ch. 2). With three seeds
  (df = 2) the factor is 4.30 + 1.06 = 5.36 standard errors: small studies only see large effects.
* **A range rule** (the ledger's criteria such as "d > R", R the seed range): the rule calls nothing smaller
  than R, so R itself is the smallest effect it can call; ``detectable_difference`` then says how much larger a
  true effect must be to pass it reliably.

``study_text`` writes the sentence a verdict carries (``verdicts.show_verdict(..., study=...)``): seeds, scale,
seed spread and the detectable effect, the numbers glued so that the chapter's cells, not the prose, hold them.

Pure Python (no SciPy): Student's t distribution through the regularized incomplete beta function, evaluated by
its continued fraction (modified Lentz), and its quantiles by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["t_cdf", "t_quantile", "detectable_difference", "seed_range", "study_text", "glue_study", "paired_t_pvalue",
           "holm", "disjoint_ranges_chance"]


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (df = inf: the standard normal)."""
    if df <= 0:
        raise ValueError(f"t_cdf: df must be positive, got {df}")
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on ``t_cdf``, to 1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must lie strictly between 0 and 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def _sd(values: Sequence[float]) -> float:
    xs = [float(v) for v in values]
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def detectable_difference(a: Sequence[float], b: Sequence[float] | None = None, paired: bool = True,
                          alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference a two-sided t-test at ``alpha`` detects with probability ``power``.

    ``a`` alone: ``a`` holds the per-seed differences (a paired design, or one arm against a fixed value).
    ``a`` and ``b`` with ``paired``: the per-seed differences a - b (equal lengths, seed by seed). ``paired=False``:
    two independent arms, Welch's standard error and degrees of freedom. Each sample needs two values or more;
    a study whose spread is zero detects any difference (0 is returned)."""
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError(f"detectable_difference: alpha and power must lie in (0, 1), got {alpha}, {power}")
    if b is not None and paired:
        if len(a) != len(b):
            raise ValueError(f"detectable_difference: a paired design needs as many values in a as in b "
                             f"({len(a)} != {len(b)}); pass paired=False for independent arms")
        a, b = [float(x) - float(y) for x, y in zip(a, b)], None
    if len(a) < 2 or (b is not None and len(b) < 2):
        raise ValueError("detectable_difference: every sample needs at least two values (seeds) to have a spread")
    if b is None:
        n = len(a)
        se, df = _sd(a) / math.sqrt(n), n - 1
    else:
        va, vb = _sd(a) ** 2 / len(a), _sd(b) ** 2 / len(b)
        se = math.sqrt(va + vb)
        if se == 0.0:
            return 0.0
        df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    if se == 0.0:
        return 0.0
    return (t_quantile(1.0 - alpha / 2.0, df) + t_quantile(power, df)) * se


def paired_t_pvalue(differences: Sequence[float]) -> float:
    """The two-sided p-value of a paired t-test that the mean of the per-seed ``differences`` is zero."""
    xs = [float(v) for v in differences]
    if len(xs) < 2:
        raise ValueError("paired_t_pvalue: at least two seeds are needed")
    m, sd = sum(xs) / len(xs), _sd(xs)
    if sd == 0.0:
        return 0.0 if m != 0.0 else 1.0
    t = abs(m) / (sd / math.sqrt(len(xs)))
    return 2.0 * (1.0 - t_cdf(t, len(xs) - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error rate), in input order."""
    ps = [float(p) for p in pvalues]
    order = sorted(range(len(ps)), key=ps.__getitem__)
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def disjoint_ranges_chance(n_a: int, n_b: int | None = None) -> float:
    """The chance that two samples of ``n_a`` and ``n_b`` seeds drawn from one continuous distribution have
    disjoint ranges: all of one below all of the other, 2 n_a! n_b! / (n_a + n_b)! (each order of the pooled
    values is equally likely). For 3 and 3 seeds it is 0.1: the false-positive rate of the book's "seed ranges do
    not overlap" rule for one pair with no difference at all."""
    n_b = n_a if n_b is None else n_b
    return 2.0 * math.factorial(n_a) * math.factorial(n_b) / math.factorial(n_a + n_b)


def seed_range(values: Sequence[float]) -> float:
    """The range (max - min) of a set of per-seed values: the book's seed spread (``evidence.seed_spread`` gives
    the mean, standard deviation, min and max)."""
    xs = [float(v) for v in values]
    if len(xs) < 2:
        raise ValueError("seed_range: a spread needs at least two seeds")
    return max(xs) - min(xs)


def glue_study(prefix: str, spread: float, detectable: float, fmt: str) -> None:
    """Glue a study's seed spread and detectable effect as ``<prefix>_spread`` and ``<prefix>_mde`` at ``fmt``."""
    from .stated import glue_value

    glue_value(f"{prefix}_spread", spread, fmt)
    glue_value(f"{prefix}_mde", detectable, fmt)


def study_text(seeds: int | str, scale: str, prefix: str, fmt: str, spread_of: str, test: str,
               unit: str = "") -> str:
    """The study sentence of a verdict (prose with glue roles; glue the numbers with ``glue_study(prefix, ...)``).

    ``spread_of`` names what varies across seeds ("final validation loss of one arm"); ``test`` says which test
    or rule the detectable effect is for ("paired t-test, two-sided 5%, power 80%")."""
    unit = f" {unit}" if unit else ""
    return (f"{seeds} seeds; {scale}. Seed spread (range) of the {spread_of}: "
            f"{{glue:text}}`{prefix}_spread:{fmt}`{unit}. Smallest effect this study detects: "
            f"{{glue:text}}`{prefix}_mde:{fmt}`{unit} ({test}).")
