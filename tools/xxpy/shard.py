"""The token-shard format (docs/DATA.md; read by src/data/corpus.cpp): a 64-byte
header, then `count` little-endian tokens of `token_bytes` bytes each."""
import array
import sys
import struct

MAGIC = b"XXTOKENS"
VERSION = 2
# magic, version, token_bytes, count, vocab, reserved, tokenizer_hash, text_bytes, reserved
HEADER = struct.Struct("<8sIIQIIQQ16s")
assert HEADER.size == 64
MAX_VOCAB = 65536  # 2-byte tokens


def fnv1a64(data):
    """FNV-1a, 64 bits: offset basis 0xcbf29ce484222325, prime 0x100000001b3."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def tokenizer_hash(model_bytes):
    """The header's tokenizer_hash of a tokenizer.model file: 0 means "no
    tokenizer" (bytes), so a hash that comes out 0 is stored as 1."""
    return fnv1a64(model_bytes) or 1


def header(count, vocab, token_bytes, tok_hash=0, text_bytes=0):
    """A version-2 header: count >= 1 tokens, each < vocab, of token_bytes (2
    or 4) bytes; tok_hash 0 for bytes; text_bytes the UTF-8 bytes the tokens
    decode to (0: unknown)."""
    assert count >= 1 and token_bytes in (2, 4) and 1 <= vocab <= (1 << (8 * token_bytes))
    return HEADER.pack(MAGIC, VERSION, token_bytes, count, vocab, 0, tok_hash, text_bytes, bytes(16))


def token_array(token_bytes):
    """An empty array of unsigned tokens of token_bytes bytes."""
    code = {2: "H", 4: "I"}[token_bytes]
    assert array.array(code).itemsize == token_bytes
    return array.array(code)


def little_endian(tokens):
    """The tokens' bytes, little-endian whatever the machine."""
    if sys.byteorder != "little":
        tokens = array.array(tokens.typecode, tokens)
        tokens.byteswap()
    return tokens.tobytes()
