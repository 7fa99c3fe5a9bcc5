#!/usr/bin/env python3
"""Builds the SmolLM2 training and held-out prompt sets from documentation written by people.

Model preparation (not product code). The answers are not written here: the files hold chat records
of one user message (no answer, no system message: the checkpoint's chat template adds its default
system prompt), and `dflashctl regen` writes the target's own answers after them. Sources,
all shipped by packages on a Debian machine:

  python:QUALNAME     docstrings of Python's standard library (modules, classes, functions and
                      methods defined in pure-Python stdlib modules), read with inspect
  debian-doc:PATH     READMEs, README.Debian, NEWS, release notes and other plain text under
                      /usr/share/doc (gzip decompressed; changelogs, copyright files, HTML, code,
                      binary and non-English text skipped)
  man:NAME(SECTION)   manual pages of /usr/share/man/man1, rendered to text by `man -P cat -l`
  license:NAME        /usr/share/common-licenses

Each source item (one docstring, one document, one manual page, one license) becomes one or more user
requests with varied phrasings; every prompt of an item goes to the same split, so the held-out set
shares no source item with the training set (an item is held out when a SHA-256 of its key falls in
the held-out tenth). Deterministic: sorted inputs, a fixed seed, no timestamps; the output depends on
the Python version (its docstrings) and on the installed Debian packages (docs/real-model-data.md).

The XL training set (--xl, prompt_sources_xl.py) adds Debian package descriptions and docstrings of
PyPI packages, writes only train-prompts-xl.jsonl.gz and leaves the two files above as they are.

Usage: make_prompts.py --out-dir configs/smollm2 [--seed 20261204]
       make_prompts.py --xl --out-dir configs/smollm2 [--apt-lists DIR]   (the venv's python)
"""
import argparse
import collections
import contextlib
import gzip
import hashlib
import importlib
import inspect
import io
import json
import os
import pkgutil
import random
import re
import subprocess
import sys
import warnings

MIN_WORDS, MAX_WORDS = 20, 350
BODY_MAX_WORDS = 140  # the quoted text; keeps the files small and every prompt under MAX_WORDS
HELDOUT_TENTHS = 1  # share of source items held out, in tenths

# Targets per source (items, not prompts). Python gives about half of the prompts.
PYTHON_ITEMS = 1400
DOC_ITEMS = 380
MAN_ITEMS = 430
MAN_PER_FAMILY = 4
LICENSE_SECTIONS = 3  # prompts per license

SKIP_MODULES = {
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3",
    "pydoc_data", "ensurepip", "__main__", "__phello__", "xxsubtype", "msilib", "winreg",
    "winsound", "nturl2path", "ntpath", "_msi", "msvcrt", "distutils", "venv", "sre_compile",
    "sre_constants", "sre_parse", "encodings", "idle", "site", "sitecustomize", "usercustomize",
}

STOPWORDS = {"the", "and", "of", "to", "a", "is", "in", "for", "that", "this", "be", "it", "with",
             "are", "as", "on", "or", "not", "by", "you", "can", "if", "an", "from", "will"}


def words(text):
    return text.split()


def english_enough(text):
    """Mostly ASCII letters, and common English words among the words."""
    letters = [c for c in text if c.isalpha()]
    if len(letters) < 40:
        return False
    if sum(c.isascii() for c in letters) / len(letters) < 0.97:
        return False
    ws = [w.strip(".,;:()\"'").lower() for w in words(text)]
    return sum(w in STOPWORDS for w in ws) / max(1, len(ws)) >= 0.12


def clean_text(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = re.sub(r".\x08", "", text)  # overstrike (bold/underline) from nroff
    text = text.replace("\u2010", "-").replace("\u00ad", "")
    text = "".join(c for c in text if c == "\n" or c >= " ")
    return text


def truncate(text, max_words=BODY_MAX_WORDS):
    """Cuts after the last whole paragraph, else sentence, that fits in max_words."""
    if len(words(text)) <= max_words:
        return text.strip()
    paras = text.split("\n\n")
    out = []
    for p in paras:
        if len(words("\n\n".join(out + [p]))) > max_words:
            break
        out.append(p)
    if out and len(words("\n\n".join(out))) >= max_words // 3:
        return "\n\n".join(out).strip()
    flat = " ".join(words(text))
    sentences = re.split(r"(?<=[.!?])\s+", flat)
    out = []
    for s in sentences:
        if len(words(" ".join(out + [s]))) > max_words:
            break
        out.append(s)
    if out:
        return " ".join(out).strip()
    return " ".join(words(flat)[:max_words]) + " ..."


def paragraphs(text):
    """Paragraphs separated by blank lines, each stripped; empty ones dropped."""
    return [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]


# --------------------------------------------------------------------------------------- python


def stdlib_modules():
    names = set()
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in SKIP_MODULES:
            continue
        names.add(name)
    found = set()
    for name in sorted(names):
        mod = quiet_import(name)
        if mod is None or not str(getattr(mod, "__file__", "") or "").endswith(".py"):
            continue
        found.add(name)
        if hasattr(mod, "__path__"):
            for info in pkgutil.walk_packages(mod.__path__, name + "."):
                parts = info.name.split(".")
                if any(p.startswith("_") or p in SKIP_MODULES or p.startswith("test")
                       for p in parts[1:]):
                    continue
                sub = quiet_import(info.name)
                if sub is not None and str(getattr(sub, "__file__", "") or "").endswith(".py"):
                    found.add(info.name)
    return sorted(found)


def quiet_import(name):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - any failing module is skipped
            return None


def signature(obj):
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    # A default shown as "<object object at 0x7f...>" differs from run to run: no signature then.
    return sig if len(sig) <= 80 and "<" not in sig else ""


def python_items():
    """(key, kind, qualname, module, signature, docstring) of every documented public object."""
    items = {}
    warnings.simplefilter("ignore")  # deprecated aliases (typing.io) warn when read
    for modname in stdlib_modules():
        mod = sys.modules[modname]
        doc = inspect.getdoc(mod)
        if doc:
            items[modname] = ("module", modname, modname, "", doc)
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != modname:
                continue
            if inspect.isclass(obj):
                kind = "class"
            elif inspect.isfunction(obj):
                kind = "function"
            else:
                continue
            qual = f"{modname}.{name}"
            doc = obj.__doc__
            if doc:
                items[qual] = (kind, qual, modname, signature(obj), inspect.cleandoc(doc))
            if kind != "class":
                continue
            for mname, member in sorted(vars(obj).items()):
                if mname.startswith("_") or not inspect.isfunction(member) or not member.__doc__:
                    continue
                mqual = f"{qual}.{mname}"
                items[mqual] = ("method", mqual, modname, signature(member),
                                inspect.cleandoc(member.__doc__))
    return items


PY_TEMPLATES = {
    "module": [
        ("py-module-purpose", "What is the Python standard library module `{q}` for? Here is its "
         "documentation:\n\n{d}"),
        ("py-module-summary", "Summarize the documentation of Python's `{q}` module in two "
         "sentences:\n\n{d}"),
        ("py-module-example", "Write a short example program that uses the Python module `{q}`. "
         "Its docstring says:\n\n{d}"),
    ],
    "class": [
        ("py-class-explain", "Explain what the Python class `{q}` is for, based on its "
         "docstring:\n\n{d}"),
        ("py-class-example", "Write a short example that creates and uses `{q}{s}`. The "
         "documentation says:\n\n{d}"),
        ("py-class-simple", "I found this docstring for the class `{q}` in Python's standard "
         "library. Can you explain it in simple terms?\n\n{d}"),
    ],
    "function": [
        ("py-func-explain", "Explain what the Python function `{q}{s}` does:\n\n{d}"),
        ("py-func-example", "Write a short example that uses `{q}` from Python's `{m}` module. "
         "Here is its docstring:\n\n{d}"),
        ("py-func-params", "What are the parameters of `{q}{s}` and what does it return? The "
         "docstring says:\n\n{d}"),
        ("py-func-when", "When would I use `{q}` in Python? Its documentation reads:\n\n{d}"),
    ],
    "method": [
        ("py-method-explain", "Explain what the method `{q}{s}` does, based on this "
         "docstring:\n\n{d}"),
        ("py-method-example", "Show a short Python example that calls `{q}`. The documentation "
         "says:\n\n{d}"),
        ("py-method-simple", "Rewrite this docstring of `{q}` in plain language for a beginner:"
         "\n\n{d}"),
    ],
}


def python_prompts(rng, cap=PYTHON_ITEMS, per_module=24):
    items = python_items()
    # Spread over modules: at most per_module items per top-level module, chosen at random.
    by_top, seen_doc = collections.defaultdict(list), set()
    for key in sorted(items):
        kind, qual, mod, sig, doc = items[key]
        doc = clean_text(doc).strip()
        if len(words(doc)) < 12 or not english_enough(doc) or doc in seen_doc:
            continue
        seen_doc.add(doc)
        by_top[key.split(".")[0]].append(key)
    chosen = []
    for top in sorted(by_top):
        keys = by_top[top]
        chosen += sorted(rng.sample(keys, min(per_module, len(keys))))
    chosen = sorted(rng.sample(chosen, min(cap, len(chosen))))
    out = []
    for key in chosen:
        kind, qual, mod, sig, doc = items[key]
        name, template = rng.choice(PY_TEMPLATES[kind])
        body = truncate(clean_text(doc))
        out.append((f"python:{key}", name, template.format(q=qual, s=sig, m=mod, d=body)))
    return out


# ----------------------------------------------------------------------------------- debian docs

DOC_NAME = re.compile(r"^(README|NEWS|FAQ|TODO|RELEASE|RelNotes|HISTORY|INSTALL|USAGE|"
                      r"BUGS|THANKS|NOTES|index)?.*?(\.(txt|md|rst|Debian))?$", re.I)
DOC_SKIP = re.compile(r"changelog|copyright|license|licence|copying|\.(html?|css|js|png|jpg|svg|"
                      r"gif|py|c|h|go|pas|pl|sh|json|xml|ya?ml|conf|el|1|gz\.gz|pdf|ps)$|"
                      r"makefile|postrm|preinst|postinst", re.I)
DOC_WANT = re.compile(r"^(readme|news|faq|todo|release|relnotes|history|install|usage|bugs|notes|"
                      r"index)|\.(txt|md|rst)(\.gz)?$|README\.Debian", re.I)


def read_doc(path):
    with open(path, "rb") as f:
        raw = f.read(2_000_000)
    if path.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError):
            return None
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def doc_sections(text):
    """Sections: groups of paragraphs of prose, each about BODY_MAX_WORDS at most."""
    text = clean_text(text)
    paras = [p for p in paragraphs(text)
             if not re.fullmatch(r"[\s=\-*#~_+`.|]*", p)  # rules, underlines
             and len(words(p)) >= 4]
    sections, cur = [], []
    for p in paras:
        if cur and len(words("\n\n".join(cur + [p]))) > BODY_MAX_WORDS:
            sections.append("\n\n".join(cur))
            cur = []
        cur.append(p)
    if cur:
        sections.append("\n\n".join(cur))
    return [truncate(s) for s in sections if len(words(s)) >= 25 and english_enough(s)]


DOC_TEMPLATES = [
    ("doc-summary", "Summarize this section of the {kind} of the Debian package `{p}` in two "
     "sentences:\n\n{d}"),
    ("doc-purpose", "Here is part of the {kind} of `{p}`. What is this software for, and what "
     "does this part tell a user?\n\n{d}"),
    ("doc-bullets", "List the main points of this excerpt from the {kind} of `{p}` as short "
     "bullet points:\n\n{d}"),
    ("doc-plain", "Rewrite this passage from `{p}`'s {kind} in plain language for a beginner:"
     "\n\n{d}"),
    ("doc-question", "I am reading the {kind} of `{p}` and do not understand this part. Can you "
     "explain it?\n\n{d}"),
]
NEWS_TEMPLATES = [
    ("news-changes", "Explain to a user of `{p}` what changed, according to these release "
     "notes:\n\n{d}"),
    ("news-upgrade", "Do these notes from `{p}` mean I need to do anything when I upgrade? "
     "Explain briefly:\n\n{d}"),
]


def doc_kind(name):
    low = name.lower()
    if low.startswith("readme.debian"):
        return "README.Debian"
    if low.startswith(("news", "relnotes", "release", "history")) or re.match(r"\d+\.\d", low):
        return "release notes"
    if low.startswith("readme"):
        return "README"
    if low.startswith("faq"):
        return "FAQ"
    return "documentation"


def debian_doc_prompts(rng, root="/usr/share/doc", cap=DOC_ITEMS, docs_per_package=8):
    per_package = collections.defaultdict(list)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            path = os.path.join(dirpath, fn)
            if os.path.islink(path) or DOC_SKIP.search(fn.removesuffix(".gz")):
                continue
            if not DOC_WANT.search(fn):
                continue
            pkg = os.path.relpath(path, root).split(os.sep)[0]
            per_package[pkg].append(path)
    # Every package gets a turn; large doc trees (git's release notes) at most
    # docs_per_package documents.
    candidates = []
    for pkg in sorted(per_package):
        paths = per_package[pkg]
        picks = rng.sample(paths, min(docs_per_package, len(paths)))
        candidates += [(pkg, p) for p in sorted(picks)]
    rng.shuffle(candidates)
    out, items, seen_text = [], 0, set()
    for pkg, path in candidates:
        if items >= cap:
            break
        text = read_doc(path)
        if text is None:
            continue
        sections = [s for s in doc_sections(text) if s not in seen_text]
        if not sections:
            continue
        seen_text.update(sections)
        items += 1
        kind = doc_kind(os.path.basename(path))
        for s in sections[:2]:
            templates = NEWS_TEMPLATES + DOC_TEMPLATES[:2] if kind == "release notes" \
                else DOC_TEMPLATES
            name, template = rng.choice(templates)
            out.append((f"debian-doc:{path}", name, template.format(kind=kind, p=pkg, d=s)))
    return out


def license_prompts(rng, root="/usr/share/common-licenses"):
    out = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        text = read_doc(path)
        if text is None:
            continue
        sections = doc_sections(text)
        if not sections:
            continue
        picks = sorted(rng.sample(range(len(sections)), min(LICENSE_SECTIONS, len(sections))))
        for i in picks:
            name_t, template = rng.choice([
                ("license-plain", "What does this part of the {n} license mean in practice? "
                 "Explain it in plain English:\n\n{d}"),
                ("license-summary", "Summarize this clause of the {n} license in two sentences:"
                 "\n\n{d}"),
            ])
            out.append((f"license:{name}", name_t, template.format(n=name, d=sections[i])))
    return out


# ---------------------------------------------------------------------------------------- man


def render_man(path):
    env = dict(os.environ, MANWIDTH="2000", LANG="C.UTF-8", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
    env.pop("MAN_KEEP_FORMATTING")
    try:
        res = subprocess.run(["man", "--nh", "--nj", "-P", "cat", "-l", path], env=env,
                             capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        return None
    if res.returncode != 0 or not res.stdout:
        return None
    try:
        return clean_text(res.stdout.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def man_sections(text):
    """{SECTION NAME: body} of a rendered manual page (headings are unindented upper-case lines)."""
    sections, name, body = {}, None, []
    for line in text.split("\n")[1:]:
        if line and not line[0].isspace() and line.upper() == line and re.search("[A-Z]", line):
            if name:
                sections.setdefault(name, "\n".join(body))
            name, body = line.strip(), []
        elif name:
            body.append(line)
    if name:
        sections.setdefault(name, "\n".join(body))
    return sections


def dedent_paras(body):
    """Paragraphs of a section, each joined into one line."""
    return [" ".join(words(p)) for p in paragraphs(body)]


def man_options(body):
    """(option, description) pairs: an indented line starting with '-', then its deeper text."""
    lines = body.split("\n")
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^( +)(-{1,2}[A-Za-z0-9][^ ]*.*)$", line)
        if not m:
            continue
        indent = len(m.group(1))
        opt, desc = m.group(2).strip(), []
        same_line = re.match(r"^(\S+(?:, \S+)?(?: \S+)?) {2,}(\S.*)$", opt)
        if same_line:  # "-x  text" on one line
            opt, desc = same_line.group(1), [same_line.group(2)]
        for nxt in lines[i + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            desc.append(nxt.strip())
        text = " ".join(words(" ".join(desc)))
        if len(words(text)) >= 5:
            out.append((opt, text))
    return out


MAN_TEMPLATES = [
    ("man-summary", "Summarize what the command `{c}` does, based on this excerpt from its "
     "manual page:\n\n{d}"),
    ("man-when", "When would I use the `{c}` command? Here is the start of its manual page:"
     "\n\n{d}"),
    ("man-example", "Write a short example of using `{c}` in a shell, with one sentence of "
     "explanation. The manual says:\n\n{d}"),
]
MAN_OPTION_TEMPLATES = [
    ("man-option", "What does the command-line option `{o}` of `{c}` do? The manual page "
     "says:\n\n{d}"),
    ("man-option-example", "Give an example shell command that uses `{c}` with `{o}`, and "
     "explain it. From the manual page:\n\n{d}"),
]


def man_prompts(rng, root="/usr/share/man/man1", cap=MAN_ITEMS, per_family=MAN_PER_FAMILY,
                family_caps=None):
    files = sorted(f for f in os.listdir(root)
                   if not os.path.islink(os.path.join(root, f)))
    # Families (gcloud_*, git-*, openssl-*, llvm-*) share a first word; at most per_family pages
    # of each (family_caps: {family: pages} to differ), or gcloud's thousands of generated pages
    # would be most of the sample.
    family = collections.defaultdict(list)
    for f in files:
        family[re.split(r"[_.-]", f)[0]].append(f)
    files = []
    for name in sorted(family):
        n = (family_caps or {}).get(name, per_family)
        files += sorted(rng.sample(family[name], min(n, len(family[name]))))
    rng.shuffle(files)
    out, items, seen_name, seen_body = [], 0, set(), set()
    for fn in files:
        if items >= cap:
            break
        m = re.match(r"^(.+)\.(1[a-z]*)(\.gz)?$", fn)
        if not m or m.group(1) in seen_name:
            continue
        cmd, sec = m.group(1), m.group(2)
        text = render_man(os.path.join(root, fn))
        if text is None:
            continue
        secs = man_sections(text)
        name_line = " ".join(words(secs.get("NAME", "")))
        desc = dedent_paras(secs.get("DESCRIPTION", ""))
        if not name_line or not desc:
            continue
        body = truncate(name_line + "\n\n" + "\n\n".join(desc), 150)
        if len(words(body)) < 25 or not english_enough(body) or body in seen_body:
            continue
        seen_body.add(body)
        seen_name.add(cmd)
        items += 1
        src = f"man:{cmd}({sec})"
        name, template = rng.choice(MAN_TEMPLATES)
        out.append((src, name, template.format(c=cmd, d=body)))
        opt_secs = [b for n, b in secs.items() if "OPTIONS" in n or "FLAGS" in n]
        opts = man_options("\n".join(opt_secs) or secs.get("DESCRIPTION", ""))
        if opts:
            opt, odesc = rng.choice(opts)
            if len(opt) <= 60:
                d = truncate(f"{name_line}\n\n{opt}\n    {odesc}", 150)
                name, template = rng.choice(MAN_OPTION_TEMPLATES)
                out.append((src, name, template.format(c=cmd, o=opt.split(",")[0].split(" ")[0]
                                                        if len(opt) > 30 else opt, d=d)))
    return out


# ------------------------------------------------------------------------------------- output


def heldout(source):
    """Held out iff the SHA-256 of the source item's key falls in the held-out tenths."""
    return int(hashlib.sha256(source.encode()).hexdigest(), 16) % 10 < HELDOUT_TENTHS


def record(source, prompt):
    return {"messages": [{"role": "user", "content": prompt}], "source": source}


def percentiles(values, ps=(0, 10, 50, 90, 100)):
    s = sorted(values)
    return {p: s[min(len(s) - 1, (len(s) - 1) * p // 100)] for p in ps}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--seed", type=int, default=20261204)
    ap.add_argument("--xl", action="store_true",
                    help="write only train-prompts-xl.jsonl.gz (prompt_sources_xl.py); the "
                    "committed train and held-out files in --out-dir are read, not rewritten")
    ap.add_argument("--apt-lists", default="/var/lib/apt/lists",
                    help="--xl: the apt lists directory holding Translation-en indexes")
    args = ap.parse_args()
    if args.xl:
        import prompt_sources_xl
        prompt_sources_xl.make_xl(args)
        return

    prompts = []
    for name, make in (("python", python_prompts), ("debian-doc", debian_doc_prompts),
                       ("license", license_prompts), ("man", man_prompts)):
        made = make(random.Random(f"{args.seed}:{name}"))
        print(f"{name}: {len(made)} prompts", file=sys.stderr)
        prompts += made

    kept, seen = [], set()
    for source, phrasing, prompt in prompts:
        prompt = prompt.strip()
        n = len(words(prompt))
        if not (MIN_WORDS <= n <= MAX_WORDS):
            continue
        norm = " ".join(words(prompt)).lower()
        if norm in seen:
            continue
        seen.add(norm)
        kept.append((source, phrasing, prompt))
    random.Random(f"{args.seed}:order").shuffle(kept)

    splits = {"train": [], "heldout": []}
    for item in kept:
        splits["heldout" if heldout(item[0]) else "train"].append(item)
    os.makedirs(args.out_dir, exist_ok=True)
    for split, items in splits.items():
        path = os.path.join(args.out_dir, f"{split}-prompts.jsonl")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for source, _, prompt in items:
                f.write(json.dumps(record(source, prompt), ensure_ascii=False) + "\n")
        print(f"\n{path}: {len(items)} prompts, {os.path.getsize(path)} bytes")
        by_source = collections.Counter(s.split(":")[0] for s, _, _ in items)
        print("  per source:   " + ", ".join(f"{k} {v}" for k, v in sorted(by_source.items())))
        print("  source items: " + str(len({s for s, _, _ in items})))
        by_phrasing = collections.Counter(p for _, p, _ in items)
        print("  per phrasing: " + ", ".join(f"{k} {v}" for k, v in sorted(by_phrasing.items())))
        pct = percentiles([len(words(p)) for _, _, p in items])
        print("  words (p0/p10/p50/p90/p100): " + "/".join(str(pct[p]) for p in sorted(pct)))


if __name__ == "__main__":
    main()
