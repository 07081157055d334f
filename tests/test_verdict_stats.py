#!/usr/bin/python3
"""tools/lab/verdict_stats.py on synthetic paired data with known answers: clear,
smaller-than-claimed, null, reversed and noisy effects, non-inferiority both
ways, exact (deterministic) metrics, log ratios, and the Holm and
Benjamini-Hochberg adjustments against hand-computed values."""
import math
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "tools", "lab"))
import verdict_stats as vs  # noqa: E402


def pairs(effect, noise, n, seed, base=10.0):
    rng = random.Random(seed)
    baseline = [base + rng.gauss(0, 1) for _ in range(n)]
    return baseline, [b + effect + rng.gauss(0, noise) for b in baseline]


def verdict(b, v, rule, size, scale="difference"):
    e = vs.paired(b, v, scale)
    return vs.decide(rule, *vs.hypotheses(e, rule, vs.to_scale(size, scale)))


class Verdicts(unittest.TestCase):
    def test_interval_is_mean_plus_minus_t_se(self):
        b, v = [1.0, 2.0, 3.0, 4.0, 5.0], [1.5, 2.1, 3.9, 4.2, 5.8]
        e = vs.paired(b, v)
        d = [0.5, 0.1, 0.9, 0.2, 0.8]
        mean = sum(d) / 5
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 4)
        self.assertAlmostEqual(e["mean"], mean)
        self.assertAlmostEqual(e["sd"], sd)
        lo, hi = vs.interval(e)
        self.assertAlmostEqual(hi - e["mean"], 2.7764451 * sd / math.sqrt(5), places=6)  # t(0.975, 4)
        self.assertEqual(e["n"], 5)
        with self.assertRaises(ValueError):
            vs.paired([1.0], [2.0, 3.0])
        with self.assertRaises(ValueError):
            vs.paired([1.0], [2.0])

    def test_p_values_match_the_t_distribution(self):
        # d = 0.5, 0.1, 0.9, 0.2, 0.8: mean 0.5, sd 0.35355, t = 3.1623 with 4 df: one-sided p = 0.017
        e = vs.paired([1.0, 2.0, 3.0, 4.0, 5.0], [1.5, 2.1, 3.9, 4.2, 5.8])
        self.assertAlmostEqual(vs.p_above(e, 0.0), 0.01707, places=4)
        self.assertAlmostEqual(vs.p_below(e, 0.0), 1 - 0.01707, places=4)
        self.assertAlmostEqual(vs.p_above(e, 0.5), 0.5, places=12)

    def test_relative_and_exact(self):
        e = vs.paired([100.0, 200.0, 50.0], [85.0, 170.0, 42.5], scale="relative")
        self.assertAlmostEqual(e["mean"], -0.15, places=12)
        self.assertEqual(e["sd"], 0.0)
        self.assertTrue(e["exact"])
        self.assertEqual(vs.interval(e), (e["mean"], e["mean"]))
        # an exact -15% against a claimed -15%: in the claimed direction, and not smaller than claimed
        self.assertEqual(vs.hypotheses(e, "superiority", -0.15), (0.0, 1.0))
        self.assertEqual(vs.decide("superiority", 0.0, 1.0), "confirmed")
        # an exact -10% against a claimed -15%: real but smaller
        e = vs.paired([100.0, 200.0], [90.0, 180.0], scale="relative")
        self.assertEqual(vs.decide("superiority", *vs.hypotheses(e, "superiority", -0.15)),
                         "confirmed, smaller than claimed")
        self.assertIsNone(vs.n_needed(e, -0.15))

    def test_log_ratio(self):
        e = vs.paired([2.0, 4.0, 8.0], [1.0, 2.0, 4.0], scale="log")
        self.assertAlmostEqual(vs.from_scale(e["mean"], "log"), -0.5, places=12)
        self.assertAlmostEqual(vs.to_scale(-0.5, "log"), math.log(0.5), places=12)
        with self.assertRaises(ValueError):
            vs.paired([1.0, -1.0], [1.0, 1.0], scale="log")

    def test_clear_effect_is_confirmed(self):
        b, v = pairs(-0.2, 0.01, 5, 1)
        self.assertEqual(verdict(b, v, "superiority", -0.15), "confirmed")

    def test_smaller_than_claimed(self):
        b, v = pairs(-0.05, 0.005, 5, 2)
        self.assertEqual(verdict(b, v, "superiority", -0.15), "confirmed, smaller than claimed")

    def test_null_refutes_a_large_claim(self):
        b, v = pairs(0.0, 0.01, 8, 3)
        self.assertEqual(verdict(b, v, "superiority", -0.15), "refuted")

    def test_reversed_effect_is_refuted(self):
        b, v = pairs(+0.1, 0.01, 5, 4)
        self.assertEqual(verdict(b, v, "superiority", -0.15), "refuted")

    def test_noise_is_inconclusive_and_says_what_n_decides(self):
        b, v = pairs(-0.1, 0.3, 5, 5)
        e = vs.paired(b, v)
        self.assertEqual(vs.decide("superiority", *vs.hypotheses(e, "superiority", -0.15)), "inconclusive")
        n = vs.n_needed(e, -0.15)
        self.assertGreater(n, 5)
        # at that n the same sd would detect the size; at one fewer it would not
        t = lambda k: (vs._st.t.ppf(0.95, k - 1) + vs._st.t.ppf(0.8, k - 1)) * e["sd"] / math.sqrt(k)
        self.assertLessEqual(t(n), 0.15)
        self.assertGreater(t(n - 1), 0.15)
        self.assertGreater(vs.n_needed(e, -0.15, tests=14), n)  # a stricter alpha needs more pairs

    def test_positive_claims_mirror_negative_ones(self):
        b, v = pairs(+0.2, 0.01, 5, 6)
        self.assertEqual(verdict(b, v, "superiority", +0.15), "confirmed")
        self.assertEqual(verdict(v, b, "superiority", +0.15), "refuted")

    def test_non_inferiority(self):
        b, v = pairs(0.001, 0.002, 6, 7)  # val loss 0.001 higher: within a margin of 0.05
        self.assertEqual(verdict(b, v, "non_inferiority", +0.05), "confirmed")
        b, v = pairs(0.2, 0.002, 6, 8)  # clearly worse
        self.assertEqual(verdict(b, v, "non_inferiority", +0.05), "refuted")
        b, v = pairs(0.05, 0.2, 6, 9)  # can't tell
        self.assertEqual(verdict(b, v, "non_inferiority", +0.05), "inconclusive")
        e = vs.paired(*pairs(0.01, 0.05, 6, 10))
        ps, pa = vs.hypotheses(e, "non_inferiority", 0.05)
        self.assertAlmostEqual(ps + pa, 1.0, places=12)

    def test_holm_by_hand(self):
        p = [0.01, 0.04, 0.03, 0.005]
        # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> max 0.06)
        self.assertEqual([round(x, 12) for x in vs.holm(p)], [0.03, 0.06, 0.06, 0.02])
        self.assertEqual(vs.holm([0.5]), [0.5])
        self.assertEqual(vs.holm([0.9, 0.8]), [1.0, 1.0])

    def test_bh_by_hand(self):
        p = [0.01, 0.04, 0.03, 0.005]
        # ascending 0.005 (x4/1 = 0.02), 0.01 (x4/2 = 0.02), 0.03 (x4/3 = 0.04), 0.04 (x4/4 = 0.04)
        self.assertEqual([round(x, 12) for x in vs.bh(p)], [0.02, 0.04, 0.04, 0.02])
        self.assertEqual(vs.bh([0.2, 0.9]), [0.4, 0.9])

    def test_adjustment_can_overturn_an_unadjusted_confirmation(self):
        b, v = pairs(-0.02, 0.02, 5, 11)
        e = vs.paired(b, v)
        ps, pa = vs.hypotheses(e, "superiority", -0.05)
        self.assertLess(ps, 0.05)
        self.assertEqual(vs.decide("superiority", ps, pa), "confirmed, smaller than claimed")
        adjusted = vs.holm([ps, pa] + [0.5] * 26)[:2]  # one row among 14 primaries
        self.assertNotEqual(vs.decide("superiority", *adjusted), "confirmed, smaller than claimed")


if __name__ == "__main__":
    unittest.main()
