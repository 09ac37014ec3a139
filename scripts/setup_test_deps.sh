#!/usr/bin/env bash
# The full test tier's system dependencies: libfuse2 (Debian) and fusepy (PyPI) for
# scripts/faultfs.py, the FUSE file system that injects read faults (tests/faults.rs); time
# (Debian) for bench-edge; the openai client (PyPI) that drives runtime serve (tests/serve.rs);
# the aarch64 cross gcc, qemu-user (Debian) and Rust's aarch64 target for scripts/test_aarch64.sh. Idempotent; needs root (as the full tier does).
set -euo pipefail
if ! ldconfig -p 2>/dev/null | grep -q 'libfuse.so.2'; then
  echo "setup: installing libfuse2 (Debian)"
  (apt-get install -y -qq libfuse2 >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq libfuse2 >/dev/null; })
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  echo "setup: installing gcc-aarch64-linux-gnu and qemu-user (Debian)"
  (apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null; })
fi
if ! rustup target list --installed 2>/dev/null | grep -q aarch64-unknown-linux-gnu; then
  echo "setup: adding the Rust target aarch64-unknown-linux-gnu (rustup)"
  rustup target add aarch64-unknown-linux-gnu >/dev/null
fi
if ! python3 -c "import fuse" 2>/dev/null; then
  echo "setup: installing fusepy (PyPI)"
  python3 -m pip install --quiet --root-user-action=ignore fusepy==3.0.1
fi
if ! python3 -c "import openai" 2>/dev/null; then
  echo "setup: installing openai (PyPI)"
  python3 -m pip install --quiet --root-user-action=ignore openai==3.57.0
fi
