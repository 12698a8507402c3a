#!/usr/bin/env bash
# The issue-12 GPU check: the example trainer's wgpu build through a real Vulkan driver, at the
# 1 GB and 4 GB shapes: stall, lost time per save, state held at the next update and device
# memory one step after a save, ours with default flags beside Burn's checkpointer
# (`bench_defaults --sizes '' --cubecl-sizes 1gb,4gb`).
#
#   scripts/gpu-check.sh prepare   # here: release build with wgpu, stripped binaries packed into
#                                  # target/gpu-check/bins.tar.xz (under the device tool's 64 MiB carry)
#   scripts/gpu-check.sh run       # on the GPU machine (carry target/gpu-check): unpacks them and
#                                  # writes REPORT.md and report.json under $OUT (or target/gpu-check/out),
#                                  # within a 280 s budget (CUBECL_SIZES=38mb tries it on lavapipe)
set -euo pipefail
cd "$(dirname "$0")/.."
pack=target/gpu-check
case "${1:-}" in
prepare)
    cargo build --release --features wgpu --example train --example bench_defaults
    mkdir -p "$pack/bin"
    for b in train bench_defaults; do
        cp "target/release/examples/$b" "$pack/bin/$b"
        strip "$pack/bin/$b"
    done
    tar -C "$pack" -cJf "$pack/bins.tar.xz" bin
    rm -rf "$pack/bin"
    ls -l "$pack/bins.tar.xz"
    ;;
run)
    work=$(mktemp -d)
    tar -C "$work" -xJf "$pack/bins.tar.xz"
    out=${OUT:-$pack/out}
    mkdir -p "$out"
    gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)
    vk=$( (vulkaninfo --summary 2>/dev/null || true) | grep -m1 -i "deviceName" | sed 's/.*= *//' || true)
    echo "GPU: ${gpu:-unknown}; Vulkan device: ${vk:-unknown (no vulkaninfo)}"
    # The bench stops between runs only; the timeout bounds the whole check.
    timeout 280 "$work/bin/bench_defaults" --train "$work/bin/train" --dir "$work/runs" \
        --sizes "" --budgets "" --cubecl-sizes "${CUBECL_SIZES:-1gb,4gb}" \
        --note "GPU: ${gpu:-unknown}, Vulkan device: ${vk:-unknown}" --out "$out"
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
