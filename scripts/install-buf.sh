#!/usr/bin/env sh
# Install buf (https://buf.build, the protobuf linter and RPC client) so that
# tests/test_proto_buf.py runs `buf lint`, `buf breaking` and `buf curl` instead of skipping.
#
# buf is published on npm as @bufbuild/buf (a prebuilt binary per platform, no build step);
# this needs node >= 18 and npm. Without npm: https://buf.build/docs/installation.
set -eu
BUF_VERSION="${BUF_VERSION:-1.75.0}"
if command -v buf >/dev/null 2>&1; then
    echo "buf $(buf --version)"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "install-buf: npm is not installed; see https://buf.build/docs/installation" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ] && [ -z "${NPM_CONFIG_PREFIX:-}" ]; then
    SUDO="sudo"
fi
$SUDO npm install --global --no-audit --no-fund "@bufbuild/buf@${BUF_VERSION}"
echo "buf $(buf --version)"
