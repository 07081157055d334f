#!/usr/bin/python3
"""Reads TensorBoard event files written by xuanxue (src/io/tensorboard.cpp)
with code of its own, sharing nothing with the writer: a table-driven
CRC-32C, TFRecord framing and protobuf varints parsed by hand.

usage: tensorboard_read.py [--metrics METRICS_JSONL] [--prefix P]
                           [--min-scalar-events N] [--min-text-events N] EVENTS_FILE [EVENTS_FILE...]

Checks, over the files in the order given (a resumed run has several):
  - every record's length CRC and data CRC (masked CRC-32C);
  - each file starts with an Event whose file_version is "brain.Event:2";
  - every later Event has a step and a Summary of (tag, simple_value) pairs,
    or of text summaries (tag, a DT_STRING tensor, plugin "text": generated
    samples), and every tag starts with P (--prefix);
  - with --min-text-events: at least N text events, each a non-empty text;
  - with --metrics: the scalar events are metrics.jsonl's records one for
    one: same step, and every numeric field but "step" under its tag
    (val_X as val/X, other X as train/X) with value float32(field).
When Python's protobuf module is installed, each Event is also decoded by
it (a message type built at run time) and must agree with our own decoding.
Exit 0 when all holds, 1 on a failed check, 2 when a file cannot be read.
"""
import argparse
import json
import math
import struct
import sys

# ---------------------------------------------------------------------------
# CRC-32C (Castagnoli), reflected polynomial 0x82F63B78, byte-wise table


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283, "the CRC-32C table is wrong"

# ---------------------------------------------------------------------------
# protobuf wire format


class Malformed(Exception):
    pass


def read_varint(buf, at):
    value, shift = 0, 0
    while True:
        if at >= len(buf):
            raise Malformed("varint runs past the end")
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise Malformed("varint longer than 10 bytes")


def fields(buf):
    """(field number, wire type, value) for each field of a message."""
    at = 0
    while at < len(buf):
        key, at = read_varint(buf, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = read_varint(buf, at)
        elif wire == 1:
            value, at = buf[at:at + 8], at + 8
        elif wire == 2:
            n, at = read_varint(buf, at)
            value, at = buf[at:at + n], at + n
        elif wire == 5:
            value, at = buf[at:at + 4], at + 4
        else:
            raise Malformed(f"field {field}: unsupported wire type {wire}")
        if at > len(buf):
            raise Malformed(f"field {field} runs past the end")
        yield field, wire, value


def decode_event(buf):
    """dict: wall_time, step, file_version (or None), values [(tag, float)]."""
    event = {"wall_time": None, "step": 0, "file_version": None, "values": None, "texts": []}
    for field, wire, value in fields(buf):
        if field == 1 and wire == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif field == 2 and wire == 0:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif field == 3 and wire == 2:
            event["file_version"] = value.decode()
        elif field == 5 and wire == 2:
            event["values"], event["texts"] = [], []
            for f, w, v in fields(value):
                if f != 1 or w != 2:
                    raise Malformed(f"Summary field {f} (wire {w}) is not a Value")
                tag, simple, text, plugin = None, None, None, None
                for vf, vw, vv in fields(v):
                    if vf == 1 and vw == 2:
                        tag = vv.decode()
                    elif vf == 2 and vw == 5:
                        simple = struct.unpack("<f", vv)[0]
                    elif vf == 8 and vw == 2:  # TensorProto: dtype 1 (DT_STRING = 7), string_val 8
                        tensor = {tf: tv for tf, tw, tv in fields(vv)}
                        if tensor.get(1) != 7 or 8 not in tensor:
                            raise Malformed(f"a tensor Value that is not a DT_STRING text: {tensor}")
                        text = tensor[8].decode()
                    elif vf == 9 and vw == 2:  # SummaryMetadata.plugin_data.plugin_name
                        for mf, mw, mv in fields(vv):
                            if mf == 1 and mw == 2:
                                plugin = dict((pf, pv) for pf, pw, pv in fields(mv)).get(1, b"").decode()
                if tag is not None and text is not None:
                    if plugin != "text":
                        raise Malformed(f"text Value '{tag}' with plugin {plugin!r} (expected 'text')")
                    event["texts"].append((tag, text))
                    continue
                if tag is None or simple is None:
                    raise Malformed("a Value without tag or simple_value")
                event["values"].append((tag, simple))
        else:
            raise Malformed(f"unexpected Event field {field} (wire {wire})")
    return event


# ---------------------------------------------------------------------------
# the same decoding through the protobuf library, when it is installed


def protobuf_decoder():
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool
        try:
            from google.protobuf import message_factory
            get_class = getattr(message_factory, "GetMessageClass", None)
        except ImportError:
            get_class = None
    except ImportError:
        return None
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="xx_event_check.proto", package="xxcheck")

    def message(name, specs):
        m = proto.message_type.add(name=name)
        for fname, number, ftype, label, type_name in specs:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("PluginData", [("plugin_name", 1, F.TYPE_STRING, opt, None)])
    message("SummaryMetadata", [("plugin_data", 1, F.TYPE_MESSAGE, opt, ".xxcheck.PluginData")])
    message("TensorProto", [("dtype", 1, F.TYPE_INT32, opt, None), ("string_val", 8, F.TYPE_BYTES, rep, None)])
    message("Value", [("tag", 1, F.TYPE_STRING, opt, None), ("simple_value", 2, F.TYPE_FLOAT, opt, None),
                      ("tensor", 8, F.TYPE_MESSAGE, opt, ".xxcheck.TensorProto"),
                      ("metadata", 9, F.TYPE_MESSAGE, opt, ".xxcheck.SummaryMetadata")])
    message("Summary", [("value", 1, F.TYPE_MESSAGE, rep, ".xxcheck.Value")])
    message("Event", [("wall_time", 1, F.TYPE_DOUBLE, opt, None), ("step", 2, F.TYPE_INT64, opt, None),
                      ("file_version", 3, F.TYPE_STRING, opt, None),
                      ("summary", 5, F.TYPE_MESSAGE, opt, ".xxcheck.Summary")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    desc = pool.FindMessageTypeByName("xxcheck.Event")
    if get_class:
        cls = get_class(desc)
    else:
        from google.protobuf import message_factory
        cls = message_factory.MessageFactory(pool).GetPrototype(desc)

    def decode(buf):
        e = cls()
        e.ParseFromString(bytes(buf))
        return {"wall_time": e.wall_time, "step": e.step,
                "file_version": e.file_version if e.HasField("file_version") else None,
                "values": [(v.tag, v.simple_value) for v in e.summary.value if not v.HasField("tensor")]
                if e.HasField("summary") else None,
                "texts": [(v.tag, b"".join(v.tensor.string_val).decode()) for v in e.summary.value
                          if v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "text"]}

    return decode


# ---------------------------------------------------------------------------
# files


def read_records(path):
    """The data of each record; raises Malformed naming the offset."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise FileNotFoundError(f"{path}: cannot read ({e.strerror})")
    records, at = [], 0
    while at < len(blob):
        if at + 12 > len(blob):
            raise Malformed(f"{path}: offset {at}: truncated record header ({len(blob) - at} bytes, expected 12)")
        header = blob[at:at + 8]
        (n,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[at + 8:at + 12])
        if length_crc != masked_crc(header):
            raise Malformed(f"{path}: offset {at}: length CRC {length_crc:#010x}, "
                            f"expected {masked_crc(header):#010x}")
        end = at + 12 + n
        if end + 4 > len(blob):
            raise Malformed(f"{path}: offset {at}: record of {n} bytes runs past the end")
        data = blob[at + 12:end]
        (data_crc,) = struct.unpack("<I", blob[end:end + 4])
        if data_crc != masked_crc(data):
            raise Malformed(f"{path}: offset {at}: data CRC {data_crc:#010x}, expected {masked_crc(data):#010x}")
        records.append((at, data))
        at = end + 4
    return records


def tag_of(key):
    return "val/" + key[4:] if key.startswith("val_") else "train/" + key


def expected_events(metrics_path):
    events = []
    try:
        lines = open(metrics_path).read().splitlines()
    except OSError as e:
        raise FileNotFoundError(f"{metrics_path}: cannot read ({e.strerror})")
    for i, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise Malformed(f"{metrics_path}:{i}: not JSON ({e.msg})")
        values = {tag_of(k): struct.unpack("<f", struct.pack("<f", v))[0] for k, v in record.items()
                  if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        events.append((record["step"], values))
    return events


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--metrics", help="metrics.jsonl whose records the scalar events must equal")
    ap.add_argument("--prefix", default="", help="every tag must start with this")
    ap.add_argument("--min-scalar-events", type=int, default=0)
    ap.add_argument("--min-text-events", type=int, default=0)
    args = ap.parse_args()

    failures = []
    fail = failures.append
    pb_decode = protobuf_decoder()
    scalar_events = []  # (file, offset, step, [(tag, value)])
    text_events = []    # (file, offset, step, [(tag, text)])
    n_records = 0
    try:
        for path in args.files:
            records = read_records(path)
            n_records += len(records)
            for i, (offset, data) in enumerate(records):
                event = decode_event(data)
                where = f"{path}: offset {offset}"
                if pb_decode:
                    other = pb_decode(data)
                    same_values = (event["values"] or []) == (other["values"] or []) and \
                        event["texts"] == other["texts"]
                    if other["step"] != event["step"] or other["file_version"] != event["file_version"] \
                            or not same_values or other["wall_time"] != event["wall_time"]:
                        fail(f"{where}: protobuf decodes {other}, we decode {event}")
                if event["wall_time"] is None or not event["wall_time"] > 1e9:
                    fail(f"{where}: wall_time {event['wall_time']} (expected seconds since 1970)")
                if i == 0:
                    if event["file_version"] != "brain.Event:2" or event["values"] is not None:
                        fail(f"{where}: first event is {event} (expected file_version 'brain.Event:2')")
                    continue
                if event["values"] is None or event["file_version"] is not None:
                    fail(f"{where}: event {event} (expected a step and a summary)")
                    continue
                for tag, _ in event["values"] + event["texts"]:
                    if not tag.startswith(args.prefix):
                        fail(f"{where}: tag '{tag}' (expected it to start with '{args.prefix}')")
                if event["texts"]:
                    if event["values"]:
                        fail(f"{where}: an event with both scalars and texts (expected one kind per event)")
                    for tag, text in event["texts"]:
                        if not text:
                            fail(f"{where}: text '{tag}' is empty")
                    text_events.append((path, offset, event["step"], event["texts"]))
                    continue
                scalar_events.append((path, offset, event["step"], event["values"]))
            if not records:
                fail(f"{path}: no records (expected the file_version event)")
        expected = expected_events(args.metrics) if args.metrics else None
    except FileNotFoundError as e:
        print(f"tensorboard_read: {e}", file=sys.stderr)
        return 2
    except Malformed as e:
        print(f"tensorboard_read: FAIL: {e}", file=sys.stderr)
        return 1

    if len(text_events) < args.min_text_events:
        fail(f"{len(text_events)} text events (expected at least {args.min_text_events})")
    if len(scalar_events) < args.min_scalar_events:
        fail(f"{len(scalar_events)} scalar events (expected at least {args.min_scalar_events})")
    n_values = sum(len(v) for *_, v in scalar_events)
    if expected is not None:
        if len(expected) != len(scalar_events):
            fail(f"{len(scalar_events)} scalar events but {len(expected)} records in {args.metrics}")
        for (path, offset, step, values), (want_step, want) in zip(scalar_events, expected):
            where = f"{path}: offset {offset}"
            if step != want_step:
                fail(f"{where}: step {step} (expected {want_step} from {args.metrics})")
            got = dict(values)
            if len(got) != len(values):
                fail(f"{where}: a tag appears twice")
            if sorted(got) != sorted(want):
                fail(f"{where}: step {step}: tags {sorted(got)} (expected {sorted(want)})")
            for tag, v in want.items():
                if tag in got and not (got[tag] == v or (math.isnan(v) and math.isnan(got[tag]))):
                    fail(f"{where}: step {step}: {tag} = {got[tag]!r} (expected float32 {v!r})")
    for f in failures:
        print(f"tensorboard_read: FAIL: {f}", file=sys.stderr)
    checked = "protobuf agrees" if pb_decode else "protobuf module absent: own decoder only"
    print(f"tensorboard_read: {len(args.files)} file(s), {n_records} records, {len(scalar_events)} scalar events, "
          f"{len(text_events)} text events, "
          f"{n_values} values; {checked}" + (f"; compared with {args.metrics}" if expected is not None else "")
          + (f": FAILED ({len(failures)})" if failures else ": OK"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
