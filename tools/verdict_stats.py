"""Paired statistics and the verdict rule of tools/verdicts (issue 10/13).

A claim is tested as a paired experiment: the baseline and the variant run
on the same seeds; d_i = variant_i - baseline_i (or, for a relative claim,
(variant_i - baseline_i) / baseline_i). The effect is the mean of d with its
95% confidence interval, mean +- t(0.975, n-1) * sd / sqrt(n).

Two kinds of claim, each with a stated rule:

  superiority, "the variant changes the metric by `size` (signed)":
    confirmed                     the interval lies on the claimed side of 0
                                  and reaches the claimed size (it holds size,
                                  or lies beyond it);
    confirmed, smaller than claimed  on the claimed side of 0, but the
                                  interval excludes the claimed size;
    refuted                       the interval excludes the claimed size and
                                  does not lie on the claimed side of 0;
    inconclusive                  the interval holds both 0 and the claimed
                                  size; the smallest effect this n could
                                  detect is given (80% power, two-sided 5%).

  non-inferiority, "the variant is no worse than `margin`" (the sign of
  margin says which way is worse: +0.01 = "at most 1% higher"):
    confirmed                     the interval lies entirely on the good side
                                  of the margin;
    refuted                       the interval lies entirely beyond it;
    inconclusive                  the interval holds the margin.
"""
import math

# Two-sided 95% quantiles of Student's t, by degrees of freedom.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101,
         19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
# One-sided 80% quantiles (power): t(0.80, df).
_T80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889, 9: 0.883,
        10: 0.879, 15: 0.866, 20: 0.860, 30: 0.854, 60: 0.848, 120: 0.845}


def _quantile(table, df):
    """The quantile at the largest tabulated df <= df: exact where tabulated, else a little
    larger than the true one (a wider interval: conservative)."""
    if df < 1:
        raise ValueError("a paired interval needs at least 2 pairs")
    return table[max(k for k in table if k <= df)]


def t975(df):
    return _quantile(_T975, df)


def t80(df):
    return _quantile(_T80, df)


def paired(baseline, variant, relative=False):
    """{n, mean, sd, lo, hi, mde} of the paired differences (variant - baseline)."""
    if len(baseline) != len(variant):
        raise ValueError(f"{len(baseline)} baseline values but {len(variant)} variant values (expected pairs)")
    d = [(v - b) / b if relative else v - b for b, v in zip(baseline, variant)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else float("nan")
    se = sd / math.sqrt(n)
    half = t975(n - 1) * se
    return {"n": n, "mean": mean, "sd": sd, "lo": mean - half, "hi": mean + half,
            "mde": (t975(n - 1) + t80(n - 1)) * se, "relative": relative}


def superiority(effect, size):
    """The verdict on "the variant changes the metric by `size`" (signed, not 0)."""
    if size == 0:
        raise ValueError("a superiority claim needs a non-zero claimed size")
    s = 1 if size > 0 else -1
    lo, hi = sorted((s * effect["lo"], s * effect["hi"]))  # oriented: the claim points to +
    claim = abs(size)
    if lo > 0 and hi >= claim:
        return "confirmed"
    if lo > 0:
        return "confirmed, smaller than claimed"
    if hi < claim:
        return "refuted"
    return "inconclusive"


def non_inferiority(effect, margin):
    """The verdict on "the variant is no worse than `margin`" (worse is margin's sign)."""
    if margin == 0:
        raise ValueError("a non-inferiority claim needs a non-zero margin")
    s = 1 if margin > 0 else -1
    lo, hi = sorted((s * effect["lo"], s * effect["hi"]))
    if hi < abs(margin):
        return "confirmed"
    if lo > abs(margin):
        return "refuted"
    return "inconclusive"


def describe(effect, verdict):
    """One line: effect +- half-width, n, verdict (and the detectable effect when inconclusive)."""
    pct = 100.0 if effect["relative"] else 1.0
    unit = "%" if effect["relative"] else ""
    half = (effect["hi"] - effect["lo"]) / 2
    text = f"{effect['mean'] * pct:+.3g}{unit} ± {half * pct:.2g}{unit} (n={effect['n']}): {verdict}"
    if verdict == "inconclusive":
        text += f"; this n detects {effect['mde'] * pct:.2g}{unit} or more"
    return text
