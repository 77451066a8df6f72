#!/usr/bin/env bash
# Type-checks ascend-kernels/amla/amla_decode.cpp with clang against the real open-source AscendC
# headers (asc-devkit: include/kernel_operator.h with its impl/, the NPU path for dav-c220),
# once as the cube pass (__DAV_C220_CUBE__) and once as the vector pass (__DAV_C220_VEC__),
# which is how bisheng compiles a mixed kernel.
#
#   scripts/ascend-check-headers.sh /path/to/asc-devkit      (a checkout kept outside this repo)
#
# Only the bisheng compiler's built-ins have stand-ins here: its keywords (__aicore__, the
# address-space qualifiers as clang address spaces, with GM the default one as on the device, pipe annotations), its scalar types
# (half, bfloat16_t), its enums (pipe_t, event_t, ...), and its intrinsic functions
# (copy_gm_to_ubuf, set_flag, ...), which the script declares as generic functions from the
# "undeclared identifier" errors clang reports inside the asc-devkit tree (never for names used in
# the kernel itself). The advanced API (include/adv_api, which needs CANN's generated
# kernel_tiling.h) is skipped through its include guards; the kernel uses the basic API only.
# Exit status 0 when both passes have no error at all.
set -euo pipefail
ASC="${1:?usage: $0 /path/to/asc-devkit}"
ASC="$(cd "$ASC" && pwd)"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
KERNEL="$ROOT/ascend-kernels/amla/amla_decode.cpp"
CLANG="${CLANG:-clang++}"
command -v "$CLANG" >/dev/null || { echo "needs clang++ (apt-get install clang)"; exit 2; }
[ -f "$ASC/include/kernel_operator.h" ] || { echo "$ASC has no include/kernel_operator.h"; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cat > "$WORK/ccec_builtins.h" <<'EOF'
// Stand-ins for the bisheng (ccec) compiler's built-in types and enums (dav-c220).
#pragma once
#include <cstddef>
#include <cstdint>
struct __ccec_float16 {
  float v;
  constexpr __ccec_float16() : v(0) {}
  template <class T>
  constexpr __ccec_float16(T x) : v(float(x)) {}
  constexpr operator float() const { return v; }
};
struct half : __ccec_float16 { using __ccec_float16::__ccec_float16; };
struct bfloat16_t : __ccec_float16 { using __ccec_float16::__ccec_float16; };
enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_MTE4, PIPE_MTE5, PIPE_V2, PIPE_FIX, PIPE_NUM };
enum event_t { EVENT_ID0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };
enum class cache_line_t { SINGLE_CACHE_LINE, ENTIRE_DATA_CACHE };
enum class dcci_dst_t { CACHELINE_ALL, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
enum class mem_dsb_t { DSB_ALL, DSB_DDR, DSB_UB, DSB_SEQ };
enum addr_cal_mode_t { inc, dec };
enum vector_addr_reg_t { VA0, VA1, VA2, VA3, VA4, VA5, VA6, VA7 };
enum vector_half_t { L128, H128 };
enum class Order_t { VALUE_INDEX, INDEX_VALUE, ONLY_VALUE, ONLY_INDEX };
enum class pad_t { PAD_NONE, PAD_MODE1, PAD_MODE2, PAD_MODE3, PAD_MODE4, PAD_MODE5, PAD_MODE6, PAD_MODE7, PAD_MODE8 };
enum atomic_type_t { ATOMIC_NONE };
enum atomic_op_t { ATOMIC_SUM };
enum mem_t { L1, L0A, L0B, L0C, UB, BT };
enum class QuantMode_t {
  NoQuant, F322F16, F322BF16, DEQF16, VDEQF16, QF322B8_PRE, VQF322B8_PRE, REQ8, VREQ8, DEQS16, VDEQS16,
  QF162B8_PRE, VQF162B8_PRE, QF162S16_PRE, VQF162S16_PRE, QF162S4_PRE, VQF162S4_PRE, REQ4, VREQ4,
  QF322F16_PRE, VQF322F16_PRE, QF322BF16_PRE, VQF322BF16_PRE, QF322F32_PRE, VQF322F32_PRE, QF322FP8_PRE,
  VQF322FP8_PRE, QF322HIF8_PRE, VQF322HIF8_PRE, QF322HIF8_PRE_HYBRID, VQF322HIF8_PRE_HYBRID, QS322BF16_PRE,
  VQS322BF16_PRE, QF322F16, VQF322F16, QF322BF16, VQF322BF16
};
struct MaskReg {};
struct AddrReg {};
struct UnalignRegForStore {};
struct UnalignRegForLoad {};
struct vector_align {};
struct vector_bool {};
struct vector_address {};
namespace bisheng { namespace cce {
void metrics_prof_start();
void metrics_prof_stop();
template <pipe_t pipe, class... A> void mark_stamp(A...);
} }
// what an intrinsic returns here: usable as a value, a statement or a condition
struct __ccec_any { operator int64_t() const { return 0; } };
EOF
: > "$WORK/ccec_intrinsics.h"

# skip the advanced API: pre-define the include guard of every adv_api header the basic API pulls in
GUARDS=()
while read -r inc; do
  g="$(grep -m1 '^#ifndef' "$ASC/$inc" | awk '{print $2}')"
  [ -n "$g" ] && GUARDS+=("-D$g")
done < <(grep -h '#include "include/adv_api' "$ASC/include/basic_api/kernel_operator_intf.h" | sed 's/#include "\(.*\)"/\1/')

check() {  # $1: pass name, rest: pass macros
  local name="$1"; shift
  # -Wno-return-type: the headers `return intrinsic(...)` from void functions; the stand-ins
  # return a value where the real intrinsics return void
  "$CLANG" -std=c++17 -fsyntax-only -ferror-limit=0 -Wno-return-type -x c++ \
    -D__NPU_ARCH__=2201 -D__CCE_AICORE__=220 "$@" \
    -D__global__= -D__aicore__= -D__gm__= '-D__ubuf__=__attribute__((address_space(2)))' \
    '-D__cbuf__=__attribute__((address_space(3)))' '-D__ca__=__attribute__((address_space(4)))' \
    '-D__cb__=__attribute__((address_space(5)))' '-D__cc__=__attribute__((address_space(6)))' \
    '-D__fbuf__=__attribute__((address_space(7)))' '-D__biasbuf__=__attribute__((address_space(8)))' \
    '-D__ssbuf__=__attribute__((address_space(9)))' -D__simd_callee__= -D__sync_alias__= -D__check_sync_alias__= \
    '-D__inout_pipe__(...)=' '-D__in_pipe__(...)=' '-D__out_pipe__(...)=' \
    "${GUARDS[@]}" -include "$WORK/ccec_builtins.h" -include "$WORK/ccec_intrinsics.h" \
    -I"$ASC" -I"$ASC/include" -I"$ASC/include/basic_api" -I"$ASC/impl" -I"$ASC/impl/basic_api" -I"$ASC/impl/utils" \
    -I"$ROOT/ascend-kernels/amla" "$KERNEL" > "$WORK/$name.log" 2>&1 || true
}

# declare the intrinsics the headers call (errors inside the asc-devkit tree only)
for pass in cube vec; do
  for _ in 1 2 3 4 5 6; do
    if [ "$pass" = cube ]; then check "$pass" -D__DAV_C220_CUBE__ -D__DAV_CUBE__; else check "$pass" -D__DAV_C220_VEC__ -D__DAV_VEC__; fi
    new="$(grep "^$ASC/.*error: use of undeclared identifier" "$WORK/$pass.log" | sed "s/.*identifier '\([^']*\)'.*/\1/" \
      | grep -E '^[a-z_][a-z0-9_]*$' | sort -u | comm -23 - <(sed -n 's/^template <class... A> __ccec_any \([a-z0-9_]*\)(.*/\1/p' "$WORK/ccec_intrinsics.h" | sort -u) || true)"
    [ -z "$new" ] && break
    for f in $new; do echo "template <class... A> __ccec_any $f(A&&...);" >> "$WORK/ccec_intrinsics.h"; done
  done
done

status=0
for pass in cube vec; do
  if [ "$pass" = cube ]; then check "$pass" -D__DAV_C220_CUBE__ -D__DAV_CUBE__; else check "$pass" -D__DAV_C220_VEC__ -D__DAV_VEC__; fi
  n="$(grep -c 'error:' "$WORK/$pass.log" || true)"
  k="$(grep 'error:' "$WORK/$pass.log" | grep -c "^$KERNEL" || true)"
  echo "== $pass pass: $n errors ($k in amla_decode.cpp)"
  if [ "$n" != 0 ]; then grep -A3 'error:' "$WORK/$pass.log" | head -60; status=1; fi
done
echo "asc-devkit $(git -C "$ASC" rev-parse HEAD 2>/dev/null || echo '(not a git checkout)'), $("$CLANG" --version | head -1), $(wc -l < "$WORK/ccec_intrinsics.h") intrinsic stand-ins"
exit $status
