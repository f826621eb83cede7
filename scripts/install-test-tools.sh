#!/usr/bin/env sh
# Install the real third-party components that some tests run against instead of skipping:
# TorchServe 0.12 (tests/test_torchserve_real.py, tests/test_wheel.py), promtool
# (tests/test_monitoring.py) and buf (tests/test_proto_buf.py). Each is a test tool, not an
# embeddb dependency. .ci/run calls this before the test command; a tool that cannot be
# installed here is reported and its tests skip with the reason, so this script never fails
# the run by itself.
set -u
here="$(dirname "$0")"

for tool in torchserve promtool buf; do
    if ! sh "$here/install-$tool.sh"; then
        echo "install-test-tools: $tool could not be installed; its tests will skip" >&2
    fi
done
exit 0
