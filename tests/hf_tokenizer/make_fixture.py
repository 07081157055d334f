#!/usr/bin/python3
"""Writes tests/data/hf_tokenizer/tokenizer.json, deterministically: a
byte-level BPE trained here on tests/data/hf_tokenizer/train.txt, with
DeepSeek-V3's tokenizer configuration (normalizer, pre-tokenizer, decoder,
added tokens, a TemplateProcessing post-processor that adds the BOS).

    make_fixture.py [--merges N] [--train FILE] [--out FILE]

Training is plain BPE: the text is cut exactly as reference.py encodes it
(added tokens first, then the pre-tokenizer, pieces in the byte-level
alphabet); the distinct pre-tokens are counted; then, N times, the most
frequent adjacent pair (weighted by pre-token counts, ties broken by the
lexicographically smallest (left, right) pair of strings) is merged
everywhere, left to right. Stops early when no pair occurs twice.
The vocab is the 256 byte-level characters in byte order (ids 0..255), then
each merge's result in merge order (when not already present); the added
tokens take the ids after the vocab.
"""
import argparse
import json
import os
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference  # noqa: E402

DATA = os.path.join(HERE, '..', 'data', 'hf_tokenizer')

BOS = '<\uff5cbegin\u2581of\u2581sentence\uff5c>'
EOS = '<\uff5cend\u2581of\u2581sentence\uff5c>'
PAD = '<\uff5c\u2581pad\u2581\uff5c>'

# DeepSeek-V3's pre-tokenizer regexes.
RE_DIGITS = r'\p{N}{1,3}'
RE_CJK = '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+'
RE_MAIN = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"""
           r"""|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
           r"""| ?[\p{P}\p{S}]+[\r\n]*"""
           r"""|\s*[\r\n]+"""
           r"""|\s+(?!\S)"""
           r"""|\s+""")


def split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


NORMALIZER = {"type": "Sequence", "normalizers": []}
PRE_TOKENIZER = {"type": "Sequence", "pretokenizers": [
    split(RE_DIGITS), split(RE_CJK), split(RE_MAIN),
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
]}
DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


def model(vocab, merges):
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": merges}


def added_tokens(first_id):
    return [{"id": first_id + k, "content": c, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
            for k, c in enumerate((BOS, EOS, PAD))]


def post_processor(bos_id):
    bos = {"SpecialToken": {"id": BOS, "type_id": 0}}
    return {"type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [bos_id], "tokens": [BOS]}}}


def tokenizer_json(vocab, merges):
    first = len(vocab)
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": added_tokens(first), "normalizer": NORMALIZER,
            "pre_tokenizer": PRE_TOKENIZER, "post_processor": post_processor(first),
            "decoder": DECODER, "model": model(vocab, merges)}


def byte_vocab():
    return {reference.BYTE_TO_CHAR[b]: b for b in range(256)}


def pre_token_counts(text):
    """The pre-tokens of `text` as encoding sees them (a tokenizer with no merges)."""
    tok = reference.Tokenizer(tokenizer_json(byte_vocab(), []))
    return Counter(p for i, p in tok.pre_tokenize(text) if i is None)


def train(counts, num_merges):
    words = [[list(w), c] for w, c in sorted(counts.items())]
    merges = []
    for _ in range(num_merges):
        pairs = Counter()
        for syms, c in words:
            for k in range(len(syms) - 1):
                pairs[(syms[k], syms[k + 1])] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        a, b = best
        for w in words:
            syms = w[0]
            if len(syms) < 2:
                continue
            out = []
            k = 0
            while k < len(syms):
                if k + 1 < len(syms) and syms[k] == a and syms[k + 1] == b:
                    out.append(a + b)
                    k += 2
                else:
                    out.append(syms[k])
                    k += 1
            w[0] = out
    return merges


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--merges', type=int, default=800)
    ap.add_argument('--train', default=os.path.join(DATA, 'train.txt'))
    ap.add_argument('--out', default=os.path.join(DATA, 'tokenizer.json'))
    args = ap.parse_args()
    with open(args.train, 'rb') as f:
        text = f.read().decode('utf-8')
    merges = train(pre_token_counts(text), args.merges)
    vocab = byte_vocab()
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    doc = tokenizer_json(vocab, [f"{a} {b}" for a, b in merges])
    data = (json.dumps(doc, ensure_ascii=False, indent=2) + '\n').encode('utf-8')
    reference.Tokenizer(json.loads(data))      # it must load
    with open(args.out, 'wb') as f:
        f.write(data)
    print(f"{args.out}: {len(vocab)} vocab, {len(merges)} merges, {len(data)} bytes")


if __name__ == '__main__':
    main()
