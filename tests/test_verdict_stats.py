#!/usr/bin/python3
"""tools/verdict_stats.py on synthetic paired data with known answers: a clear
effect, one smaller than claimed, a null, a reversed effect, a noisy one, and
non-inferiority both ways; the interval against a direct computation."""
import math
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "tools"))
import verdict_stats as vs  # noqa: E402


def pairs(effect, noise, n, seed, base=10.0):
    rng = random.Random(seed)
    baseline = [base + rng.gauss(0, 1) for _ in range(n)]
    return baseline, [b + effect + rng.gauss(0, noise) for b in baseline]


class Verdicts(unittest.TestCase):
    def test_interval_is_mean_plus_minus_t_se(self):
        b, v = [1.0, 2.0, 3.0, 4.0, 5.0], [1.5, 2.1, 3.9, 4.2, 5.8]
        e = vs.paired(b, v)
        d = [0.5, 0.1, 0.9, 0.2, 0.8]
        mean = sum(d) / 5
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 4)
        self.assertAlmostEqual(e["mean"], mean)
        self.assertAlmostEqual(e["sd"], sd)
        self.assertAlmostEqual(e["hi"] - e["mean"], 2.776 * sd / math.sqrt(5))
        self.assertEqual(e["n"], 5)
        with self.assertRaises(ValueError):
            vs.paired([1.0], [2.0, 3.0])

    def test_relative_effects(self):
        e = vs.paired([100.0, 200.0, 50.0], [85.0, 170.0, 42.5], relative=True)
        self.assertAlmostEqual(e["mean"], -0.15, places=12)
        self.assertAlmostEqual(e["sd"], 0.0, places=12)

    def test_clear_effect_is_confirmed(self):
        b, v = pairs(-0.2, 0.01, 5, 1)
        self.assertEqual(vs.superiority(vs.paired(b, v), -0.15), "confirmed")

    def test_smaller_than_claimed(self):
        b, v = pairs(-0.05, 0.005, 5, 2)
        self.assertEqual(vs.superiority(vs.paired(b, v), -0.15), "confirmed, smaller than claimed")

    def test_null_refutes_a_large_claim(self):
        b, v = pairs(0.0, 0.01, 8, 3)
        self.assertEqual(vs.superiority(vs.paired(b, v), -0.15), "refuted")

    def test_reversed_effect_is_refuted(self):
        b, v = pairs(+0.1, 0.01, 5, 4)
        self.assertEqual(vs.superiority(vs.paired(b, v), -0.15), "refuted")

    def test_noise_is_inconclusive_and_says_what_n_detects(self):
        b, v = pairs(-0.1, 0.3, 5, 5)
        e = vs.paired(b, v)
        self.assertEqual(vs.superiority(e, -0.15), "inconclusive")
        self.assertGreater(e["mde"], e["hi"] - e["mean"])  # more than the half-width: power costs
        self.assertIn("this n detects", vs.describe(e, "inconclusive"))

    def test_positive_claims_mirror_negative_ones(self):
        b, v = pairs(+0.2, 0.01, 5, 6)
        self.assertEqual(vs.superiority(vs.paired(b, v), +0.15), "confirmed")
        self.assertEqual(vs.superiority(vs.paired(v, b), +0.15), "refuted")

    def test_non_inferiority(self):
        b, v = pairs(0.001, 0.002, 6, 7)  # val loss 0.001 higher: within a margin of 0.05
        self.assertEqual(vs.non_inferiority(vs.paired(b, v), +0.05), "confirmed")
        b, v = pairs(0.2, 0.002, 6, 8)  # clearly worse
        self.assertEqual(vs.non_inferiority(vs.paired(b, v), +0.05), "refuted")
        b, v = pairs(0.05, 0.2, 6, 9)  # can't tell
        self.assertEqual(vs.non_inferiority(vs.paired(b, v), +0.05), "inconclusive")

    def test_t_quantiles_are_conservative_between_table_rows(self):
        self.assertEqual(vs.t975(4), 2.776)
        self.assertEqual(vs.t975(22), 2.086)  # df 20's: wider than the true 2.074
        self.assertGreaterEqual(vs.t975(1000), 1.96)


if __name__ == "__main__":
    unittest.main()
