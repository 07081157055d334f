"""RUN_DIR/metrics.jsonl: one JSON object per logged step (src/io/log.cpp)."""
import json
import os


class MetricsError(Exception):
    """A line that is not a JSON object: "PATH:LINE: what is wrong (expected ...)"."""


def read(path, missing_ok=False, on_skip=None, numbered=False):
    """The records of metrics.jsonl in file order ((line number, record) pairs when numbered). A last line without its newline
    is still being written: skipped (on_skip(message) is told). Other bad lines
    raise MetricsError; a missing file too, unless missing_ok (then [])."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        if missing_ok and isinstance(e, FileNotFoundError):
            return []
        raise MetricsError(f"{path}: cannot read ({e.strerror}; expected a run directory written by xuanxue)")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == len(lines):  # no newline after it: still being written
                if on_skip:
                    on_skip(f"{path}:{number}: skipping an unfinished last line")
                continue
            raise MetricsError(f"{path}:{number}: not a JSON object (expected one JSON object per line)")
        records.append((number, record) if numbered else record)
    return records


def by_step(records):
    """The records sorted by step (a resumed run appends after earlier lines)."""
    return sorted(records, key=lambda r: r["step"])


def of_run(run_dir, **kw):
    return read(os.path.join(run_dir, "metrics.jsonl"), **kw)
