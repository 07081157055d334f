#!/usr/bin/python3
"""Independent reference reader of Hugging Face tokenizer.json byte-level BPE
tokenizers (GPT-2 / Llama 3 / Qwen / DeepSeek-V3 kind), written from the
format's documented semantics, standard library only. src/data/hf_tokenizer.h
is checked against it byte for byte.

    reference.py TOKENIZER_JSON encode TEXT_FILE      -> ids as one JSON list
    reference.py TOKENIZER_JSON decode IDS_JSON_FILE  -> decoded UTF-8 bytes

    import reference; tok = reference.load(path)
    tok.encode(str) -> list[int];  tok.decode(list[int]) -> str

Encoding is "add_special_tokens=False": the post_processor (TemplateProcessing
etc.) is read past and never applied, so no BOS/EOS is added.

The pipeline, in HF's order:
  1. added tokens are cut out of the raw text: first those with
     normalized=false, then (in the pieces left, after the normalizer, which
     here is always the identity) those with normalized=true; each pass scans
     left to right, the leftmost occurrence first, the longest content at one
     position, non-overlapping; lstrip / rstrip / single_word as in HF.
  2. every remaining piece goes through the pre_tokenizer (Split, ByteLevel,
     Digits, Sequence of them); empty pieces are dropped.
  3. every pre-token goes through the BPE model (lowest merge rank first,
     leftmost among equal ranks).
Regexes are Oniguruma-syntax patterns translated to Python `re`, with every
Unicode class (\\p{..}, \\s, \\d, \\w and complements) spelled out as explicit
code point ranges from unicodedata (see translate_regex).
"""
import heapq
import json
import re
import sys
import unicodedata

# --------------------------------------------------------------------------
# Unicode sets as sorted lists of inclusive (lo, hi) code point ranges.

MAX_CP = 0x10FFFF

# The White_Space property (PropList.txt); Oniguruma's and PCRE2-UCP's \s.
# Not Python's \s, which also has U+001C..U+001F.
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0),
               (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
               (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]

_cat_ranges = None


def category_ranges():
    """General category (two letters) -> ranges, over 0..0x10FFFF, computed once."""
    global _cat_ranges
    if _cat_ranges is None:
        table = {}
        cat = unicodedata.category
        prev = cat('\0')
        start = 0
        for cp in range(1, MAX_CP + 1):
            c = cat(chr(cp))
            if c != prev:
                table.setdefault(prev, []).append((start, cp - 1))
                prev, start = c, cp
        table.setdefault(prev, []).append((start, MAX_CP))
        _cat_ranges = table
    return _cat_ranges


def union(*sets):
    rs = sorted(r for s in sets for r in s)
    out = []
    for lo, hi in rs:
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def complement(s):
    out = []
    nxt = 0
    for lo, hi in union(s):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CP:
        out.append((nxt, MAX_CP))
    return out


def in_ranges(cp, s):
    lo, hi = 0, len(s)
    while lo < hi:
        mid = (lo + hi) // 2
        if s[mid][1] < cp:
            lo = mid + 1
        else:
            hi = mid
    return lo < len(s) and s[lo][0] <= cp


def categories(*names):
    """Union of general categories; a one-letter name is its whole major class."""
    table = category_ranges()
    sets = []
    for n in names:
        sets.extend(table[c] for c in table if c == n or (len(n) == 1 and c[0] == n))
    return union(*sets)


_LONG_NAMES = {
    'letter': 'L', 'casedletter': 'LC', 'uppercaseletter': 'Lu', 'lowercaseletter': 'Ll',
    'titlecaseletter': 'Lt', 'modifierletter': 'Lm', 'otherletter': 'Lo',
    'mark': 'M', 'combiningmark': 'M', 'nonspacingmark': 'Mn', 'spacingmark': 'Mc',
    'enclosingmark': 'Me', 'number': 'N', 'decimalnumber': 'Nd', 'letternumber': 'Nl',
    'othernumber': 'No', 'punctuation': 'P', 'connectorpunctuation': 'Pc',
    'dashpunctuation': 'Pd', 'openpunctuation': 'Ps', 'closepunctuation': 'Pe',
    'initialpunctuation': 'Pi', 'finalpunctuation': 'Pf', 'otherpunctuation': 'Po',
    'symbol': 'S', 'mathsymbol': 'Sm', 'currencysymbol': 'Sc', 'modifiersymbol': 'Sk',
    'othersymbol': 'So', 'separator': 'Z', 'spaceseparator': 'Zs', 'lineseparator': 'Zl',
    'paragraphseparator': 'Zp', 'other': 'C', 'control': 'Cc', 'format': 'Cf',
    'surrogate': 'Cs', 'privateuse': 'Co', 'unassigned': 'Cn',
}


def property_ranges(name):
    """\\p{name}: a general category, short or long name, loosely matched
    (case, spaces, '_' and '-' ignored, as Oniguruma does); also Any,
    Assigned, White_Space/Space. Scripts and other properties: ValueError."""
    key = name.replace(' ', '').replace('_', '').replace('-', '').lower()
    table = category_ranges()
    short = {c.lower(): c for c in table}
    short.update({c[0].lower(): c[0] for c in table})
    if key in ('lc', 'l&'):
        return categories('Lu', 'Ll', 'Lt')
    if key in short:
        return categories(short[key])
    if key in _LONG_NAMES:
        v = _LONG_NAMES[key]
        return categories('Lu', 'Ll', 'Lt') if v == 'LC' else categories(v)
    if key == 'any':
        return [(0, MAX_CP)]
    if key == 'assigned':
        return complement(categories('Cn'))
    if key in ('whitespace', 'space'):
        return list(WHITE_SPACE)
    raise ValueError(f"regex: unsupported Unicode property \\p{{{name}}}")


def escape_class(escape):
    """The ranges of \\s \\S \\d \\D \\w \\W (Oniguruma's Unicode meanings)."""
    lower = escape.lower()
    if lower == 's':
        s = list(WHITE_SPACE)
    elif lower == 'd':
        s = categories('Nd')
    else:  # w: Letter | Mark | Number | Connector_Punctuation
        s = categories('L', 'M', 'N', 'Pc')
    return complement(s) if escape.isupper() else s


def _esc(cp):
    return '\\U%08x' % cp


def _class_body(ranges):
    return ''.join(_esc(lo) if lo == hi else _esc(lo) + '-' + _esc(hi) for lo, hi in ranges)


def translate_regex(pattern):
    """An Oniguruma (Ruby syntax) pattern, as HF's Split and ByteLevel use,
    to an equivalent Python `re` pattern (compiled with re.MULTILINE, since
    Oniguruma's ^ and $ are line anchors). Unicode classes become explicit
    range lists, inside or outside brackets. Refuses (ValueError) what has no
    faithful translation: nested sets and && in brackets, \\b \\B (Python's
    word boundary is not Oniguruma's), \\h \\H \\R \\X \\K \\G \\k \\g, scripts."""
    out = []
    i = 0
    n = len(pattern)
    in_class = False
    class_items = 0     # items emitted since the current '[' (or '[^')
    last_was_set = False

    def emit_set(ranges):
        nonlocal class_items, last_was_set
        if in_class:
            if out and out[-1] == '-' and class_items >= 2:
                raise ValueError(f"regex: a range ending in a class escape in {pattern!r}")
            out.append(_class_body(ranges))
            class_items += 1
            last_was_set = True
        else:
            out.append('[' + _class_body(ranges) + ']' if ranges else '(?!)')

    while i < n:
        c = pattern[i]
        if c == '\\':
            if i + 1 >= n:
                raise ValueError(f"regex: trailing backslash in {pattern!r}")
            e = pattern[i + 1]
            if e in 'pP':
                if i + 2 < n and pattern[i + 2] == '{':
                    j = pattern.find('}', i + 3)
                    if j < 0:
                        raise ValueError(f"regex: unterminated \\{e}{{ in {pattern!r}")
                    name = pattern[i + 3:j]
                    i = j + 1
                elif i + 2 < n:
                    name = pattern[i + 2]
                    i += 3
                else:
                    raise ValueError(f"regex: bad \\{e} in {pattern!r}")
                negate = e == 'P'
                if name.startswith('^'):
                    negate = not negate
                    name = name[1:]
                ranges = property_ranges(name)
                emit_set(complement(ranges) if negate else ranges)
                continue
            if e in 'sSdDwW':
                emit_set(escape_class(e))
                i += 2
                continue
            if e == 'x' and i + 2 < n and pattern[i + 2] == '{':
                j = pattern.find('}', i + 3)
                if j < 0:
                    raise ValueError(f"regex: unterminated \\x{{ in {pattern!r}")
                cp = int(pattern[i + 3:j], 16)
                out.append(_esc(cp))
                i = j + 1
                class_items += in_class
                last_was_set = False
                continue
            if e in 'bBhHRXKGkg':
                raise ValueError(f"regex: unsupported escape \\{e} in {pattern!r}")
            if e == 'z':
                out.append('\\Z')
            elif e == 'Z':
                out.append('(?=\\n?\\Z)')
            elif e == 'e':
                out.append('\\x1b')
            else:
                out.append(pattern[i:i + 2])
            i += 2
            class_items += in_class
            last_was_set = False
            continue
        if in_class:
            if c == ']' and class_items > 0:
                in_class = False
                out.append(']')
            elif c == ']':          # ']' first in a set is literal
                out.append('\\]')
                class_items += 1
            elif c == '[':
                raise ValueError(f"regex: nested character class in {pattern!r}")
            elif c == '&' and pattern[i + 1:i + 2] == '&':
                raise ValueError(f"regex: class intersection && in {pattern!r}")
            elif c == '-' and last_was_set and pattern[i + 1:i + 2] != ']':
                out.append('\\-')   # '-' after a class escape is a literal
                class_items += 1
            else:
                out.append(c)
                class_items += 1
            last_was_set = False
            i += 1
            continue
        if c == '[':
            in_class = True
            class_items = 0
            last_was_set = False
            if pattern[i + 1:i + 2] == '^':
                out.append('[^')
                i += 2
            else:
                out.append('[')
                i += 1
            continue
        if c == '(' and pattern.startswith('(?<', i) and pattern[i + 3:i + 4] not in ('=', '!'):
            out.append('(?P<')
            i += 3
            continue
        out.append(c)
        i += 1
    if in_class:
        raise ValueError(f"regex: unterminated character class in {pattern!r}")
    return ''.join(out)


def compile_regex(pattern):
    try:
        return re.compile(translate_regex(pattern), re.MULTILINE)
    except re.error as e:
        raise ValueError(f"regex: cannot compile {pattern!r}: {e}") from None


# --------------------------------------------------------------------------
# Matching and splitting (HF's Pattern / SplitDelimiterBehavior).

def regex_find_iter(rx, text):
    """Oniguruma's find_iter as HF uses it: search from the end of the last
    match; an empty match right at the end of the previous match is refused
    and the search moves on by one character."""
    last_end = 0
    last_match_end = None
    while last_end <= len(text):
        m = rx.search(text, last_end)
        if m is None:
            return
        s, e = m.span()
        if s == e and last_match_end == e:
            last_end += 1
            continue
        last_end = e
        last_match_end = e
        yield s, e


def regex_matches(rx, text):
    """(start, end, is_match) spans covering `text`."""
    if not text:
        return [(0, 0, False)]
    spans = []
    prev = 0
    for s, e in regex_find_iter(rx, text):
        if prev != s:
            spans.append((prev, s, False))
        spans.append((s, e, True))
        prev = e
    if prev != len(text):
        spans.append((prev, len(text), False))
    return spans


def char_matches(pred, text):
    """A per-character predicate as a pattern: every matching char is one match."""
    if not text:
        return [(0, 0, False)]
    spans = []
    last = 0
    for k, ch in enumerate(text):
        if pred(ch):
            if last < k:
                spans.append((last, k, False))
            spans.append((k, k + 1, True))
            last = k + 1
    if last < len(text):
        spans.append((last, len(text), False))
    return spans


BEHAVIORS = ('Removed', 'Isolated', 'MergedWithPrevious', 'MergedWithNext', 'Contiguous')


def apply_behavior(spans, behavior):
    """spans: (start, end, is_match); returns the kept (start, end), empty ones included."""
    if behavior == 'Isolated':
        return [(s, e) for s, e, _ in spans]
    if behavior == 'Removed':
        return [(s, e) for s, e, m in spans if not m]
    acc = []
    prev_match = False
    if behavior == 'Contiguous':
        for s, e, m in spans:
            if m == prev_match and acc:
                acc[-1] = (acc[-1][0], e)
            else:
                acc.append((s, e))
            prev_match = m
        return acc
    if behavior == 'MergedWithPrevious':
        for s, e, m in spans:
            if m and not prev_match and acc:
                acc[-1] = (acc[-1][0], e)
            else:
                acc.append((s, e))
            prev_match = m
        return acc
    if behavior == 'MergedWithNext':
        for s, e, m in reversed(spans):
            if m and not prev_match and acc:
                acc[-1] = (s, acc[-1][1])
            else:
                acc.append((s, e))
            prev_match = m
        acc.reverse()
        return acc
    raise ValueError(f"Split: unknown behavior {behavior!r}")


def split_text(text, spans, behavior, invert=False):
    if invert:
        spans = [(s, e, not m) for s, e, m in spans]
    return [text[s:e] for s, e in apply_behavior(spans, behavior) if e > s]


# --------------------------------------------------------------------------
# Byte-level alphabet (GPT-2's bytes_to_unicode).

def _byte_alphabet():
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table = {}
    extra = 256
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(extra)
            extra += 1
    return table


BYTE_TO_CHAR = _byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_level_map(piece):
    return ''.join(BYTE_TO_CHAR[b] for b in piece.encode('utf-8'))


# --------------------------------------------------------------------------
# Pre-tokenizers: each is a function str -> list of non-empty str.

def _is_numeric(ch):
    return unicodedata.category(ch) in ('Nd', 'Nl', 'No')   # Rust char::is_numeric


def build_pre_tokenizer(cfg):
    if cfg is None:
        return lambda s: [s]
    typ = cfg.get('type')
    if typ == 'Sequence':
        steps = [build_pre_tokenizer(c) for c in cfg.get('pretokenizers', [])]

        def seq(s):
            pieces = [s]
            for step in steps:
                pieces = [q for p in pieces for q in step(p)]
            return pieces
        return seq
    if typ == 'Split':
        pat = cfg.get('pattern')
        if not isinstance(pat, dict) or len(pat) != 1:
            raise ValueError(f"Split: bad pattern {pat!r}")
        if 'Regex' in pat:
            rx = compile_regex(pat['Regex'])
        elif 'String' in pat:
            rx = re.compile(re.escape(pat['String']))
        else:
            raise ValueError(f"Split: unknown pattern kind {list(pat)[0]!r}")
        behavior = cfg.get('behavior')
        if behavior not in BEHAVIORS:
            raise ValueError(f"Split: unknown behavior {behavior!r}")
        invert = bool(cfg.get('invert', False))
        return lambda s: split_text(s, regex_matches(rx, s), behavior, invert)
    if typ == 'ByteLevel':
        add_prefix_space = cfg.get('add_prefix_space', True)
        use_regex = cfg.get('use_regex', True)
        rx = compile_regex(GPT2_PATTERN) if use_regex else None

        def byte_level(s):
            # HF prepends the space to every piece that reaches ByteLevel
            # (each split left by the added tokens and the earlier steps).
            if add_prefix_space and not s.startswith(' '):
                s = ' ' + s
            pieces = split_text(s, regex_matches(rx, s), 'Isolated') if use_regex else [s]
            return [byte_level_map(p) for p in pieces if p]
        return byte_level
    if typ == 'Digits':
        behavior = 'Isolated' if cfg.get('individual_digits', False) else 'Contiguous'
        return lambda s: split_text(s, char_matches(_is_numeric, s), behavior)
    raise ValueError(f"unsupported pre_tokenizer type {typ!r}")


def check_normalizer(cfg):
    if cfg is None:
        return
    typ = cfg.get('type')
    if typ == 'Sequence':
        for sub in cfg.get('normalizers', []):
            check_normalizer(sub)
        return
    raise ValueError(f"unsupported normalizer type {typ!r}")


# --------------------------------------------------------------------------
# Added tokens.

_WORD = None


def _word_ranges():
    """Rust regex's Unicode \\w (HF's single_word test): Alphabetic | M | Nd |
    Pc | Join_Control. Alphabetic = L | Nl | Other_Alphabetic; the
    Other_Alphabetic code points outside M are the circled/squared Latin
    letters listed here (So)."""
    global _WORD
    if _WORD is None:
        _WORD = union(categories('L', 'Nl', 'M', 'Nd', 'Pc'),
                      [(0x200C, 0x200D), (0x24B6, 0x24E9), (0x1F130, 0x1F149),
                       (0x1F150, 0x1F169), (0x1F170, 0x1F189)])
    return _WORD


def _is_white(ch):
    return in_ranges(ord(ch), WHITE_SPACE)


class AddedToken:
    def __init__(self, d):
        self.id = d['id']
        self.content = d['content']
        if not isinstance(self.id, int) or not isinstance(self.content, str) or not self.content:
            raise ValueError(f"added_tokens: bad entry {d!r}")
        self.special = bool(d.get('special', False))
        self.lstrip = bool(d.get('lstrip', False))
        self.rstrip = bool(d.get('rstrip', False))
        self.single_word = bool(d.get('single_word', False))
        self.normalized = bool(d.get('normalized', True))


class AddedMatcher:
    """One pass of HF's added-token extraction over a set of tokens."""

    def __init__(self, tokens):
        self.by_content = {}
        for t in tokens:
            self.by_content.setdefault(t.content, t)   # the first of equal contents wins
        # Alternatives longest first: at the leftmost position the longest
        # content matches; finditer continues after each match's end.
        contents = sorted(self.by_content, key=lambda c: (-len(c), c))
        self.rx = re.compile('|'.join(re.escape(c) for c in contents)) if contents else None

    def split(self, text):
        """-> list of (id or None, text) covering `text` (HF's find_matches)."""
        if self.rx is None or not text:
            return [(None, text)]
        pieces = []
        start_offset = 0
        for m in self.rx.finditer(text):
            start, stop = m.span()
            tok = self.by_content[m.group()]
            if tok.single_word:
                word = _word_ranges()
                before_word = start > 0 and in_ranges(ord(text[start - 1]), word)
                after_word = stop < len(text) and in_ranges(ord(text[stop]), word)
                if before_word or after_word:
                    continue        # not a single word: this occurrence is text
            if tok.lstrip:
                k = start
                while k > 0 and _is_white(text[k - 1]):
                    k -= 1
                start = max(k, start_offset)
            if tok.rstrip:
                while stop < len(text) and _is_white(text[stop]):
                    stop += 1
            if start_offset < start:
                pieces.append((None, text[start_offset:start]))
            pieces.append((tok.id, text[start:stop]))
            start_offset = stop
        if start_offset != len(text):
            pieces.append((None, text[start_offset:]))
        return pieces


# --------------------------------------------------------------------------
# BPE model.

class BPE:
    def __init__(self, cfg):
        typ = cfg.get('type', 'BPE')
        if typ != 'BPE':
            raise ValueError(f"unsupported model type {typ!r}")
        if cfg.get('dropout') is not None:
            raise ValueError("model: dropout must be null")
        if cfg.get('byte_fallback', False):
            raise ValueError("model: byte_fallback must be false")
        for field in ('continuing_subword_prefix', 'end_of_word_suffix'):
            if cfg.get(field) not in (None, ''):
                raise ValueError(f"model: {field} must be null or empty")
        self.vocab = cfg['vocab']
        self.vocab_r = {}
        for tok, i in self.vocab.items():
            if i in self.vocab_r:
                raise ValueError(f"model: id {i} given to two tokens")
            self.vocab_r[i] = tok
        self.unk_token = cfg.get('unk_token')
        self.fuse_unk = bool(cfg.get('fuse_unk', False))
        self.ignore_merges = bool(cfg.get('ignore_merges', False))
        self.merges = {}        # (left id, right id) -> (rank, new id); a repeated pair: the last wins
        rank = 0
        for m in cfg['merges']:
            if isinstance(m, str):
                if m.startswith('#version'):
                    continue
                parts = m.split(' ')
            else:
                parts = list(m)
            if len(parts) != 2:
                raise ValueError(f"model: bad merge {m!r}")
            a, b = parts
            for t in (a, b, a + b):
                if t not in self.vocab:
                    raise ValueError(f"model: merge {m!r} uses {t!r}, not in the vocab")
            self.merges[(self.vocab[a], self.vocab[b])] = (rank, self.vocab[a + b])
            rank += 1
        self.cache = {}

    def tokenize(self, word):
        """One pre-token -> ids."""
        if not word:
            return []
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        hit = self.cache.get(word)
        if hit is None:
            hit = self.cache[word] = self._merge_word(word)
        return list(hit)

    def _merge_word(self, word):
        syms = []
        unk = None      # a pending unknown symbol (fused while fuse_unk)
        for ch in word:
            i = self.vocab.get(ch)
            if i is not None:
                if unk is not None:
                    syms.append(unk)
                    unk = None
                syms.append(i)
                continue
            if self.unk_token is None:
                raise ValueError(f"model: {ch!r} (U+{ord(ch):04X}) is not in the vocab and unk_token is null")
            if self.unk_token not in self.vocab:
                raise ValueError(f"model: unk_token {self.unk_token!r} is not in the vocab")
            if unk is not None and not self.fuse_unk:
                syms.append(unk)
            unk = self.vocab[self.unk_token]
        if unk is not None:
            syms.append(unk)
        # Lowest rank first, leftmost among equal ranks: a heap of candidate
        # pairs keyed (rank, position of the left symbol), stale ones skipped.
        n = len(syms)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        alive = [True] * n
        heap = []
        for p in range(n - 1):
            r = self.merges.get((syms[p], syms[p + 1]))
            if r is not None:
                heap.append((r[0], p, syms[p], syms[p + 1]))
        heapq.heapify(heap)
        while heap:
            rank, p, a, b = heapq.heappop(heap)
            q = nxt[p] if alive[p] else -1
            if q < 0 or syms[p] != a or syms[q] != b:
                continue
            syms[p] = self.merges[(a, b)][1]
            alive[q] = False
            nxt[p] = nxt[q]
            if nxt[q] >= 0:
                prv[nxt[q]] = p
            if prv[p] >= 0:
                r = self.merges.get((syms[prv[p]], syms[p]))
                if r is not None:
                    heapq.heappush(heap, (r[0], prv[p], syms[prv[p]], syms[p]))
            if nxt[p] >= 0:
                r = self.merges.get((syms[p], syms[nxt[p]]))
                if r is not None:
                    heapq.heappush(heap, (r[0], p, syms[p], syms[nxt[p]]))
        return tuple(syms[p] for p in range(n) if alive[p])


# --------------------------------------------------------------------------

class Tokenizer:
    def __init__(self, cfg):
        check_normalizer(cfg.get('normalizer'))
        dec = cfg.get('decoder')
        if dec is not None and dec.get('type') != 'ByteLevel':
            raise ValueError(f"unsupported decoder type {dec.get('type')!r}")
        self.byte_level_decoder = dec is not None
        # post_processor: ignored, we encode without special tokens.
        self.model = BPE(cfg['model'])
        self.pre_tokenizer = build_pre_tokenizer(cfg.get('pre_tokenizer'))
        self.added = [AddedToken(d) for d in cfg.get('added_tokens') or []]
        self.added_by_id = {}
        for t in self.added:
            self.added_by_id.setdefault(t.id, t)
        self.pass_raw = AddedMatcher([t for t in self.added if not t.normalized])
        self.pass_normalized = AddedMatcher([t for t in self.added if t.normalized])

    def split_added(self, text):
        """-> list of (id or None, str), empty text pieces dropped."""
        out = []
        for i, piece in self.pass_raw.split(text):
            if i is not None:
                out.append((i, piece))
                continue
            # (the normalizer, the identity, would run here)
            out.extend(p for p in self.pass_normalized.split(piece) if p[0] is not None or p[1])
        return [p for p in out if p[0] is not None or p[1]]

    def pre_tokenize(self, text):
        """-> list of (id, added content) or (None, pre-token as the model sees it)."""
        out = []
        for i, piece in self.split_added(text):
            if i is not None:
                out.append((i, piece))
            else:
                out.extend((None, p) for p in self.pre_tokenizer(piece) if p)
        return out

    def encode(self, text):
        ids = []
        for i, piece in self.pre_tokenize(text):
            if i is not None:
                ids.append(i)
            else:
                ids.extend(self.model.tokenize(piece))
        return ids

    def id_to_token(self, i):
        if i in self.added_by_id:
            return self.added_by_id[i].content
        if i in self.model.vocab_r:
            return self.model.vocab_r[i]
        raise ValueError(f"decode: unknown id {i}")

    def tokens(self, text):
        return [self.id_to_token(i) for i in self.encode(text)]

    def decode(self, ids):
        toks = [self.id_to_token(i) for i in ids]
        if not self.byte_level_decoder:
            return ' '.join(toks)          # HF without a decoder
        buf = bytearray()
        for t in toks:
            # A token made only of byte-level characters is mapped back to
            # bytes; any other (an added token like <｜end▁of▁sentence｜>) is
            # taken as its own UTF-8.
            if all(c in CHAR_TO_BYTE for c in t):
                buf.extend(CHAR_TO_BYTE[c] for c in t)
            else:
                buf.extend(t.encode('utf-8'))
        return bytes(buf).decode('utf-8', 'replace')


def load(path):
    with open(path, 'rb') as f:
        return Tokenizer(json.loads(f.read().decode('utf-8')))


def main(argv):
    if len(argv) != 4 or argv[2] not in ('encode', 'decode'):
        sys.stderr.write("usage: reference.py TOKENIZER_JSON encode TEXT_FILE\n"
                         "       reference.py TOKENIZER_JSON decode IDS_JSON_FILE\n")
        return 2
    tok = load(argv[1])
    with open(argv[3], 'rb') as f:
        data = f.read()
    if argv[2] == 'encode':
        ids = tok.encode(data.decode('utf-8'))
        sys.stdout.write(json.dumps(ids, separators=(',', ':')) + '\n')
    else:
        ids = json.loads(data.decode('utf-8'))
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            sys.stderr.write("decode: IDS_JSON_FILE must hold one JSON list of integers\n")
            return 2
        sys.stdout.buffer.write(tok.decode(ids).encode('utf-8'))
        sys.stdout.flush()
    return 0


if __name__ == '__main__':
    try:
        sys.exit(main(sys.argv))
    except ValueError as e:
        sys.stderr.write(f"reference.py: {e}\n")
        sys.exit(1)
