#!/usr/bin/env python3
"""Checks the committed SmolLM2 prompt sets (configs/smollm2/{train,heldout}-prompts.jsonl, and
train-prompts-xl.jsonl.gz, the XL training set).

Test oracle (not product code), run by ctest. Checks counts, the source mix, that the held-out set
shares no source item with the training set, valid UTF-8, prompt lengths, no duplicate prompts, the
file sizes, and that every line is a chat record that dflash's reader (common/data/records.cc) keeps
and that `dflashctl regen` can use: the reader's rules are re-implemented here in Python (a JSON
object; `messages` a non-empty list of objects; `role` one of the accepted OpenAI roles; `content` a
string; at least one assistant turn), plus regen's (a message before the first assistant turn).

The XL set (gzip of JSONL, made by make_prompts.py --xl) is checked record by record in the same
way, and for: at least MIN_XL records, a deterministic gzip header (mtime 0, no file name), at
most MAX_XL_BYTES compressed, no duplicate prompts, and no source item and no prompt (compared
case-insensitively with whitespace collapsed) of the held-out file. Only the standard library.

Usage: check_prompt_files.py [--self-test] [--xl] DIR
           check DIR/train-prompts.jsonl and DIR/heldout-prompts.jsonl, and
           DIR/train-prompts-xl.jsonl.gz when it is there (--xl: it must be there).
           --self-test: also corrupt copies of the files in memory in several ways and require
           that each corruption is reported (so that the checks themselves can fail).
"""
import gzip
import io
import json
import os
import re
import struct
import sys
import zlib

MIN_TRAIN, MIN_HELDOUT = 2400, 240
MIN_WORDS, MAX_WORDS = 20, 350
MAX_BYTES = 2 * 1024 * 1024
MIN_XL, MAX_XL_BYTES = 20_000, 8 * 1024 * 1024
XL_FILE = "train-prompts-xl.jsonl.gz"
NL = b"\n"
OPENAI_ROLES = {"system", "user", "assistant", "tool", "developer"}
SOURCE = re.compile(r"^(python|debian-doc|man|license|debian-pkg|pypi:[A-Za-z0-9._-]+):\S.*$")


def check_line(where, raw):
    """Errors of one line (bytes, without its newline); returns (errors, record or None)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return [f"{where}: invalid UTF-8 at byte {e.start}"], None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        return [f"{where}: not valid JSON: {e}"], None
    if not isinstance(rec, dict):
        return [f"{where}: not a JSON object"], None
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return [f"{where}: messages: missing, not a list or empty"], None
    errors = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in OPENAI_ROLES:
            errors.append(f"{where}: messages[{i}]: not an object with an accepted role")
        elif not isinstance(m.get("content"), str):
            errors.append(f"{where}: messages[{i}].content: not a string")
    if errors:
        return errors, None
    roles = [m["role"] for m in msgs]
    if roles != ["user"]:
        errors.append(f"{where}: roles {roles}, want [user] (a prompt; regen writes the answer)")
    if not isinstance(rec.get("source"), str) or not SOURCE.match(rec["source"]):
        errors.append(f"{where}: source: missing or not "
                      "'python|debian-doc|man|license|debian-pkg|pypi:DIST:...'")
    if errors:
        return errors, None
    prompt = msgs[0]["content"]
    n = len(prompt.split())
    if not MIN_WORDS <= n <= MAX_WORDS:
        errors.append(f"{where}: the prompt has {n} words (want {MIN_WORDS}..{MAX_WORDS})")
    if any(c < " " and c != "\n" for c in prompt) or prompt != prompt.strip():
        errors.append(f"{where}: the prompt has control characters or surrounding spaces")
    if re.search(r" at 0x[0-9a-fA-F]{6,}", prompt):
        errors.append(f"{where}: the prompt shows a memory address (differs from run to run)")
    letters = [c for c in prompt if c.isalpha()]
    if sum(c.isascii() for c in letters) < 0.95 * len(letters):
        errors.append(f"{where}: the prompt is mostly not ASCII letters (not English?)")
    return errors, rec


def check_file(name, data, min_count, max_bytes=MAX_BYTES, python_share=True):
    """(errors, [(source, prompt)]) of one file's bytes."""
    errors, items = [], []
    if max_bytes is not None and len(data) > max_bytes:
        errors.append(f"{name}: {len(data)} bytes, more than {MAX_BYTES}")
    if not data.endswith(b"\n"):
        errors.append(f"{name}: does not end with a newline")
    for i, raw in enumerate(data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")):
        line_errors, rec = check_line(f"{name}:{i + 1}", raw)
        errors += line_errors
        if rec is not None:
            items.append((rec["source"], rec["messages"][0]["content"]))
    if len(items) < min_count:
        errors.append(f"{name}: {len(items)} usable records, want at least {min_count}")
    python = sum(s.startswith("python:") for s, _ in items)
    if python_share and items and not 0.35 <= python / len(items) <= 0.65:
        errors.append(f"{name}: {python} of {len(items)} prompts from Python, want 35%..65%")
    return errors, items


def check(files):
    """files: {"train": bytes, "heldout": bytes}; returns the list of errors."""
    errors, seen = [], {}
    train_errors, train = check_file("train-prompts.jsonl", files["train"], MIN_TRAIN)
    held_errors, held = check_file("heldout-prompts.jsonl", files["heldout"], MIN_HELDOUT)
    errors += train_errors + held_errors
    shared = {s for s, _ in train} & {s for s, _ in held}
    if shared:
        errors.append(f"{len(shared)} source items in both sets, e.g. {sorted(shared)[0]}")
    for name, items in (("train", train), ("heldout", held)):
        for i, (_, prompt) in enumerate(items):
            key = " ".join(prompt.split()).lower()
            if key in seen:
                errors.append(f"{name} record {i + 1}: duplicate of {seen[key]}")
            seen.setdefault(key, f"{name} record {i + 1}")
    return errors


def norm(prompt):
    return " ".join(prompt.split()).lower()


def check_xl(gz, held_data):
    """Errors of the XL file's compressed bytes; held_data: the held-out file's bytes."""
    name, errors = XL_FILE, []
    if len(gz) > MAX_XL_BYTES:
        errors.append(f"{name}: {len(gz)} compressed bytes, more than {MAX_XL_BYTES}")
    if len(gz) < 10 or gz[:3] != b"\x1f\x8b\x08":
        return errors + [f"{name}: not a gzip file"]
    if gz[3] & 0x08 or struct.unpack("<I", gz[4:8])[0] != 0:
        errors.append(f"{name}: gzip header has a file name or a time (not deterministic)")
    try:
        data = gzip.decompress(gz)
    except (OSError, EOFError, zlib.error) as e:
        return errors + [f"{name}: not a valid gzip file: {e}"]
    file_errors, items = check_file(name, data, MIN_XL, max_bytes=None, python_share=False)
    errors += file_errors
    held = [json.loads(line) for line in held_data.decode("utf-8").splitlines() if line]
    held_sources = {r["source"] for r in held}
    held_prompts = {norm(r["messages"][0]["content"]) for r in held}
    shared = {s for s, _ in items} & held_sources
    if shared:
        errors.append(f"{name}: {len(shared)} held-out source items, e.g. {sorted(shared)[0]}")
    seen = {}
    for i, (_, prompt) in enumerate(items):
        key = norm(prompt)
        if key in held_prompts:
            errors.append(f"{name} record {i + 1}: a held-out prompt")
        if key in seen:
            errors.append(f"{name} record {i + 1}: duplicate of record {seen[key]}")
        seen.setdefault(key, i + 1)
    return errors


def gz(data, mtime=0):
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=mtime, compresslevel=1) as f:
        f.write(data)
    return out.getvalue()


def self_test_xl(xl, held_data):
    """Every corruption of the XL file must be reported."""
    lines = gzip.decompress(xl).split(b"\n")

    def with_lines(new):
        return gz(b"\n".join(new))

    def edited(fn, i=0):
        rec = json.loads(lines[i])
        fn(rec)
        return with_lines(lines[:i] + [json.dumps(rec).encode()] + lines[i + 1:])

    held_rec = json.loads(held_data.split(b"\n")[0])
    held_prompt = held_rec["messages"][0]["content"]
    cases = {
        "not gzip": (gzip.decompress(xl), "not a gzip file"),
        "truncated gzip": (xl[:len(xl) // 2], "not a valid gzip file"),
        "gzip time": (gz(gzip.decompress(xl), mtime=1), "not deterministic"),
        "invalid UTF-8": (with_lines([lines[0][:-2] + b"\xff\"}"] + lines[1:]),
                          "invalid UTF-8"),
        "not valid JSON": (with_lines([lines[0][:-1]] + lines[1:]), "not valid JSON"),
        "an answer present": (edited(lambda r: r["messages"].append(
            {"role": "assistant", "content": "Hi"})), "want [user]"),
        "unknown source": (edited(lambda r: r.update(source="web:example")), "source: missing"),
        "too short": (edited(lambda r: r["messages"][0].update(content="Explain `x`.")),
                      "words (want"),
        "held-out source": (edited(lambda r: r.update(source=held_rec["source"]), 5),
                            "held-out source items"),
        "held-out prompt": (edited(lambda r: r["messages"][0].update(
            content=" ".join(held_prompt.upper().split())), 7), "a held-out prompt"),
        "duplicate": (with_lines([lines[0], lines[0]] + lines[2:]), "duplicate of"),
        "too few": (with_lines(lines[:MIN_XL - 1] + [b""]), "usable records"),
        "too big": (xl + os.urandom(MAX_XL_BYTES), "compressed bytes, more"),
    }
    failures = []
    for name, (case, expected) in cases.items():
        if not any(expected in e for e in check_xl(case, held_data)):
            failures.append(f"self-test: the XL corruption '{name}' was not reported "
                            f"('{expected}')")
    return failures


def self_test(files):
    """Every corruption must be reported."""
    train = files["train"].split(b"\n")

    def with_train(lines):
        return {"train": b"\n".join(lines), "heldout": files["heldout"]}

    def edited(fn):
        rec = json.loads(train[0])
        fn(rec)
        return with_train([json.dumps(rec).encode()] + train[1:])

    held_source = json.loads(files["heldout"].split(b"\n")[0])["source"]
    # name -> (corrupted files, a part of the error that must be reported)
    cases = {
        "invalid UTF-8": (with_train([train[0][:-2] + b"\xff\"}"] + train[1:]), "invalid UTF-8"),
        "not valid JSON": (with_train([train[0][:-1]] + train[1:]), "not valid JSON"),
        "an answer present": (edited(lambda r: r["messages"].append(
            {"role": "assistant", "content": "Hi"})), "want [user]"),
        "unknown role": (edited(lambda r: r["messages"][0].update(role="human")),
                         "accepted role"),
        "content not a string": (edited(lambda r: r["messages"][0].update(content=3)),
                                 "content: not a string"),
        "no source": (edited(lambda r: r.pop("source")), "source: missing"),
        "too short": (edited(lambda r: r["messages"][0].update(content="Explain `x`.")),
                      "words (want"),
        "too long": (edited(lambda r: r["messages"][0].update(content="word " * 400 + "end")),
                     "words (want"),
        "control character": (edited(lambda r: r["messages"][0].update(
            content=r["messages"][0]["content"] + " \x07 end")), "control characters"),
        "memory address": (edited(lambda r: r["messages"][0].update(
            content=r["messages"][0]["content"] + " <object at 0x7f1811fa48c0>")),
            "memory address"),
        "not English": (edited(lambda r: r["messages"][0].update(
            content="Объясните, что делает эта функция: " + "слово " * 30)), "not English"),
        "shared source": (edited(lambda r: r.update(source=held_source)), "in both sets"),
        "duplicate": (with_train([train[0], train[0]] + train[2:]), "duplicate of"),
        "too few": (with_train(train[:MIN_TRAIN - 1] + [b""]), "usable records"),
        "too big": (with_train(train[:-1] + [b" " * MAX_BYTES + train[0], b""]), "bytes, more"),
    }
    failures = []
    for name, (case, expected) in cases.items():
        if not any(expected in e for e in check(case)):
            failures.append(f"self-test: the corruption '{name}' was not reported ('{expected}')")
    return failures


def main():
    args = sys.argv[1:]
    selftest, want_xl = "--self-test" in args, "--xl" in args
    args = [a for a in args if a not in ("--self-test", "--xl")]
    if len(args) != 1:
        sys.exit(__doc__)
    files = {}
    for split in ("train", "heldout"):
        path = os.path.join(args[0], f"{split}-prompts.jsonl")
        with open(path, "rb") as f:
            files[split] = f.read()
    errors = check(files)
    xl_path, xl = os.path.join(args[0], XL_FILE), None
    if want_xl and not os.path.exists(xl_path):
        errors.append(f"{xl_path}: missing (--xl)")
    elif os.path.exists(xl_path):
        with open(xl_path, "rb") as f:
            xl = f.read()
        errors += check_xl(xl, files["heldout"])
    if selftest and not errors:
        errors = self_test(files)
        if xl is not None:
            errors += self_test_xl(xl, files["heldout"])
    for e in errors[:50]:
        print(e, file=sys.stderr)
    if errors:
        print(f"FAILED: {len(errors)} problems in {args[0]}", file=sys.stderr)
        sys.exit(1)
    counts = [files[split].count(b"\n") for split in ("train", "heldout")]
    xl_count = "" if xl is None else f", {gzip.decompress(xl).count(NL)} XL training"
    print(f"OK: {args[0]}: {counts[0]} training and {counts[1]} held-out prompts{xl_count}"
          + (", self-test passed" if selftest else ""))


if __name__ == "__main__":
    main()
