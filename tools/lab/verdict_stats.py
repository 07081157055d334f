"""Paired statistics and the verdict rule of tools/lab/verdicts (issue 15/18).

A claim is tested as a paired experiment: the baseline and the variant run on
the same seeds, and each seed gives one difference d_i on one of three scales:

  difference  d = v - b                 (accuracy points, nats)
  relative    d = (v - b) / b           (bytes, losses: a fraction of the baseline)
  log         d = ln(v / b)             (times and rates: the effect is exp(mean) - 1,
                                         the geometric mean ratio less one)

Every row has two one-sided hypotheses, fixed with the row before it runs
(oriented so that the claim points to +; S the claimed size, M the margin):

  superiority ("the variant changes the metric by S"):
    support   H0: delta <= 0       rejected: the change is real and in the claimed direction
    against   H0: delta >= |S|     rejected: the change is smaller than claimed
  non-inferiority ("the variant is no worse than M"):
    support   H0: delta >= |M|     rejected: it is better than the margin
    against   H0: delta <= |M|     rejected: it is worse than the margin

Each is a one-sided paired t test. Where every pair gives the same d (a
deterministic metric such as bytes), the t statistic is infinite and the
p-value is 0 or 1 exactly: such rows are decided by their exact value.

The p-values of a family are adjusted together: Holm over the primary rows
(one per claim, both hypotheses of each: the family-wise error stays below
ALPHA), Benjamini-Hochberg over the exploratory rows (the false discovery rate
stays below ALPHA). A row judged on a second look (seeds added after an
inconclusive first pass) has its p-values multiplied by the number of looks
first (Bonferroni alpha spending: ALPHA / looks per look).

The verdict, from the adjusted p-values at ALPHA:
  superiority:     support and against rejected: confirmed, smaller than claimed
                   support only:                 confirmed
                   against only:                 refuted
                   neither:                      inconclusive (and the n that would decide it)
  non-inferiority: support: confirmed; against: refuted; neither: inconclusive
"""
import math

from scipy import stats as _st

ALPHA = 0.05
POWER = 0.80


def paired(baseline, variant, scale="difference"):
    """{n, mean, sd, se, df, scale} of the paired differences on `scale` (see the module's docstring)."""
    if len(baseline) != len(variant):
        raise ValueError(f"{len(baseline)} baseline values but {len(variant)} variant values (expected pairs)")
    if scale not in ("difference", "relative", "log"):
        raise ValueError(f"scale {scale!r} (expected difference, relative or log)")
    if scale == "log" and any(x <= 0 for x in list(baseline) + list(variant)):
        raise ValueError("a log ratio needs positive values")
    if scale == "relative" and any(b == 0 for b in baseline):
        raise ValueError("a relative difference needs a non-zero baseline")
    d = [math.log(v / b) if scale == "log" else (v - b) / b if scale == "relative" else v - b
         for b, v in zip(baseline, variant)]
    n = len(d)
    if n < 2:
        raise ValueError("a paired test needs at least 2 pairs")
    mean = math.fsum(d) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    if all(x == d[0] for x in d):
        sd = 0.0  # exactly: no rounding residue makes a deterministic metric look noisy
    return {"n": n, "mean": mean, "sd": sd, "se": sd / math.sqrt(n), "df": n - 1, "scale": scale,
            "exact": sd == 0.0}


def to_scale(size, scale):
    """A claimed size given as a fraction of the baseline (or points, for `difference`) on the row's scale."""
    return math.log1p(size) if scale == "log" else size


def from_scale(x, scale):
    """A value on the row's scale back to a fraction of the baseline (log: exp(x) - 1)."""
    return math.expm1(x) if scale == "log" else x


def interval(effect, level=0.95):
    """The two-sided `level` t interval of the mean difference (on the row's scale)."""
    if effect["se"] == 0:
        return effect["mean"], effect["mean"]
    half = _st.t.ppf(0.5 + level / 2, effect["df"]) * effect["se"]
    return effect["mean"] - half, effect["mean"] + half


def p_above(effect, null):
    """One-sided p of H0: mean <= null against mean > null."""
    if effect["se"] == 0:
        return 0.0 if effect["mean"] > null else 1.0
    return float(_st.t.sf((effect["mean"] - null) / effect["se"], effect["df"]))


def p_below(effect, null):
    """One-sided p of H0: mean >= null against mean < null."""
    if effect["se"] == 0:
        return 0.0 if effect["mean"] < null else 1.0
    return float(_st.t.cdf((effect["mean"] - null) / effect["se"], effect["df"]))


def hypotheses(effect, rule, size):
    """(p_support, p_against) of a row, unadjusted; `size` is on the row's scale, signed."""
    if size == 0:
        raise ValueError(f"a {rule} row needs a non-zero size")
    s = 1.0 if size > 0 else -1.0
    oriented = dict(effect, mean=s * effect["mean"])  # the claim (or the worse side) points to +
    if rule == "superiority":
        return p_above(oriented, 0.0), p_below(oriented, abs(size))
    if rule == "non_inferiority":
        return p_below(oriented, abs(size)), p_above(oriented, abs(size))
    raise ValueError(f"rule {rule!r} (expected superiority or non_inferiority)")


def holm(pvalues):
    """Holm's step-down adjusted p-values, in the input's order (family-wise error control)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def bh(pvalues):
    """Benjamini-Hochberg adjusted p-values (q-values), in the input's order (false discovery rate control)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i], reverse=True)
    out, running = [0.0] * m, 1.0
    for k, i in enumerate(order):
        rank = m - k  # 1-based rank in ascending order
        running = min(running, pvalues[i] * m / rank)
        out[i] = min(1.0, running)
    return out


def decide(rule, p_support, p_against, alpha=ALPHA):
    """The verdict from the adjusted p-values (see the module's docstring)."""
    sup, ag = p_support < alpha, p_against < alpha
    if rule == "non_inferiority":
        return "confirmed" if sup else "refuted" if ag else "inconclusive"
    if sup and ag:
        return "confirmed, smaller than claimed"
    return "confirmed" if sup else "refuted" if ag else "inconclusive"


def n_needed(effect, size, alpha=ALPHA, power=POWER, tests=1, limit=10000):
    """Pairs a paired one-sided t test at alpha / tests needs for `power` against a true difference of |size|
    (on the row's scale) with the observed sd; None where the sd is 0 (no test needed) or it passes `limit`."""
    if effect["sd"] == 0 or size == 0:
        return None
    a = alpha / tests
    for n in range(2, limit + 1):
        if (_st.t.ppf(1 - a, n - 1) + _st.t.ppf(power, n - 1)) * effect["sd"] / math.sqrt(n) <= abs(size):
            return n
    return None
