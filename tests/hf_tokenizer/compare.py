#!/usr/bin/python3
# The C++ tokenizer.json reader (build/xx_tokenize, src/data/hf_tokenizer.cpp) against the independent Python
# reference (tests/hf_tokenizer/reference.py, written from the format's definition) on the committed
# DeepSeek-V3-style fixture: the same ids, token for token, on the multilingual text, the training text and a
# set of awkward strings; and the C++ decode gives back each text byte for byte.
#   usage: /usr/bin/python3 tests/hf_tokenizer/compare.py XX_TOKENIZE   (ctest hf_tokenizer_reference)
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(HERE), "data", "hf_tokenizer")
sys.path.insert(0, HERE)
import reference  # noqa: E402

AWKWARD = [
    "", " ", "\n", "  \n\n\t\t  x", "1234567 3.14159 0", "玄学玄学，模型。", "かなカナ漢字", "👩‍💻🇨🇳👍🏽",
    "e\u0301 \u00a0\u3000\u0085x", "<｜end▁of▁sentence｜><｜end▁of▁sentence｜>a<｜begin▁of▁sentence｜>",
    "def f(x):\n    return x**2  # 平方\n", "a\r\nb\r\n\r\n", "'s 't 're 'LL", "!!!???...", "\t\t\t",
]


def main(binary):
    tok = reference.load(os.path.join(DATA, "tokenizer.json"))
    texts = [(name, open(os.path.join(DATA, name), encoding="utf-8", newline="").read())
             for name in ("multilingual.txt", "train.txt")]
    texts += [("awkward %d" % i, s) for i, s in enumerate(AWKWARD)]
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in texts:
            path = os.path.join(tmp, "text")
            with open(path, "wb") as f:
                f.write(text.encode("utf-8"))
            got = json.loads(subprocess.run([binary, os.path.join(DATA, "tokenizer.json"), "encode", path],
                                            check=True, capture_output=True).stdout)
            want = tok.encode(text)
            if got != want:
                at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                print("FAIL %s: C++ %d ids, reference %d; first difference at id %d: C++ %s, reference %s"
                      % (name, len(got), len(want), at, got[at:at + 6], want[at:at + 6]))
                fails += 1
                continue
            ids = os.path.join(tmp, "ids.json")
            with open(ids, "w") as f:
                json.dump(got, f)
            back = subprocess.run([binary, os.path.join(DATA, "tokenizer.json"), "decode", ids], check=True,
                                  capture_output=True).stdout
            if back != text.encode("utf-8"):
                print("FAIL %s: the C++ decode does not give back the text" % name)
                fails += 1
                continue
            print("ok   %s: %d bytes, %d ids, identical; exact round trip" % (name, len(text.encode("utf-8")), len(got)))
    if fails:
        print("%d of %d texts differ" % (fails, len(texts)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
