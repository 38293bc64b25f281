#!/bin/sh
# Four holders of quarter shares of one GPU, as composespawner starts them on a host:
# each selects the GPU by UUID (CUDA_VISIBLE_DEVICES=GPU-<uuid>) and is told its share.
# Checks that all four see the same GPU, hold memory at once, and run at the same time
# (time-slicing), and that the host agent's GPU list finds the UUID in nvidia-smi's output.
# Writes $OUT/gpu_share_check.json (or ./gpu_share_check.json). Needs nvcc and a GPU.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-.}
nvcc -O2 -cudart static -o "$out/share_probe" "$here/share_probe.cu"
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n 1)
nvidia-smi --query-gpu=uuid --format=csv,noheader > "$out/nvidia_smi_uuids.txt"
for i in 1 2 3 4; do
  CUDA_VISIBLE_DEVICES="$uuid" COMPOSE_GPU_SHARE=1/4 COMPOSE_GPU_MEMORY_FRACTION=0.25 \
    "$out/share_probe" > "$out/holder$i.json" &
done
sleep 1.5
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader \
  > "$out/compute_apps.txt" || true
wait
PYTHONPATH="$here/../.." python3 "$here/summarise.py" "$uuid" "$out"
