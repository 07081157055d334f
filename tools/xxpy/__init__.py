"""The Python shared by the commands in tools/ and tools/lab/: one place each for
the deck's resolved values (deck), metrics.jsonl (metrics), the environment a
rank runs in (launch), the token-shard format (shard) and files written whole
or not at all (fs). A command puts tools/ on sys.path, then `from xxpy import ...`."""
import os

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TOOLS)
