#!/bin/sh
# What composespawner's NvmlSource reads from a real GPU as a notebook's kernel holds it,
# idles, works, idles and exits (check.py): processes, utilisation and memory at each
# step, beside nvidia-smi's figures, to check the reclaim policy's inputs and choose its
# memory floor. Needs nvcc, python3 and a GPU with nothing else running on it; no
# network: nvidia-ml-py comes from the wheel beside this script, the rest from the repo.
# Writes $OUT/gpu_activity_check.json (or ./gpu_activity_check.json); exits 1 if a
# check failed. Takes about a minute.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${OUT:-.}
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
nvcc -O2 -cudart static -o "$build/holder" "$here/holder.cu"
# A pure-Python wheel imports straight from its zip file.
wheel=$(ls "$here"/wheels/nvidia_ml_py-*.whl | head -n 1)
cd "$repo"
PYTHONPATH="$wheel:$repo" python3 -m benchmarks.gpu_activity_check.check "$build/holder" "$out"
