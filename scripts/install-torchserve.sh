#!/usr/bin/env sh
# Install what tests/test_torchserve_real.py needs to run real TorchServe instead of skipping:
# a Java runtime (TorchServe 0.12 needs Java 11+; apt: Debian 12 has openjdk-17-jre-headless)
# and torchserve + torch-model-archiver 0.12.0 (pip, into the current Python: the one that
# runs the tests and TorchServe's workers, where embeddb is installed).
# These are test tools, not embeddb dependencies.
set -eu
TORCHSERVE_VERSION="${TORCHSERVE_VERSION:-0.12.0}"
PYTHON="${PYTHON:-python3}"
if ! command -v java >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-torchserve: no apt-get here; install a Java 11+ runtime, then rerun" >&2
        exit 1
    fi
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless
fi
java -version 2>&1 | head -n 1
"$PYTHON" -m pip install "torchserve==${TORCHSERVE_VERSION}" \
    "torch-model-archiver==${TORCHSERVE_VERSION}"
torchserve --version
