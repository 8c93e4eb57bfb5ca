"""The detectable-effect arithmetic the verdicts quote (manifold_muon_book.power)."""

import math
import random

import pytest

from manifold_muon_book.power import (detectable_difference, disjoint_ranges_chance, holm, paired_t_pvalue, seed_range,
                                      study_text, t_cdf, t_quantile)


@pytest.mark.parametrize("p, df, table", [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776),
                                          (0.975, 10, 2.228), (0.95, 5, 2.015), (0.8, 2, 1.061),
                                          (0.995, 30, 2.750)])
def test_t_quantiles_match_the_printed_tables(p, df, table):
    assert round(t_quantile(p, df), 3) == table


def test_t_distribution_is_symmetric_and_tends_to_the_normal():
    assert t_cdf(0.0, 3) == 0.5
    assert t_quantile(0.1, 7) == pytest.approx(-t_quantile(0.9, 7), abs=1e-10)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-4)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    for t in (-3.0, -0.4, 0.7, 2.5):  # the cdf inverts the quantile
        assert t_quantile(t_cdf(t, 4), 4) == pytest.approx(t, abs=1e-9)


def test_the_paired_mde_is_the_power_formula():
    d = [0.03, 0.01, 0.05]
    sd = math.sqrt(sum((x - 0.03) ** 2 for x in d) / 2)
    assert detectable_difference(d) == pytest.approx((t_quantile(0.975, 2) + t_quantile(0.8, 2)) * sd / math.sqrt(3))
    assert detectable_difference([1.03, 1.01, 1.05], [1.0, 1.0, 1.0]) == pytest.approx(detectable_difference(d))


def test_more_seeds_detect_smaller_effects_and_the_simulated_power_is_about_80_percent():
    rng = random.Random(0)
    few = detectable_difference([rng.gauss(0, 1) for _ in range(3)])
    many = detectable_difference([rng.gauss(0, 1) for _ in range(30)])
    assert many < few
    # a true effect of the MDE computed from the true sd is found by the t-test about 80% of the time
    n, sd = 5, 1.0
    mde = (t_quantile(0.975, n - 1) + t_quantile(0.8, n - 1)) * sd / math.sqrt(n)
    hits = 0
    for _ in range(4000):
        xs = [rng.gauss(mde, sd) for _ in range(n)]
        m = sum(xs) / n
        s = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
        hits += abs(m / (s / math.sqrt(n))) > t_quantile(0.975, n - 1)
    assert 0.72 < hits / 4000 < 0.86  # the t-approximation of the noncentral t: close to 80%


def test_welch_for_independent_arms_and_bad_input_is_refused():
    a, b = [2.0, 2.1, 2.3], [2.5, 2.4, 2.9, 2.6]
    assert detectable_difference(a, b, paired=False) > 0
    with pytest.raises(ValueError, match="paired=False"):
        detectable_difference(a, b)  # 3 against 4: not a paired design
    with pytest.raises(ValueError, match="at least two"):
        detectable_difference([1.0])
    with pytest.raises(ValueError, match="alpha and power"):
        detectable_difference(a, alpha=1.5)
    assert detectable_difference([0.25, 0.25, 0.25]) == 0.0  # no spread: any difference is seen
    assert seed_range([3.0, 1.0, 2.0]) == 2.0


def test_the_study_sentence_names_seeds_scale_spread_and_detectable_effect():
    text = study_text(5, "n = 16..128", "p", ".1g", "best alpha", "the grid's resolution")
    assert text.startswith("5 seeds; n = 16..128.") and "{glue:text}`p_spread:.1g`" in text
    assert "{glue:text}`p_mde:.1g`" in text and "detects" in text


def test_the_disjoint_range_rule_fires_by_chance_as_often_as_the_formula_says():
    assert disjoint_ranges_chance(3) == pytest.approx(0.1)
    rng = random.Random(1)
    hits = 0
    for _ in range(20000):
        a, b = [rng.random() for _ in range(3)], [rng.random() for _ in range(3)]
        hits += max(a) < min(b) or max(b) < min(a)
    assert abs(hits / 20000 - 0.1) < 0.01


def test_paired_p_values_and_holm():
    assert paired_t_pvalue([0.1, -0.1, 0.1, -0.1]) == pytest.approx(1.0)
    d = [1.0, 1.2, 0.9, 1.1]  # t = 1.05 / (0.129 / 2) = 16.3 on 3 df
    assert paired_t_pvalue(d) == pytest.approx(2 * (1 - t_cdf(16.26, 3)), rel=1e-2)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
