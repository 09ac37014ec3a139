#!/usr/bin/env bash
# The unit tests of formats and runtime (every kernel: NEON on aarch64, candle's NEON k-quants,
# io_uring, the record checks) cross-compiled for aarch64-unknown-linux-gnu and run under
# qemu-user, after clippy on the same target. Part of `make test`; scripts/setup_test_deps.sh
# installs the cross gcc, qemu-user (Debian) and the Rust target. Timings under qemu mean nothing: this checks results only.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
# its own target directory: the host build's lock is not held while this compiles
# clippy first: the host's lint never sees the aarch64-only code (the NEON kernels)
${CARGO:-cargo} clippy --release --target aarch64-unknown-linux-gnu --target-dir target/cross -p formats -p runtime --lib --tests -- -D warnings
exec ${CARGO:-cargo} test --release --target aarch64-unknown-linux-gnu --target-dir target/cross -p formats -p runtime --lib
