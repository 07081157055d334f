#!/usr/bin/python3
"""tools/lab/verdicts_judge.py on synthetic cases with known answers: the special
verdicts (not exercised, metric cannot show it, caught, not the switch's doing),
the compute-terms margin, exact metrics, the family adjustment, and the
archive's round trip; and tools/lab/verdicts_lib.py's claims: one primary row per
claim, every size with a source, every experiment a row reads."""
import os
import random
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "tools", "lab"))
import verdicts_judge as vj  # noqa: E402
import verdicts_lib as vl  # noqa: E402


def case(variant, seed, losses, vals, rc=0, tail=(), **facts):
    records = [{"step": i + 1, "loss": x, "ms_per_step": 10.0} for i, x in enumerate(losses)]
    for step, v in vals:
        records[step - 1]["val_loss"] = v
    f = {"ckpt_write": [], "restored": [], "load_s": None, "fault_unix": None, "ckpt_mb": [],
         "console_tail": list(tail)}
    f.update(facts)
    return vj.CaseData(variant, seed, rc, {"comm_bytes": 100.0}, records, f, 1000.0, {"binary": {"sha256": "ab"}})


def curve(seed, shift=0.0, n=10):
    rng = random.Random(seed)
    return [5.0 - 0.1 * i + shift + rng.random() * 1e-3 for i in range(n)]


def vals(seed, final, n=10):
    # val every step: falls by 0.02 a step, so V(0.9 T) - V(T) = 0.02
    return [(s, final + 0.02 * (n - s)) for s in range(1, n + 1)]


class Judge(unittest.TestCase):
    def test_identical_curves_are_not_exercised(self):
        cases = {}
        for seed in (1, 2, 3):
            cases[("a", seed)] = case("a", seed, curve(seed), vals(seed, 4.0))
            cases[("b", seed)] = case("b", seed, curve(seed), vals(seed, 4.0))
        t = vl.loss_better("X", "E", "a", "b")
        self.assertEqual(vj.judge(t, cases, [1, 2, 3])["verdict"], "not exercised")

    def test_an_equal_metric_with_different_curves_cannot_show_it(self):
        cases = {}
        for seed in (1, 2, 3):
            cases[("a", seed)] = case("a", seed, curve(seed), vals(seed, 4.0))
            cases[("b", seed)] = case("b", seed, curve(seed, 0.01), vals(seed, 4.0))
        t = vl.Test("X", "E", "a", "b", "comm_bytes", "superiority", -0.1)
        self.assertEqual(vj.judge(t, cases, [1, 2, 3])["verdict"], "metric cannot show it")

    def test_compute_margin_and_verdict(self):
        cases = {}
        for seed in (1, 2, 3, 4):
            cases[("a", seed)] = case("a", seed, curve(seed), vals(seed, 4.0 + 0.001 * seed))
            cases[("b", seed)] = case("b", seed, curve(seed, 0.01), vals(seed, 4.0 + 0.0011 * seed))
        row = vj.judge(vl.loss_ni("X", "E", "a", "b"), cases, [1, 2, 3, 4])
        self.assertAlmostEqual(row["size"], 0.02 / 4.0025, places=3)  # V(9) - V(10) = 0.02 over V(10)
        vj.adjust([row], lambda r: 1)
        self.assertEqual(row["verdict"], "confirmed")  # +0.0025% against a 0.5% margin
        # the same pairs against a margin they exceed: worse by 1% each
        for seed in (1, 2, 3, 4):
            cases[("b", seed)] = case("b", seed, curve(seed, 0.01), vals(seed, (4.0 + 0.001 * seed) * 1.01))
        row = vj.judge(vl.loss_ni("X", "E", "a", "b"), cases, [1, 2, 3, 4])
        vj.adjust([row], lambda r: 1)
        self.assertEqual(row["verdict"], "refuted")

    def test_exact_metric_is_one_value(self):
        cases = {}
        for seed in (1, 2):
            cases[("a", seed)] = case("a", seed, curve(seed), vals(seed, 4.0))
            b = case("b", seed, curve(seed, 0.01), vals(seed, 4.0))
            b.summary["comm_bytes"] = 30.0
            cases[("b", seed)] = b
        row = vj.judge(vl.Test("X", "E", "a", "b", "comm_bytes", "superiority", -0.15), cases, [1, 2])
        vj.adjust([row], lambda r: 1)
        self.assertEqual(row["verdict"], "confirmed")
        self.assertEqual(row["effect_text"], "-70% exactly, on every seed")

    def test_caught_and_not_the_switchs_doing(self):
        t = vl.Test("X", "E", "off", "on", "hang", "caught", expect="rank 1", baseline_outcomes=("hung",))
        cases = {}
        for seed in (1, 2):
            cases[("off", seed)] = case("off", seed, curve(seed), [], rc="timeout")
            cases[("on", seed)] = case("on", seed, curve(seed), [], rc=1, tail=["xuanxue: rank 1 stopped"])
        self.assertEqual(vj.judge(t, cases, [1, 2])["verdict"], "confirmed")
        cases[("on", 2)] = case("on", 2, curve(2), [], rc="timeout")
        self.assertEqual(vj.judge(t, cases, [1, 2])["verdict"], "refuted")
        for seed in (1, 2):  # both arms end naming the rank: the switch is not what caught it
            cases[("off", seed)] = case("off", seed, curve(seed), [], rc=1, tail=["xuanxue: rank 1 stopped"])
            cases[("on", seed)] = case("on", seed, curve(seed), [], rc=1, tail=["xuanxue: rank 1 stopped"])
        self.assertEqual(vj.judge(t, cases, [1, 2])["verdict"], "not exercised")

    def test_protected_from_a_second_job(self):
        t = vl.Test("X", "E", "a", "b", "second_job", "protected", expect="in use by another job")
        refused = ["xuanxue: RUN in use by another job (host h, pid 1)", "# exit status 2"]
        cases = {}
        for seed in (1, 2):
            cases[("a", seed)] = case("a", seed, curve(seed), [], second_job=["# exit status 0"], reload_rc=0)
            cases[("b", seed)] = case("b", seed, curve(seed), [], second_job=refused, reload_rc=0)
        self.assertEqual(vj.judge(t, cases, [1, 2])["verdict"], "confirmed")
        for seed in (1, 2):
            cases[("a", seed)] = case("a", seed, curve(seed), [], second_job=refused, reload_rc=0)
        self.assertEqual(vj.judge(t, cases, [1, 2])["verdict"], "not exercised")
        cases[("b", 2)] = case("b", 2, curve(2), [], second_job=refused, reload_rc=1)  # its checkpoint did not load
        self.assertEqual(vj.judge(t, cases, [1, 2])["verdict"], "refuted")

    def test_holm_over_primaries_and_second_looks(self):
        rows = []
        rng = random.Random(5)
        for k in range(3):
            cases = {}
            for seed in range(1, 6):
                base = 100 + rng.random()
                cases[("a", seed)] = case("a", seed, curve(seed), vals(seed, 4.0))
                cases[("a", seed)].summary["comm_bytes"] = base
                cases[("b", seed)] = case("b", seed, curve(seed, 0.01), vals(seed, 4.0))
                cases[("b", seed)].summary["comm_bytes"] = base * (0.97 + 0.01 * rng.random())
            row = vj.judge(vl.Test(f"X{k}", "E", "a", "b", "comm_bytes", "superiority", -0.10, primary=True),
                           cases, list(range(1, 6)))
            rows.append(row)
        vj.adjust(rows, lambda r: 1)
        first = [r["p_adjusted"] for r in rows]
        self.assertTrue(all(r["family"] == "Holm over 6 hypotheses" for r in rows))
        vj.adjust(rows, lambda r: 2)
        self.assertTrue(all(b[0] >= a[0] and b[1] >= a[1] for a, b in zip(first, (r["p_adjusted"] for r in rows))))

    def test_archive_round_trip(self):
        c = case("a", 1, curve(1), vals(1, 4.0), ckpt_write=[0.5, 0.7])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "archive.json.xz")
            vj.write_archive(path, {"E": {("a", 1): c}}, {"seeds_of": {"A1": [1]}})
            exps, meta = vj.read_archive(path)
        self.assertEqual(exps["E"][("a", 1)], c)
        self.assertEqual(meta["seeds_of"], {"A1": [1]})


class Claims(unittest.TestCase):
    def test_one_primary_per_claim_and_every_size_sourced(self):
        for scale in (vl.FULL, vl.QUICK):
            cs = vl.claims(scale)
            self.assertEqual([c.id for c in cs], ["A1", "A2", "A3", "A4", "A5", "A6", "A7", "B1", "B2", "B3", "B4",
                                                  "B5", "B6", "B7"])
            for c in cs:
                self.assertEqual(sum(t.primary for t in c.tests), 1, c.id)
                names = {e.name for e in c.experiments}
                for t in c.tests:
                    if not c.untestable:
                        self.assertIn(t.experiment, names, t.row)
                    if t.rule in ("superiority", "non_inferiority"):
                        self.assertTrue(t.source.startswith(("the seed:", "default", "goal:")), t.row)
                        self.assertTrue(t.size == "compute" or t.size != 0, t.row)
                for e in c.experiments:
                    for arm in list(e.tune) + list(e.lr_like):
                        self.assertIn(arm, [v.split(":", 1)[0] for v in e.variants], f"{e.name} {arm}")

    def test_decoupled_claims_see_three_epochs(self):
        a2 = next(c for c in vl.claims(vl.FULL) if c.id == "A2")
        e = a2.experiments[0]
        epoch = 223849 / (e.ranks * 8 * 64)
        self.assertGreaterEqual(e.steps / epoch, 3)
        self.assertTrue(all("sync local 8" in c for c in e.common))


if __name__ == "__main__":
    unittest.main()
