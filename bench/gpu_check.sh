#!/usr/bin/env bash
# The checks that need the lent GPU machine (one H200, 16 cores), as one run of the `device`
# tool. Everything it prints and writes lands in $OUT (logs and JSON, read back afterwards).
#
#   machine:  what the runtime finds there: GPUs by NVML, MPS, cgroup v2 or rlimits;
#   platform: bench/gpu_platform.py: 4 jobs at gpu_fraction 0.25 through MPS against one at a
#             time, and a job over its MPS memory limit refused;
#   tree:     bench/fl_tree.py on 16 cores, the LIFL tree against the flat engine in process;
#   grpc:     the same through real gRPC on loopback;
#   elastic:  resources per round, the elastic tree against an always-on one of 8 leaves.
#
# That machine has the image's python3 with torch but not all of Plinth's dependencies and no
# registry: their wheels travel in .whl (ignored by git), made here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl
# and carried:  run(command="bash bench/gpu_check.sh", carry=[".whl"]); PARTS picks the parts.
set -u
PARTS=" ${PARTS:-machine platform tree grpc elastic} "
OUT=${OUT:-/tmp/plinth-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=python3
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl \
    2>&1 | tail -3
fi
# Workers inherit only PATH, HOME and LANG (runtime/local.py), so plinth is made importable
# through a .pth file in python3's own site-packages, and `python` must be on PATH.
echo "$PWD/src" > "$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/plinth-src.pth"
command -v python >/dev/null || ln -s "$(command -v $PY)" /usr/local/bin/python
# Whatever runs, the control plane's imports must all be there.
$PY -c "import plinth.control.api, plinth.control.service" || exit 1

if [[ $PARTS == *" machine "* ]]; then
  {
    date -u; nproc
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv
    echo "mps control: $(command -v nvidia-cuda-mps-control || echo missing)"
    $PY -c "
import tempfile, torch
from pathlib import Path
from plinth.runtime.local import LocalRuntime
print('torch', torch.__version__, 'cuda', torch.cuda.is_available())
rt = LocalRuntime(Path(tempfile.mkdtemp()) / 'rt')
print(rt.describe())
rt.close()"
  } 2>&1 | tee "$OUT/machine.log"
fi
if [[ $PARTS == *" platform "* ]]; then
  timeout 240 $PY bench/gpu_platform.py --steps 3000 --json "$OUT/gpu_platform.json" 2>&1 \
    | tee "$OUT/gpu_platform.log"
fi
if [[ $PARTS == *" tree "* ]]; then
  timeout 150 $PY bench/fl_tree.py --only time --params 1e6,1e7 --updates 100,1000 \
    --leaves 1,2,4,8,auto --json "$OUT/fl_tree_time.json" 2>&1 | tee "$OUT/fl_tree_time.log"
fi
if [[ $PARTS == *" grpc "* ]]; then
  timeout "${GRPC_S:-120}" $PY bench/fl_tree.py --only grpc --params "${GRPC_PARAMS:-1e6,1e7}" \
    --updates "${GRPC_UPDATES:-100,1000}" --leaves "${GRPC_LEAVES:-1,4,8}" --clients 8 \
    --json "$OUT/fl_tree_grpc.json" 2>&1 | tee "$OUT/fl_tree_grpc.log"
fi
if [[ $PARTS == *" elastic "* ]]; then
  timeout 150 $PY bench/fl_tree.py --only elastic --counts 10,100,10,100,30,10 --max-leaves 8 \
    --elastic-params "${ELASTIC_PARAMS:-1e6}" --deadline 0.05 --json "$OUT/fl_tree_elastic.json" 2>&1 | tee "$OUT/fl_tree_elastic.log"
fi
echo "gpu_check done"
