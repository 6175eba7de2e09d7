#!/usr/bin/env bash
# The checks that need a GPU, on one GPU machine (the device tool's, or any CUDA host with torch):
#
#   1. the bootstrap's stage 2 in check-only mode, as a cloud node runs it: torch sees the GPUs
#      and has kernels for them, nccl.env, then an NCCL all_reduce over every GPU (verify);
#   2. `cloudtrain preflight` on a one-node local cluster: NCCL all-reduce bandwidth over sizes
#      and nvidia-smi's health, judged as on a cloud cluster;
#   3. `cloudtrain train --start-method fork` twice on CUDA (cold, then warm: the agent forked
#      from the node's server with torch imported), and once with spawn, each training
#      examples/digits_ddp.py on cuda:0 under NCCL.
#
#   bash bench/gpu_check.sh [WHEEL_DIR]
#
# WHEEL_DIR holds cloudtrain's wheel and what the machine's Python lacks (platformdirs): they go
# to a private target, so the machine's torch is the one used. Prints every figure; exits non-zero
# when a check fails.
set -uo pipefail
wheels=$(realpath "${1:-.whl}")
repo=$(pwd)
work=$(mktemp -d)
cd "$work" || exit  # not the checkout: its cloudtrain/ would shadow the installed one
trap 'python3 -m cloudtrain.cli down gpu1 >/dev/null 2>&1; rm -rf "$work"' EXIT
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$wheels"/*.whl || exit 1
  export PYTHONPATH="$work/site"
fi
export CLOUDTRAIN_HOME="$work/home" PYTHONUNBUFFERED=1
failed=0
check() { printf '\n== %s\n' "$1"; shift; "$@" || { echo "FAILED ($?): $*"; failed=1; }; }

gpus=$(nvidia-smi -L | grep -c '^GPU ')
check "the machine" bash -c 'nvidia-smi -L; python3 -c "import torch; print(\"torch\", torch.__version__, \"CUDA\", torch.version.cuda, \"NCCL\", torch.cuda.nccl.version())"'

printf 'CT_ROOT=%s\nCT_INSTALL=0\nCT_PYTHON=python3\nCT_PHASES="torch nccl verify"\nCT_GPU_COUNT=%s\nCT_ACCELERATOR=H200\n' \
  "$work/node" "$gpus" >"$work/bootstrap.env"
check "bootstrap stage 2, check-only (torch, nccl, verify)" \
  python3 -m cloudtrain.node.bootstrap run "$work/bootstrap.env"
check "its verify log" cat "$work/node/bootstrap/logs/verify.log"
check "its status" python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["state"]); [print(" ", p) for p in s["phases"]]' \
  "$work/node/bootstrap/status.json"

check "up: a one-node local cluster" python3 -m cloudtrain.cli up --provider local --nodes 1 --name gpu1 --no-preflight
if [ "$gpus" -ge 2 ]; then
  check "preflight (NCCL all-reduce over sizes, nvidia-smi health)" \
    python3 -m cloudtrain.cli preflight gpu1 --max-mib 1024
else  # one rank has no collective to time; two local nodes share the one GPU
  check "up: two local nodes on the one GPU" \
    python3 -m cloudtrain.cli up --provider local --nodes 2 --name gpu2 --no-preflight
  check "preflight across them (NCCL refuses two ranks on one GPU: a clear error expected)" \
    python3 -m cloudtrain.cli preflight gpu2 --max-mib 256 --timeout 60
  python3 -m cloudtrain.cli down gpu2 >/dev/null 2>&1
fi
for start in fork fork spawn; do
  check "train --start-method $start (digits_ddp.py on CUDA)" bash -c \
    "time python3 -m cloudtrain.cli train -c gpu1 --no-live --nproc-per-node $gpus --start-method $start \"$repo/examples/digits_ddp.py\" --epochs 3"
done
check "the status" python3 -m cloudtrain.cli status gpu1
exit $failed
