"""Reference renders for the C++ Jinja interpreter, from Python jinja2 under transformers.

Writes into --out:
  snippets.jsonl   small templates exercising one feature each: {"name", "source", "variables",
                   "text"} or {"..., "error"} when jinja2 raises; rendered by transformers' own
                   compiled environment (_compile_jinja_template: trim_blocks, lstrip_blocks,
                   loopcontrols, its tojson, raise_exception, strftime_now).
  fixtures.jsonl   every published chat template in tests/data/chat_templates/*.jinja with many
                   conversations (system or not, multi-turn, add_generation_prompt true/false,
                   unicode, Qwen3 thinking): {"template", "source", "variables" (everything
                   apply_chat_template passes besides messages), "messages", "text"}.
  smollm2.jsonl    the real SmolLM2-135M-Instruct checkpoint (its own tokenizer_config.json
                   template): {"messages", "add_generation_prompt", "text", "ids", "mask",
                   "spans"}; the supervised spans (UTF-8 byte ranges of assistant content +
                   <|im_end|>) and the token mask (offsets_mapping) are computed here independently.
  paths.json       {"smollm2_dir": the checkpoint directory}
"""

import argparse
import datetime
import glob
import json
import os
import random

from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "data", "chat_templates")

# Special tokens each fixture's checkpoint declares in its tokenizer_config.json.
SPECIALS = {
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>"},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama3_2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3_3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}

FRAGMENTS = [
    "Hello", "world", "The answer is 42.", "  leading spaces", "trailing spaces   ", "\n", "\n\n",
    "\t", "def f(x):\n    return x * 2\n", "naïve café", "日本語のテキスト", "中文，标点。",
    "emoji 😀🎉", "e\u0301 decomposed", "مرحبا", "3.14159", "\u00a0nbsp\u3000ideographic\u00a0",
    "I'm sure it's fine", "a\r\nb", "{{ not jinja }}", "{% raw %}", "<tool_response>", "",
]

SNIPPETS = [
    ("text", "plain text\nline 2", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc", {}),
    ("lstrip_not_after_text", "x {% if true %}y{% endif %} z", {}),
    ("minus_modifiers", "a  \n  {{- 'b' -}}  \n  c {%- if true -%}  d  {%- endif -%}  e", {}),
    ("plus_modifier", "a\n    {%+ if true %}b{% endif %}\n", {}),
    ("comments", "a {# note #} b\n  {#- gone -#}  c\n{# line #}\nd", {}),
    ("expr_newline_kept", "{{ 'x' }}\ny", {}),
    ("arith", "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} "
              "{{ 7 / 2 }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e3 if false else 100.0 }}", {}),
    ("strings", "{{ 'a' ~ 1 ~ none ~ true }} {{ \"q'\" + 'x' }} {{ 'ab' * 3 }} {{ 'é' | length }}",
     {}),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' x') }}|"
                       "{{ s.split() }}|{{ s.split('a') }}|{{ s.split(' ', 1) }}|"
                       "{{ s.startswith(' ') }}{{ s.endswith('x') }}|{{ s.replace('a', 'o') }}|"
                       "{{ s.upper() }}|{{ s.title() }}|{{ s.find('b') }}",
     {"s": "  xa b\tca x  "}),
    ("unicode_strip", "[{{ s | trim }}][{{ s.strip() }}][{{ s[1:-1] }}][{{ s[::-1] }}]",
     {"s": "\u3000 日本\u00a0"}),
    ("slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2] }} {{ l[10] }} "
               "{{ l[1:100] }} {{ l[3:1] }} {{ l[-100:2] }} {{ l[::-2] }}",
     {"l": [1, 2, 3, 4, 5]}),
    ("loop_vars", "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
                  "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}",
     {"l": ["a", "b", "c"]}),
    ("loop_else_filter", "{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% else %}none"
                         "{% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}",
     {"l": [1, 2, 3]}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
                            "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}"
                   "{{ x }}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}"
                  "{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}",
     {}),
    ("dict_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}"
                   "{% for k, v in d | items %}{{ k }}{% endfor %}{{ d.get('a') }}{{ d.get('z', 9) }}"
                   "{{ 'a' in d }}{{ d['b'] }}{{ d.b }}{{ d | length }}",
     {"d": {"a": 1, "b": [1, "x"]}}),
    ("tests", "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}"
              "{{ x is string }}{{ 1 is number }}{{ d is mapping }}{{ x is iterable }}"
              "{{ 3 is odd }}{{ 4 is divisibleby 2 }}{{ x is not none }}{{ true is true }}"
              "{{ 1 is integer }}{{ 1.0 is float }}{{ x is equalto 'ab' }}",
     {"x": "ab", "n": None, "d": {}}),
    ("in_ops", "{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'z' not in 'abc' }}{{ 'a' in {'a': 1} }}",
     {}),
    ("compare", "{{ 1 < 2 < 3 }}{{ 1 == 1.0 }}{{ 'a' < 'b' }}{{ 1 != '1' }}{{ [1] == [1] }}"
                "{{ none == none }}{{ undefined_x == none }}", {}),
    ("logic", "{{ 0 or 'x' }}{{ 1 and 'y' }}{{ not '' }}{{ none or [] }}{{ 'a' if 0 else 'b' }}"
              "{{ 'c' if 1 }}[{{ 'd' if 0 }}]", {}),
    ("filters", "{{ l | join(', ') }}|{{ l | first }}|{{ l | last }}|{{ l | length }}|"
                "{{ x | default('dflt') }}|{{ '' | default('e', true) }}|{{ s | upper }}|"
                "{{ l | reverse | list }}|{{ l | select('odd') | list }}|"
                "{{ l | reject('equalto', 2) | list }}|{{ ms | map(attribute='role') | join }}|"
                "{{ ms | selectattr('role', 'equalto', 'user') | list | length }}|"
                "{{ '3' | int + 1 }}|{{ 2 | float }}|{{ s | replace('b', 'B') }}|{{ -3 | abs }}|"
                "{{ l | map('string') | join('-') }}|{{ s | capitalize }}|{{ 5 | string }}",
     {"l": [1, 2, 3], "s": "ab", "ms": [{"role": "user"}, {"role": "assistant"}]}),
    ("tojson", "{{ v | tojson }}\n{{ v | tojson(indent=2) }}\n{{ v | tojson(sort_keys=true) }}\n"
               "{{ 'x\"\\\\ é\n\\t' | tojson }}{{ [] | tojson }}{{ {} | tojson(indent=4) }}",
     {"v": {"b": [1, 2.5, None, True, "ü<&>'"], "a": {"c": {}}, "n": 1e20, "f": 0.0001}}),
    ("print_values", "{{ none }} {{ true }} {{ 1.0 }} {{ [1, 'a', none, 1.5] }} {{ {'k': 'v'} }} "
                     "{{ ('t', 1) }} {{ (2,) }} {{ () }} {{ {'a': 1}.items() | list }} "
                     "{{ (1, 2) == [1, 2] }} {{ (1,) + (2,) }} {{ ('x', 2) | tojson }} "
                     "{{ undefined_y }}|{{ 1e16 }} {{ 123456.789 }} {{ 1e-5 }}", {}),
    ("set_forms", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}in {{ a }}\n{% endset %}[{{ t }}]"
                  "{% set l = [1, 2] + [3] %}{{ l }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}", {}),
    ("messages_reverse", "{% for m in messages[::-1] %}{{ (messages | length - 1) - loop.index0 }}"
                         "{{ m.role }} {% endfor %}{{ messages[0]['content'] | trim }}",
     {"messages": [{"role": "system", "content": " s "}, {"role": "user", "content": "u"}]}),
    ("raise", "{% if true %}{{ raise_exception('bad input') }}{% endif %}", {}),
    ("undefined_attr_error", "{{ nope.attr }}", {}),
    ("undefined_plus_error", "{{ 'a' + nope }}", {}),
    ("strftime", "{{ strftime_now('%Y') | length }}", {}),
    ("generation_tag", "{% for m in ms %}{% generation %}{{ m }}{% endgeneration %}{% endfor %}",
     {"ms": ["a", "b"]}),
    ("whitespace_mix", "{%- for m in ms -%}\n  <{{ m }}>\n{%- endfor %}\n  {{- 'end' }}\n",
     {"ms": ["a", "b"]}),
]


def random_text(rng):
    n = rng.randint(0, 8)
    return "".join(rng.choice(FRAGMENTS) + rng.choice(["", " ", "\n"]) for _ in range(n))


def random_conversation(rng):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": random_text(rng)})
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": random_text(rng)})
        answer = random_text(rng)
        if rng.random() < 0.2:
            answer = "<think>\n" + random_text(rng) + "\n</think>\n\n" + answer
        messages.append({"role": "assistant", "content": answer})
    if rng.random() < 0.3:  # a prompt without an answer
        messages.append({"role": "user", "content": random_text(rng)})
    return messages


FIXED_CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
    [{"role": "user", "content": "  padded  "}, {"role": "assistant", "content": "\n answer \n"}],
    [{"role": "user", "content": "Why?"},
     {"role": "assistant", "content": "<think>\nreason\n</think>\n\nBecause."},
     {"role": "user", "content": "Sure?"},
     {"role": "assistant", "content": "<think>again</think>Yes."}],
    [{"role": "system", "content": "日本語で答えて"}, {"role": "user", "content": "こんにちは 😀"},
     {"role": "assistant", "content": "こんにちは！"}],
]


def render(source, variables):
    try:
        return {"text": _compile_jinja_template(source).render(**variables)}
    except Exception as e:  # noqa: BLE001 - the C++ side must fail too
        return {"error": f"{type(e).__name__}: {e}"}


def write_snippets(out):
    with open(os.path.join(out, "snippets.jsonl"), "w", encoding="utf-8") as f:
        for name, source, variables in SNIPPETS:
            case = {"name": name, "source": source, "variables": variables}
            case.update(render(source, variables))
            f.write(json.dumps(case, ensure_ascii=False) + "\n")


def write_fixtures(out, tok, rng):
    conversations = FIXED_CONVERSATIONS + [random_conversation(rng) for _ in range(60)]
    with open(os.path.join(out, "fixtures.jsonl"), "w", encoding="utf-8") as f:
        for path in sorted(glob.glob(os.path.join(FIXTURES, "*.jinja"))):
            name = os.path.basename(path)[:-len(".jinja")]
            source = open(path, encoding="utf-8").read()
            extras = [{}]
            if name == "qwen3":
                extras += [{"enable_thinking": False}, {"enable_thinking": True}]
            if name.startswith("llama3"):
                extras += [{"date_string": "01 Jan 2025"}]
            for messages in conversations:
                for agp in (False, True):
                    for extra in extras:
                        kwargs = dict(SPECIALS[name], **extra)
                        text = tok.apply_chat_template(messages, chat_template=source,
                                                       tokenize=False, add_generation_prompt=agp,
                                                       **kwargs)
                        variables = dict(tok.special_tokens_map, **kwargs)
                        variables.update({"tools": None, "documents": None,
                                          "add_generation_prompt": agp})
                        f.write(json.dumps({"template": name, "source": source,
                                            "variables": variables, "messages": messages,
                                            "today": datetime.datetime.now().strftime("%d %b %Y"),
                                            "text": text}, ensure_ascii=False) + "\n")


def smollm2_mask(tok, messages, text, agp):
    """Assistant content + <|im_end|> spans, rebuilt here from the ChatML layout."""
    rebuilt, spans = "", []
    if messages[0]["role"] != "system":
        rebuilt += ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n")
    for m in messages:
        rebuilt += "<|im_start|>" + m["role"] + "\n"
        start = len(rebuilt)
        rebuilt += m["content"] + "<|im_end|>"
        if m["role"] == "assistant":
            spans.append((start, len(rebuilt)))
        rebuilt += "\n"
    if agp:
        rebuilt += "<|im_start|>assistant\n"
    assert rebuilt == text, (rebuilt, text)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= s < b for a, b in spans)) for s, _ in enc["offset_mapping"]]
    byte_spans = [[len(text[:a].encode()), len(text[:b].encode())] for a, b in spans]
    return enc["input_ids"], mask, byte_spans


def write_smollm2(out, rng):
    models = os.environ.get("DFLASH_MODELS", os.path.expanduser("~/.local/share/dflash/models"))
    model_dir = os.path.join(models, "SmolLM2-135M-Instruct")
    tok = AutoTokenizer.from_pretrained(model_dir)
    conversations = FIXED_CONVERSATIONS + [random_conversation(rng) for _ in range(100)]
    with open(os.path.join(out, "smollm2.jsonl"), "w", encoding="utf-8") as f:
        for messages in conversations:
            for agp in (False, True):
                text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp)
                ids, mask, spans = smollm2_mask(tok, messages, text, agp)
                f.write(json.dumps({"messages": messages, "add_generation_prompt": agp,
                                    "text": text, "ids": ids, "mask": mask, "spans": spans},
                                   ensure_ascii=False) + "\n")
    with open(os.path.join(out, "paths.json"), "w") as f:
        json.dump({"smollm2_dir": model_dir}, f)
    return tok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(20261204)
    write_snippets(args.out)
    tok = write_smollm2(args.out, rng)
    write_fixtures(args.out, tok, rng)


if __name__ == "__main__":
    main()
