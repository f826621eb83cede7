#!/usr/bin/env sh
# Install promtool (Prometheus's rule and config checker) so that tests/test_monitoring.py runs
# `promtool check rules` / `promtool check config` instead of skipping them.
#
# Debian/Ubuntu: the `prometheus` package ships /usr/bin/promtool (Debian 12: 2.42.0). Its
# post-install starts no server where there is no systemd (containers, CI); elsewhere run
# `systemctl disable --now prometheus` if only promtool is wanted.
# Elsewhere: take promtool from a release tarball, https://prometheus.io/download/.
set -eu
if command -v promtool >/dev/null 2>&1; then
    promtool --version 2>&1 | head -n 1
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-promtool: no apt-get here; get promtool from https://prometheus.io/download/" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends prometheus
promtool --version 2>&1 | head -n 1
