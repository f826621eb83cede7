#!/usr/bin/env sh
# Install the real third-party components that some tests run against instead of skipping:
# TorchServe 0.12 (tests/test_torchserve_real.py, tests/test_wheel.py), promtool
# (tests/test_monitoring.py), buf (tests/test_proto_buf.py) and iproute2's ip and tc
# (tests/test_partitions.py: network namespaces, veth, tbf; needs root). Each is a test tool, not an
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
if ! { command -v ip && command -v tc; } >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 \
            || echo "install-test-tools: iproute2 could not be installed; its tests will skip" >&2
    else
        echo "install-test-tools: no ip/tc and no root apt-get; the partition tests will skip" >&2
    fi
fi
exit 0
