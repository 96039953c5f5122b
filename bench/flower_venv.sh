#!/usr/bin/env bash
# A separate, benchmark-only venv with Flower (flwr) for bench/fl_flower.py.
#
# flwr pins fastapi/uvicorn/protobuf/typer versions that conflict with the project's .venv, so it
# lives in its own venv at the repo root (.venv-flower, git-ignored). Plinth goes in with --no-deps:
# the aggregation engine needs only numpy and numba (plus scipy and threadpoolctl for
# the benchmark), installed explicitly.
#
#     bash bench/flower_venv.sh            # create or update .venv-flower
#     .venv-flower/bin/python bench/fl_flower.py --json results/fl_flower.json
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FLOWER_VENV:-.venv-flower}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "flwr${FLWR_VERSION:+==$FLWR_VERSION}" numpy numba scipy threadpoolctl rich
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/python" - <<'PY'
import flwr, numba, numpy, scipy, threadpoolctl
import plinth.fl.aggregate.engine  # noqa: F401  (the engine imports with numpy+numba)
print(f"{__import__('sys').prefix}: flwr {flwr.__version__}, numpy {numpy.__version__}, "
      f"numba {numba.__version__}, scipy {scipy.__version__}, threadpoolctl {threadpoolctl.__version__}; plinth engine OK")
PY
