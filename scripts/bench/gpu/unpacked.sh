# Sourced by a device run (run48.sh, run49.sh) from the repository root on the GPU machine, with
# `out` (or OUT) set and NAME as its argument: unpacks the pack of `gpu_tests.sh pack` (.gpu/t) into
# build/, sets the libraries' path (.devdeps/env.sh, CUDA), `py` (the device's PyTorch python) and
# writes the run's first log line (revision, time, GPU).
rm -rf build && mkdir -p build && tar -xzf .gpu/t/gt.tgz -C build
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
py=/opt/torch/.venv/bin/python3; [ -x "$py" ] || py=python3
out=${out:-${OUT:?set out or OUT to the folder the results go to}}
echo "[$1] built at $(cat .gpu/t/gt.rev), $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee -a "$out/log"
