#!/usr/bin/env bash
# CI for the Ascend backend against the real AscendCL headers (no CANN, no NPU needed):
# the PyPI wheel torch-npu 2.14.0 ships acl/acl.h and acl_rt.h (ACL 1.17) under
# torch_npu/include/third_party/acl/inc. Only those headers are extracted (torch_npu is not
# installed); ferrattn-ascend is then built with feature `bindgen` against them and its test
# `acl::tests::checked_in_module_matches_bindgen` compares every entry point the loader resolves
# with the generated declarations.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${FERRATTN_CI_CACHE:-${TMPDIR:-/tmp}/ferrattn-ci-ascend}"
mkdir -p "$WORK"
WHEEL_GLOB="$WORK/torch_npu-2.14.0-*.whl"

echo "== AscendCL headers from the torch-npu 2.14.0 wheel"
if ! compgen -G "$WHEEL_GLOB" >/dev/null; then
  command -v pip >/dev/null || { apt-get update -qq && apt-get install -y -qq python3-pip; }
  pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
    torch-npu==2.14.0 -d "$WORK"
fi
WHEEL="$(compgen -G "$WHEEL_GLOB" | head -n 1)"
INC="$WORK/acl-inc"
rm -rf "$INC"
python3 - "$WHEEL" "$INC" <<'EOF'
import sys, zipfile, os
wheel, out = sys.argv[1], sys.argv[2]
prefix = "torch_npu/include/third_party/acl/inc/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and name.endswith(".h"):
            dst = os.path.join(out, name[len(prefix):])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as f:
                f.write(z.read(name))
EOF
test -f "$INC/acl/acl.h" && test -f "$INC/acl/acl_rt.h"
echo "$(find "$INC" -name '*.h' | wc -l) headers from $(basename "$WHEEL")"

echo "== libclang for bindgen"
# libclang itself (libclang.so / libclang-N.so), not libclang-cpp, which LLVM installs alone
have_libclang() {
  compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null ||
    compgen -G "/usr/lib/llvm-*/lib/libclang-[0-9]*.so*" >/dev/null ||
    compgen -G "/usr/lib/x86_64-linux-gnu/libclang-[0-9]*.so*" >/dev/null
}
if [ -z "${LIBCLANG_PATH:-}" ] && ! have_libclang; then
  apt-get update -qq && apt-get install -y -qq libclang-dev
fi

echo "== ferrattn-ascend --features bindgen against the real headers"
export FERRATTN_ACL_INCLUDE="$INC"
cargo build -p ferrattn-ascend --features bindgen
cargo test -p ferrattn-ascend --features bindgen --lib acl::tests
