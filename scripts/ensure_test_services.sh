#!/usr/bin/env bash
# What the test suite needs beyond pip: installed from Debian's packages when missing (as root), so that
# `make test` does all set-up on a fresh machine. Fast when everything is there.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# the local-cluster test puts nginx in front of the gateways; the alert-rule and dashboard tests run Prometheus
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "the tests need these Debian packages: ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
