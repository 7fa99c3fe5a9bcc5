#!/usr/bin/env python3
"""The sources of the XL training prompt set (make_prompts.py --xl), beyond make_prompts.py's own.

Model preparation (not product code). Two more kinds of text written by people:

  debian-pkg:NAME          the long descriptions that Debian's maintainers write for their
                           packages, from the Translation-en indexes that `apt-get update`
                           downloads with Acquire::Languages=en (docs/real-model-data.md)
  pypi:DIST:QUALNAME       docstrings of Python packages installed from PyPI (numpy, sympy, torch,
                           transformers, ...): modules, public classes, functions and methods
                           defined in the package's own public modules

The PyPI docstrings are read in a child process per distribution (`prompt_sources_xl.py
--pypi-items DIST`, run with the same interpreter), so that one package's imports cannot disturb
another's and a package that hangs on import costs at most PYPI_TIMEOUT_S; an import of one module
is given at most IMPORT_TIMEOUT_S. Everything is walked in sorted or hash order: deterministic.
"""
import collections
import gzip
import contextlib
import glob
import hashlib
import importlib
import importlib.metadata
import inspect
import io
import json
import os
import pkgutil
import re
import signal
import subprocess
import sys
import warnings

import make_prompts as mp

# ------------------------------------------------------------------------------- debian-pkg

DEBIAN_PKG_ITEMS = 11500
# Descriptions that say nothing of their own: debug symbols, transitional and dummy packages, the
# generated text of Rust crates packaged by debcargo. Names of splits that mostly repeat their main
# package's text (-dev, -doc, -data, ...) are skipped too.
PKG_BOILERPLATE = re.compile(
    r"debug(ging)? symbols|transitional|dummy package|empty package|packaged by debcargo|"
    r"this package contains the source for the rust|automatically generated", re.I)
PKG_SKIP_NAME = re.compile(r"-(dbg|dbgsym|doc|docs|dev|data|common|l10n|locale|dbg-\w+)$|"
                           r"^(librust-|golang-.*-dev$|node-.*-dev$)")

PKG_TEMPLATES = [
    ("pkg-purpose", "What is the Debian package `{p}` for? Its description says:\n\n{d}"),
    ("pkg-summary", "Summarize this description of the package `{p}` in one or two sentences:"
     "\n\n{d}"),
    ("pkg-who", "I am deciding whether to install `{p}`. Based on its package description, who "
     "would find it useful, and for what?\n\n{d}"),
    ("pkg-plain", "Explain this package description of `{p}` in plain language for a beginner:"
     "\n\n{d}"),
    ("pkg-bullets", "List the main features of `{p}` as short bullet points, from its package "
     "description:\n\n{d}"),
    ("pkg-question", "The package manager describes `{p}` like this. What does it do, and what "
     "would I use it for?\n\n{d}"),
]


def apt_cat(path):
    """The text of an apt index (lz4, xz, gz or plain), decompressed by apt itself."""
    res = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", path], capture_output=True,
                         check=True)
    return res.stdout.decode("utf-8", errors="replace")


def deb822(text):
    """{field: value} paragraphs of a Debian control-style index (continuation lines kept)."""
    for block in text.split("\n\n"):
        fields, name = {}, None
        for line in block.split("\n"):
            if line.startswith((" ", "\t")) and name:
                fields[name] += "\n" + line
            elif ":" in line:
                name, value = line.split(":", 1)
                fields[name] = value.strip()
        if fields:
            yield fields


def long_description(value):
    """(short description, long description as paragraphs of joined lines)."""
    lines = value.split("\n")
    short, paras, cur = lines[0].strip(), [], []
    for line in lines[1:]:
        line = line[1:] if line.startswith(" ") else line
        if line.strip() == ".":
            paras.append("\n".join(cur))
            cur = []
        elif line.startswith((" ", "*", "-", "o ", "+")) or not cur:
            cur.append(line.rstrip())  # list items and verbatim lines keep their own line
        else:
            cur[-1] += " " + line.strip()
    paras.append("\n".join(cur))
    return short, [p.strip("\n") for p in paras if p.strip()]


def debian_pkg_items(lists_dir):
    """{package: (short, long paragraphs)} of the descriptions in lists_dir, one per source."""
    translations = sorted(glob.glob(os.path.join(lists_dir, "*_i18n_Translation-en*")))
    if not translations:
        raise SystemExit(f"no Translation-en index in {lists_dir}: run `apt-get update -o "
                         "Acquire::Languages=en` (Dir::State::Lists=DIR for a private copy)")
    source_of = {}
    for path in sorted(glob.glob(os.path.join(lists_dir, "*_binary-*_Packages*"))):
        for f in deb822(apt_cat(path)):
            if "Package" in f:
                source_of.setdefault(f["Package"], f.get("Source", f["Package"]).split(" ")[0])
    descs = set()
    for path in translations:
        for f in deb822(apt_cat(path)):
            if "Package" in f and "Description-en" in f:
                descs.add((f["Package"], f["Description-en"]))
    items, seen_source, seen_text = {}, set(), set()
    for pkg, value in sorted(descs):
        source = source_of.get(pkg, pkg)
        if pkg in items or source in seen_source or PKG_SKIP_NAME.search(pkg):
            continue
        short, paras = long_description(mp.clean_text(value))
        text = "\n\n".join(paras)
        if PKG_BOILERPLATE.search(short + " " + text) or len(mp.words(text)) < 25 \
                or not mp.english_enough(text):
            continue
        # The same text under another name (a per-flavour or renamed split): first paragraph and
        # whole text compared with the package's name and digits masked.
        name_parts = {p for p in re.split(r"[-.+_]", pkg.lower()) if len(p) >= 3}
        keys = [" ".join(w for w in re.findall(r"[a-z]+", t.lower()) if w not in name_parts)
                for t in (paras[0], text)]
        if any(k in seen_text for k in keys):
            continue
        seen_text.update(keys)
        seen_source.add(source)
        items[pkg] = (short, paras)
    return items


def debian_pkg_prompts(rng, lists_dir, cap=DEBIAN_PKG_ITEMS):
    items = debian_pkg_items(lists_dir)
    out = []
    for pkg in sorted(rng.sample(sorted(items), min(cap, len(items)))):
        short, paras = items[pkg]
        body = mp.truncate(short[:1].upper() + short[1:].rstrip(".") + ".\n\n" + "\n\n".join(paras))
        name, template = rng.choice(PKG_TEMPLATES)
        out.append((f"debian-pkg:{pkg}", name, template.format(p=pkg, d=body)))
    return out


# ------------------------------------------------------------------------------------- pypi

# distribution -> import name. Written by people and installed in the project's venv
# (scripts/setup.sh); generated API clients (openai) and binary-only packages left out.
PYPI_DISTS = {
    "numpy": "numpy", "sympy": "sympy", "networkx": "networkx", "matplotlib": "matplotlib",
    "Jinja2": "jinja2", "click": "click", "fsspec": "fsspec", "huggingface_hub": "huggingface_hub",
    "transformers": "transformers", "torch": "torch", "mpmath": "mpmath", "requests": "requests",
    "urllib3": "urllib3", "packaging": "packaging", "pydantic": "pydantic",
    "python-dateutil": "dateutil", "PyYAML": "yaml", "tqdm": "tqdm", "pillow": "PIL",
    "accelerate": "accelerate", "pyparsing": "pyparsing", "fonttools": "fontTools",
    "anyio": "anyio", "sqlite-utils": "sqlite_utils", "tabulate": "tabulate",
    "filelock": "filelock", "diskcache": "diskcache", "psutil": "psutil", "pluggy": "pluggy",
    "MarkupSafe": "markupsafe", "safetensors": "safetensors", "contourpy": "contourpy",
    "cycler": "cycler", "llm": "llm", "triton": "triton",
}
PYPI_ITEMS = 2000  # per distribution
PYPI_PER_FAMILY = 60  # per subpackage (numpy.linalg, sympy.core, transformers.models.bert)
PYPI_MODULES = 700  # modules imported per distribution at most
PYPI_TIMEOUT_S, IMPORT_TIMEOUT_S = 900, 60
PYPI_SKIP_PART = re.compile(r"^(_.*|tests?|testing|conftest|benchmarks?|examples?|externals?|"
                            r"_?vendor(ed)?|setup|__main__|compat|conftest|sandbox)$")
GENERATED_DOC = re.compile(r"^(Initialize self|Return self|Create and return a new object|"
                           r"Helper for pickle|Method generated by attrs|Alias for field number|"
                           r"Automatically created|Implement \w+\(|Return repr|Return str)")

PYPI_TEMPLATES = {
    "module": [
        ("pypi-module-purpose", "What is the module `{q}` of the Python package {dist} for? Its "
         "documentation says:\n\n{d}"),
        ("pypi-module-summary", "Summarize the documentation of the `{q}` module ({dist}) in two "
         "sentences:\n\n{d}"),
    ],
    "class": [
        ("pypi-class-explain", "Explain what the class `{q}` from {dist} is for, based on its "
         "docstring:\n\n{d}"),
        ("pypi-class-example", "Write a short example that creates and uses `{q}{s}` from "
         "{dist}. The documentation says:\n\n{d}"),
        ("pypi-class-simple", "I found this docstring of `{q}` in the {dist} package. Can you "
         "explain it in simple terms?\n\n{d}"),
    ],
    "function": [
        ("pypi-func-explain", "Explain what the {dist} function `{q}{s}` does:\n\n{d}"),
        ("pypi-func-example", "Write a short example that uses `{q}` from {dist}. Here is its "
         "docstring:\n\n{d}"),
        ("pypi-func-params", "What are the parameters of `{q}{s}` ({dist}) and what does it "
         "return? The docstring says:\n\n{d}"),
        ("pypi-func-when", "When would I use `{q}` from the {dist} package? Its documentation "
         "reads:\n\n{d}"),
    ],
    "method": [
        ("pypi-method-explain", "Explain what the method `{q}{s}` of {dist} does, based on this "
         "docstring:\n\n{d}"),
        ("pypi-method-example", "Show a short Python example that calls `{q}` ({dist}). The "
         "documentation says:\n\n{d}"),
        ("pypi-method-simple", "Rewrite this docstring of `{q}` from {dist} in plain language for "
         "a beginner:\n\n{d}"),
    ],
}


def hash_order(names):
    return sorted(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest())


class ImportTimeout(Exception):
    pass


def timed_import(name):
    def expire(signum, frame):
        raise ImportTimeout(name)
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(IMPORT_TIMEOUT_S)
    try:
        return mp.quiet_import(name)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def pypi_modules(top):
    """Public modules of the package `top`, breadth first, each level in hash order, capped."""
    root = timed_import(top)
    if root is None:
        return []
    found, queue = [top], [root]
    while queue and len(found) < PYPI_MODULES:
        mod = queue.pop(0)
        if not hasattr(mod, "__path__"):
            continue
        try:
            subs = [i.name for i in pkgutil.iter_modules(mod.__path__, mod.__name__ + ".")]
        except Exception:  # noqa: BLE001 - an odd __path__: no submodules
            continue
        for name in hash_order(subs):
            if len(found) >= PYPI_MODULES:
                break
            if PYPI_SKIP_PART.match(name.rsplit(".", 1)[1]):
                continue
            sub = timed_import(name)
            if sub is not None and str(getattr(sub, "__file__", "") or "").endswith(".py"):
                found.append(name)
                queue.append(sub)
    return found


def pypi_items(top):
    """[key, kind, qualname, module, signature, docstring] of the package's documented objects."""
    warnings.simplefilter("ignore")
    items = []
    for modname in pypi_modules(top):
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        doc = mod.__doc__ if isinstance(mod.__doc__, str) else None
        if doc:
            items.append([modname, "module", modname, modname, "", inspect.cleandoc(doc)])
        for name, obj in sorted(vars(mod).items()):
            try:
                if name.startswith("_") or getattr(obj, "__module__", None) != modname:
                    continue
                kind = "class" if inspect.isclass(obj) else \
                    "function" if inspect.isfunction(obj) else None
            except Exception:  # noqa: BLE001 - lazy objects that fail when touched
                continue
            if kind is None:
                continue
            qual = f"{modname}.{name}"
            doc = obj.__doc__ if isinstance(obj.__doc__, str) else None
            if doc and not (kind == "class" and doc.startswith(name + "(")):  # dataclass's own
                items.append([qual, kind, qual, modname, mp.signature(obj), inspect.cleandoc(doc)])
            if kind != "class":
                continue
            for mname, member in sorted(vars(obj).items()):
                if mname.startswith("_") or not inspect.isfunction(member) \
                        or not isinstance(member.__doc__, str):
                    continue
                mqual = f"{qual}.{mname}"
                items.append([mqual, "method", mqual, modname, mp.signature(member),
                              inspect.cleandoc(member.__doc__)])
    return items


def family(modname):
    parts = modname.split(".")
    return ".".join(parts[:3] if len(parts) > 2 and parts[1] in ("models", "nn") else parts[:2])


def doc_shape(doc, qual):
    """A docstring with names masked: the templated docstrings of many similar classes (the
    hundreds of transformers models) compare equal."""
    names = {p.lower() for p in re.split(r"[._]", qual) if len(p) >= 3}
    ws = [w for w in re.findall(r"[A-Za-z]+", doc)
          if not re.search(r"[a-z][A-Z]", w) and w.lower() not in names
          and not any(n in w.lower() for n in names if len(n) >= 4)]
    return " ".join(ws).lower()


def pypi_prompts(rng, seen_shapes):
    out, versions = [], {}
    for dist, top in PYPI_DISTS.items():
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            print(f"pypi: {dist} not installed, skipped", file=sys.stderr)
            continue
        try:
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--pypi-items", top],
                                 capture_output=True, timeout=PYPI_TIMEOUT_S,
                                 env=dict(os.environ, PYTHONHASHSEED="0",
                                          TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM=
                                          "false", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
            items = json.loads(res.stdout.decode()) if res.returncode == 0 else []
        except (subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            print(f"pypi: {dist}: {type(e).__name__}, skipped", file=sys.stderr)
            continue
        by_family = collections.defaultdict(list)
        for key, kind, qual, mod, sig, doc in items:
            doc = mp.clean_text(doc).strip()
            shape = doc_shape(doc, qual)
            if len(mp.words(doc)) < 15 or GENERATED_DOC.match(doc) or \
                    not mp.english_enough(doc) or shape in seen_shapes:
                continue
            seen_shapes.add(shape)
            by_family[family(mod)].append((key, kind, qual, mod, sig, doc))
        chosen = []
        for fam in sorted(by_family):
            group = by_family[fam]
            chosen += rng.sample(group, min(PYPI_PER_FAMILY, len(group)))
        chosen = sorted(rng.sample(chosen, min(PYPI_ITEMS, len(chosen))))
        for key, kind, qual, mod, sig, doc in chosen:
            name, template = rng.choice(PYPI_TEMPLATES[kind])
            out.append((f"pypi:{dist}:{key}", name,
                        template.format(q=qual, s=sig, dist=dist, d=mp.truncate(doc))))
        print(f"pypi: {dist} {versions[dist]}: {len(items)} docstrings, {len(chosen)} chosen"
              + ("" if res.returncode == 0 else f" (child exit {res.returncode})"),
              file=sys.stderr)
    return out, versions


if __name__ == "__main__" and sys.argv[1:2] == ["--pypi-items"]:
    # What packages print while imported (C code too) goes to stderr; the items to stdout.
    result = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    result.write(json.dumps(pypi_items(sys.argv[2]), ensure_ascii=False))
    result.close()


# --------------------------------------------------------------------------------- the XL set

# Caps of make_prompts.py's own sources in the XL set (items, not prompts).
XL_PYTHON_ITEMS, XL_PYTHON_PER_MODULE = 100_000, 100_000  # every usable stdlib docstring
XL_DOC_ITEMS, XL_DOC_PER_PACKAGE = 1500, 12
XL_MAN_ITEMS, XL_MAN_PER_FAMILY, XL_MAN_GCLOUD = 2000, 20, 700
XL_FILE = "train-prompts-xl.jsonl.gz"
MEMORY_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]{6,}")


def norm(prompt):
    return " ".join(mp.words(prompt)).lower()


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def make_xl(args):
    """Writes DIR/train-prompts-xl.jsonl.gz: the committed training prompts and many more, none
    of a held-out source item or equal to a held-out prompt. The committed files stay as they
    are."""
    train = read_jsonl(os.path.join(args.out_dir, "train-prompts.jsonl"))
    held = read_jsonl(os.path.join(args.out_dir, "heldout-prompts.jsonl"))
    held_sources = {r["source"] for r in held}
    held_prompts = {norm(r["messages"][0]["content"]) for r in held}
    train_sources = {r["source"] for r in train}
    prompts = [(r["source"], "committed", r["messages"][0]["content"]) for r in train]
    print(f"committed training file: {len(prompts)} prompts", file=sys.stderr)

    seen_shapes = set()
    sources = [
        ("python", lambda rng: mp.python_prompts(rng, XL_PYTHON_ITEMS, XL_PYTHON_PER_MODULE)),
        ("debian-doc", lambda rng: mp.debian_doc_prompts(rng, cap=XL_DOC_ITEMS,
                                                         docs_per_package=XL_DOC_PER_PACKAGE)),
        ("man", lambda rng: mp.man_prompts(rng, cap=XL_MAN_ITEMS, per_family=XL_MAN_PER_FAMILY,
                                           family_caps={"gcloud": XL_MAN_GCLOUD})),
        ("debian-pkg", lambda rng: debian_pkg_prompts(rng, args.apt_lists)),
        ("pypi", lambda rng: pypi_prompts(rng, seen_shapes)[0]),
    ]
    for name, make in sources:
        made = make(mp.random.Random(f"{args.seed}:xl:{name}"))
        # An item of the committed training file keeps its committed prompts only.
        new = [p for p in made if p[0] not in train_sources]
        print(f"{name}: {len(made)} prompts, {len(new)} of items new to the XL set",
              file=sys.stderr)
        prompts += new

    kept, seen, dropped = [], set(), collections.Counter()
    for source, phrasing, prompt in prompts:
        prompt = prompt.strip()
        key = norm(prompt)
        if mp.heldout(source) or source in held_sources or key in held_prompts:
            dropped["held out"] += 1
        elif not mp.MIN_WORDS <= len(mp.words(prompt)) <= mp.MAX_WORDS:
            dropped["length"] += 1
        elif MEMORY_ADDRESS.search(prompt) or any(c < " " and c != "\n" for c in prompt):
            dropped["memory address or control character"] += 1
        elif key in seen:
            dropped["duplicate"] += 1
        else:
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError:
                dropped["not UTF-8"] += 1
                continue
            seen.add(key)
            kept.append((source, phrasing, prompt))
    mp.random.Random(f"{args.seed}:xl:order").shuffle(kept)

    path = os.path.join(args.out_dir, XL_FILE)
    data = "".join(json.dumps(mp.record(s, p), ensure_ascii=False) + "\n" for s, _, p in kept)
    with open(path, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as f:
        f.write(data.encode("utf-8"))
    print(f"\n{path}: {len(kept)} prompts, {len(data.encode())} bytes, "
          f"{os.path.getsize(path)} compressed")
    print("  dropped: " + ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())))
    by_source = collections.Counter(s.split(":")[0] for s, _, _ in kept)
    print("  per source:   " + ", ".join(f"{k} {v}" for k, v in sorted(by_source.items())))
    items = collections.Counter(s.split(":")[0] for s in {s for s, _, _ in kept})
    print("  source items: " + ", ".join(f"{k} {v}" for k, v in sorted(items.items()))
          + f" ({sum(items.values())})")
    by_dist = collections.Counter(s.split(":")[1] for s, _, _ in kept if s.startswith("pypi:"))
    print("  pypi per distribution: " + ", ".join(f"{k} {v}" for k, v in sorted(by_dist.items())))
    by_phrasing = collections.Counter(p for _, p, _ in kept)
    print("  per phrasing: " + ", ".join(f"{k} {v}" for k, v in sorted(by_phrasing.items())))
    pct = mp.percentiles([len(mp.words(p)) for _, _, p in kept])
    print("  words (p0/p10/p50/p90/p100): " + "/".join(str(pct[p]) for p in sorted(pct)))
