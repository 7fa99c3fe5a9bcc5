#!/usr/bin/env bash
# Downloads every wheel the two peer step scripts (specforge_step.py, speculators_step.py) need that
# the GPU machine's /opt/torch/.venv may lack, for Ubuntu 24.04 / CPython 3.12 / x86-64, into
# WHEELS_DIR; run_peers.sh installs them there with `pip install --no-index --no-deps --target`.
# Run it where PyPI is reachable (the GPU machine reaches no registry).
#
#   scripts/bench/peers/wheels.sh WHEELS_DIR
#
# Env: PY_VERSION (default 3.12, the GPU machine's; 3.11 fetches the same pins for this CPU host's
# Python, to rehearse run_peers.sh here), PYTHON (the pip to run, default python3).
#
# Assumed present on the GPU machine: torch 2.11 and its own dependencies (numpy, filelock, fsspec,
# jinja2, networkx, sympy, triton, nvidia-*); nothing here downloads those. Everything else is
# fetched, pinned to the versions the CPU smoke test ran with, each with --no-deps (the full
# dependency closure is the list below; `pip install` of the peers with their declared
# dependencies would pull sglang / vllm-side packages, datasets, wandb, tensorboard, torchvision,
# torchaudio, ...: none is imported by the DFlash training step):
#   - the peers: specforge 0.2.0 (installed without its declared deps: sglang==0.5.14, datasets,
#     wandb, yunchang, openai-harmony, tensorboard, accelerate, ... none imported by the modules the
#     step uses), speculators 0.9.0 and its hs-connectors 0.9.0 (imported at package import);
#   - transformers 5.8.1 (specforge pins it; speculators allows 5.0..5.19) and its dependencies;
#   - pydantic / pydantic-settings / python-dotenv (speculators' config), loguru, rich, psutil,
#     openai (speculators.train.data imports it at module level) and openai's httpx2 stack.
# Not fetched: `datasets` (speculators.train.data imports `load_from_disk` at module level; with
# pyarrow, pandas, dill, multiprocess it is ~60 MB): speculators_step.py puts a stand-in module in
# sys.modules when `datasets` is missing; the step never calls it.
#
# Prints the total size; it must stay under 60 MB (it is about 27 MB), else the script fails.
set -euo pipefail
dir=${1:?usage: wheels.sh WHEELS_DIR}
py=${PYTHON:-python3}
mkdir -p "$dir"

pins=(
  # the peers
  specforge==0.2.0 speculators==0.9.0 hs-connectors==0.9.0
  # transformers and its dependencies (numpy: torch's)
  transformers==5.8.1 huggingface-hub==1.33.0 tokenizers==0.22.2 safetensors==0.8.0
  regex==2026.12.2 pyyaml==6.0.4 packaging==26.4 tqdm==4.70.1 hf-xet==1.8.0
  typer==0.29.2 click==8.5.1 rich==15.0.0 shellingham==1.5.4 markdown-it-py==4.3.0 mdurl==0.1.2
  pygments==2.21.0 annotated-doc==0.0.7
  httpx==0.29.0 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 idna==3.21 certifi==2026.10.19.post1
  typing-extensions==4.16.0
  # speculators' own imports
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  pydantic-settings==2.16.3 python-dotenv==1.2.4 loguru==0.7.3 psutil==7.2.2
  openai==3.63.0 httpx2==2.17.0 httpcore2==2.17.0 jiter==0.19.0 sniffio==1.3.1 truststore==0.10.5
)
platforms=()
for p in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
  platforms+=(--platform "$p")
done
pyver=${PY_VERSION:-3.12}
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp --abi "cp${pyver/./}" --abi abi3 --abi none "${platforms[@]}" -d "$dir" \
  "${pins[@]}"

# Nothing torch-owned may travel (it would shadow the machine's CUDA build).
shopt -s nullglob
for f in "$dir"/torch-*.whl "$dir"/nvidia_*.whl "$dir"/triton-*.whl "$dir"/numpy-*.whl; do
  echo "wheels.sh: unexpected $(basename "$f"), removed" >&2
  rm -f "$f"
done
count=$(ls "$dir"/*.whl | wc -l)
bytes=$(cat "$dir"/*.whl | wc -c)
echo "wheels.sh: $count wheels, $bytes bytes ($(( bytes / 1048576 )) MiB) in $dir"
if [ "$bytes" -ge $(( 60 * 1000 * 1000 )) ]; then
  echo "wheels.sh: the bundle is over 60 MB; split it before carrying it" >&2
  exit 1
fi
