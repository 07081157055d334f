#!/usr/bin/python3
"""tools/lab/runkit: a kit keeps what the verdicts and --resume read and nothing
else, reads back as the same cases, and refuses a member that would land
outside the runs folder."""
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
RUNKIT = os.path.join(HERE, "..", "tools", "lab", "runkit")
sys.path.insert(0, os.path.join(HERE, "..", "tools", "lab"))
import verdicts_judge as vj  # noqa: E402


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


class RunKit(unittest.TestCase):
    def test_round_trip_keeps_what_is_read(self):
        with tempfile.TemporaryDirectory() as t:
            runs = os.path.join(t, "runs")
            case = os.path.join(runs, "A9", "on", "seed1")
            records = [{"step": s, "loss": 5.0 - s, "val_loss": 6.0 - s, "grad_norm": 1.5, "lr": 1e-3}
                       for s in range(1, 4)]
            write(os.path.join(case, "metrics.jsonl"), "".join(json.dumps(r) + "\n" for r in records))
            console = ["step %d loss %g\n" % (s, 5.0 - s) for s in range(1, 40)]
            console.insert(3, "checkpoint step_3.h5: 1.5 MB, write 0.25 s, stall 0.01 s\n")
            console.insert(4, "xuanxue: rank 1 failed\n")
            write(os.path.join(case, "console.txt"), "".join(console))
            write(os.path.join(case, "rank0", "log.txt"), "step 1\nstep 2\n")
            write(os.path.join(case, "rank1", "log.txt"), "step 1\nfault nan injected at step 2 (unix time 12.5)\n")
            write(os.path.join(case, "ckpt", "step_3.h5"), "x" * 1000)
            write(os.path.join(case, ".lock"), "pid 1")
            write(os.path.join(runs, "A9", "results.json"),
                  json.dumps({"config": {}, "cases": [{"variant": "on", "seed": 1, "dir": "on/seed1", "rc": 0,
                                                        "summary": {"loss": 2.0}}]}))
            kit = os.path.join(t, "kit.tar.xz")
            subprocess.run([RUNKIT, "pack", runs, kit], check=True, capture_output=True)
            names = set(tarfile.open(kit).getnames())
            self.assertIn("A9/results.json", names)
            self.assertIn("A9/on/seed1/rank1/log.txt", names)
            for gone in ("A9/on/seed1/ckpt/step_3.h5", "A9/on/seed1/.lock", "A9/on/seed1/rank0/log.txt"):
                self.assertNotIn(gone, names)
            back = os.path.join(t, "back")
            subprocess.run([RUNKIT, "unpack", kit, back], check=True, capture_output=True)
            before, after = vj.read_experiment(os.path.join(runs, "A9")), vj.read_experiment(os.path.join(back, "A9"))
            a, b = before[("on", 1)], after[("on", 1)]
            self.assertEqual(a.records, b.records)  # the kept keys of every record
            self.assertEqual(a.facts, b.facts)      # checkpoint facts, the fault's time, the console's tail
            self.assertEqual(b.facts["fault_unix"], 12.5)
            with open(os.path.join(back, "A9", "on", "seed1", "metrics.jsonl")) as f:
                self.assertNotIn("grad_norm", f.read())  # a key no verdict reads is dropped

    def test_unpack_refuses_a_member_outside(self):
        with tempfile.TemporaryDirectory() as t:
            kit = os.path.join(t, "evil.tar.xz")
            with tarfile.open(kit, "w:xz") as tar:
                info = tarfile.TarInfo("../outside.txt")
                info.size = 2
                tar.addfile(info, io.BytesIO(b"hi"))
            r = subprocess.run([RUNKIT, "unpack", kit, os.path.join(t, "runs")], capture_output=True, text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("not a plain file inside the runs folder", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(t, "outside.txt")))


if __name__ == "__main__":
    unittest.main()
