"""Reference features of tiny random Qwen3.5 checkpoints, from transformers 5.

Qwen3.5 (model_type qwen3_5, qwen3_5_moe) exists only in transformers 5, while the other oracles
pin 4.57. scripts/setup.sh installs transformers 5 and its dependencies into their own folder,
<venv>/oracle-transformers5 (scripts/requirements-oracle-transformers5.txt), which this script puts
first on sys.path; where the interpreter's own transformers already has Qwen3.5 (the GPU machine's
5.17) the folder is not needed.

Writes, like hf_oracle.py, save_pretrained checkpoints (fp32) and the outputs of chosen decoder
layers per document for a packed batch:
  qwen3_5/      vision-language checkpoint (model.language_model.*, model.visual.*): dense MLP
  qwen3_5_moe/  the same with a sparse MLP (8 experts, top 2, stacked) and a shared expert
  qwen3_5_generate.safetensors, qwen3_5_moe_generate.safetensors: greedy generate() outputs
"""

import argparse
import os
import sys

_SITE = os.path.join(sys.prefix, "oracle-transformers5")
if os.path.isdir(_SITE):
    sys.path.insert(0, _SITE)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import transformers  # noqa: E402

if int(transformers.__version__.split(".")[0]) < 5:
    sys.exit(f"transformers {transformers.__version__} has no Qwen3.5; run scripts/setup.sh "
             f"(installs transformers 5 into {_SITE})")

from transformers import (Qwen3_5Config, Qwen3_5ForConditionalGeneration,  # noqa: E402
                          Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration)

import hf_oracle  # noqa: E402

LAYER_TYPES = ["linear_attention", "linear_attention", "full_attention", "linear_attention",
               "full_attention"]


def text_config(**extra):
    config = hf_oracle.hybrid_text_config(LAYER_TYPES)
    config.pop("attn_implementation")
    config.pop(hf_oracle.DTYPE_KEY)
    # Text-only positions are equal on the three M-RoPE axes, where M-RoPE is plain RoPE.
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True}
    config.update(extra)
    return config


def vision_config(out_hidden_size):
    return dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=out_hidden_size,
                num_position_embeddings=16)


def build(config_cls, model_cls, text):
    config = config_cls(text_config=text, vision_config=vision_config(text["hidden_size"]),
                        tie_word_embeddings=False, attn_implementation="eager",
                        **{hf_oracle.DTYPE_KEY: "float32"})
    model = model_cls(config).eval()
    hf_oracle.randomize_hybrid(model)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(4321)
    generator = torch.Generator().manual_seed(43)
    layers = list(range(len(LAYER_TYPES)))

    dense = build(Qwen3_5Config, Qwen3_5ForConditionalGeneration, text_config())
    dense.save_pretrained(os.path.join(args.out, "qwen3_5"))
    hf_oracle.write_refs(dense, layers, os.path.join(args.out, "qwen3_5_refs.safetensors"),
                         generator, hf_oracle.HYBRID_DOC_LENGTHS)

    moe_text = text_config(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                           shared_expert_intermediate_size=48)
    moe_text.pop("intermediate_size")
    moe = build(Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, moe_text)
    moe.save_pretrained(os.path.join(args.out, "qwen3_5_moe"))
    hf_oracle.write_refs(moe, layers, os.path.join(args.out, "qwen3_5_moe_refs.safetensors"),
                         generator, hf_oracle.HYBRID_DOC_LENGTHS)

    # Greedy generate() of text-only prompts (the conv and recurrent states in its cache).
    gen_generator = torch.Generator().manual_seed(8)
    hf_oracle.write_generations(dense, os.path.join(args.out, "qwen3_5_generate.safetensors"),
                                gen_generator)
    hf_oracle.write_generations(moe, os.path.join(args.out, "qwen3_5_moe_generate.safetensors"),
                                gen_generator)
    return 0


if __name__ == "__main__":
    sys.exit(main())
