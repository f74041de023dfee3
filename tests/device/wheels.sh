#!/usr/bin/env bash
# The wheels a device run needs, into the ignored .whl/ (carry it): the shared script's list
# (numpy 2.4, nvmath-python, gguf, textual, ...) plus the serve extra and what it pulls in,
# which the GPU machine's image lacks (without them `tinychat serve`, `bench serve` and
# tests/device/serve_timeline.py fail there with "No module named 'uvicorn'" / 'pydantic').
#   bash tests/device/wheels.sh          (here, from the repository root, before the call)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bash ../shared/device/wheels.sh starlette uvicorn httptools uvloop pydantic pydantic_core \
  annotated_types typing_inspection typing_extensions click h11 anyio sniffio idna \
  prometheus_client httpx httpcore certifi "$@"
