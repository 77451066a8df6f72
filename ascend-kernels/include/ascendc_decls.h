// The subset of the AscendC API that ascend-kernels use, with the real signatures of the
// open-source headers (asc-devkit `include/basic_api`: kernel_operator_*_intf.h, kernel_struct_*.h,
// kernel_tpipe.h; commit recorded in docs/ASCEND.md) and CPU bodies written from the documented
// semantics, so a kernel compiles here as it does with bisheng and runs on the host:
//
//   g++ -std=c++17 -fsyntax-only -DFERRATTN_ASCENDC_DECLS -Iascend-kernels/include
//       -Iascend-kernels/amla ascend-kernels/amla/amla_decode.cpp       (type check, test kernel_syntax)
//   backends/ascend/tests/cpu_model/runner.cpp                          (execution, test kernel_cpu)
//
// This is AscendC's own CPU-debug idea (ASCENDC_CPU_DEBUG: one host thread per core, the core
// type a run-time value), written from the public docs because CANN's CPU-debug libraries are
// closed. What the model does where the docs leave a semantic open is said at each place
// ("OPEN:"); where two readings give different results the model has a switch (ModelOptions)
// and the tests run both.
//
// Memory spaces are real, bounded arenas per core (UB 192 KB, L1 512 KB, L0A/L0B 64 KB, L0C
// 128 KB); every TQue::AllocTensor is poisoned with 0xFF bytes (NaN in FP32/BF16) because real
// buffers hold stale data; every access is bounds-checked against its buffer, every GM access against the
// allocations the host registered. Each core executes its instructions in program order, so the
// intra-core pipes cannot race here; instead the model tracks the V/MTE2/MTE3 hazards that the
// hardware leaves to SetFlag/WaitFlag (or to TQue, which inserts them) and reports an access that
// would race on the device. The tracking merges adjacent ranges of one pipe, so a hazard next to
// a range a queue synchronises can go unreported; it never reports one that is not there. Scalar
// (S) accesses to UB and the cube core's pipes are not tracked (the cube side uses queues only). Cross-core flags block with a timeout, so an unpaired flag fails in
// seconds instead of hanging. Any violation throws ferrattn_cpu::ModelError.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

// ------------------------------------------------------------------------------------------------
// Compiler keywords and macros. Real: `[aicore]`, address-space qualifiers, and (sys_macros.h)
// `#define ASCEND_IS_AIC constexpr(g_coreType == AscendC::AIC)`, so the kernel writes
// `if ASCEND_IS_AIC { ... }`. The CPU-debug form (ASCENDC_CPU_DEBUG) is a run-time test, as here.
#define __global__
#define __aicore__
#define __gm__
#define GM_ADDR __gm__ uint8_t*

enum KernelMetaType {
  KERNEL_TYPE_AIV_ONLY,
  KERNEL_TYPE_AIC_ONLY,
  KERNEL_TYPE_MIX_AIV_1_0,
  KERNEL_TYPE_MIX_AIC_1_0,
  KERNEL_TYPE_MIX_AIC_1_1,
  KERNEL_TYPE_MIX_AIC_1_2,
};
// compiler built-in pipe ids (stand-ins for the bisheng enum `pipe_t`)
enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_FIX };

// BF16 storage type (a compiler built-in on the device).
struct bfloat16_t {
  uint16_t bits;
};

namespace ferrattn_cpu {

struct ModelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void Fail(const std::string& what) { throw ModelError(what); }

// Switches for semantics the docs leave open (set by the runner before a launch).
struct ModelOptions {
  // OPEN: whether Mmad reads the K tail of a fractal past `k` (k not a multiple of 16). false:
  // only k columns/rows enter the sum; true: Align16(k) enter it (then the tail must be zero).
  bool mmad_k_align16 = false;
  // OPEN: the order WholeReduceSum adds the elements of one repeat. false: pairwise halving
  // (x[i] + x[i + 32], then 16, ...); true: adjacent pairs (x[2i] + x[2i + 1], ...).
  bool reduce_sum_adjacent = false;
  // Seconds a cross-core wait may block before the model reports a hang.
  double flag_timeout_s = 10.0;
};

enum class CoreKind { AIC, AIV };

struct Group;  // one AI Core: a cube core and its two vector cores

// Per-thread identity of the core the thread plays.
struct CoreCtx {
  CoreKind kind = CoreKind::AIC;
  int64_t block_idx = 0;  // AI Core index (cube index)
  int64_t sub_idx = 0;    // 0/1 on vector cores
  int64_t block_num = 1;
  Group* group = nullptr;
  uint64_t sync_base = 0;  // SetSyncBaseAddr
  int atomic = 0;          // 0 none, 1 f32 add, 2 i32 add
  int task_type = -1;
  // arenas
  std::vector<uint8_t> ub, l1, l0a, l0b, l0c;
  size_t ub_used = 0, l1_used = 0, l0a_used = 0, l0b_used = 0, l0c_used = 0;
  // hazard tracking (vector cores)
  struct Pending {
    const uint8_t* lo;
    const uint8_t* hi;
    int producer;  // 0 MTE2 write, 1 V write, 2 MTE3 read
    int event;     // -1: not yet covered by a SetFlag, else HardEvent * 16 + id
  };
  std::vector<Pending> pending;
  int event_count[64][16] = {};
};

inline thread_local CoreCtx* tls_core = nullptr;
inline CoreCtx& Core() {
  if (tls_core == nullptr) Fail("AscendC call outside a core thread");
  return *tls_core;
}

// Launch-wide state shared by all core threads.
struct Launch {
  ModelOptions opt;
  uint64_t hardware_sync_addr = 0;  // what aclrtGetHardwareSyncAddr returned
  std::mutex mu;                     // flags and atomics
  std::condition_variable cv;
  bool aborted = false;
  std::string first_error;
  std::vector<std::pair<const uint8_t*, size_t>> gm;  // host allocations
};
inline Launch* g_launch = nullptr;
inline Launch& L() { return *g_launch; }

// Cross-core flag counters of one AI Core, per receiving core and flag id (16 ids, 4-bit
// counters: the docs allow at most 15 sets of one id before a wait).
struct Group {
  int aiv[2][16] = {};
  int aic[2][16] = {};  // [from sub core][id]
};

inline void CheckGm(const void* p, size_t bytes, const char* what) {
  auto* b = static_cast<const uint8_t*>(p);
  for (auto& a : L().gm) {
    if (b >= a.first && b + bytes <= a.first + a.second) return;
  }
  Fail(std::string(what) + ": GM access outside every host allocation");
}

inline void Abort(const std::string& e) {
  std::lock_guard<std::mutex> g(L().mu);
  if (!L().aborted) {
    L().aborted = true;
    L().first_error = e;
  }
  L().cv.notify_all();
}

// ---- hazards between the vector core's pipes (UB ranges)
inline bool Overlap(const uint8_t* a, const uint8_t* b, const uint8_t* c, const uint8_t* d) { return a < d && c < b; }
inline void Access(int pipe_kind, bool write, const void* p, size_t bytes, const char* what) {
  CoreCtx& c = Core();
  if (c.kind != CoreKind::AIV || bytes == 0) return;
  auto* lo = static_cast<const uint8_t*>(p);
  auto* hi = lo + bytes;
  static const char* names[] = {"MTE2 write", "V write", "MTE3 read"};
  for (auto& e : c.pending) {
    if (!Overlap(lo, hi, e.lo, e.hi)) continue;
    // pipe_kind: 0 MTE2, 1 V, 2 MTE3
    const bool raw = (pipe_kind == 1 && !write && e.producer == 0) || (pipe_kind == 2 && e.producer == 1);
    const bool war = (pipe_kind == 1 && write && e.producer == 2) || (pipe_kind == 0 && e.producer == 2);
    const bool waw = (pipe_kind == 1 && write && e.producer == 0);
    if (raw || war || waw) {
      Fail(std::string(what) + ": UB range still pending from an earlier " + names[e.producer] +
           " on another pipe; the device needs SetFlag/WaitFlag between them");
    }
  }
  int producer = -1;
  if (pipe_kind == 0 && write) producer = 0;
  if (pipe_kind == 1 && write) producer = 1;
  if (pipe_kind == 2 && !write) producer = 2;
  if (producer < 0) return;
  // coalesce with an uncovered entry of the same producer that touches this range
  for (auto& e : c.pending) {
    if (e.producer == producer && e.event < 0 && lo <= e.hi && e.lo <= hi) {
      e.lo = std::min(e.lo, lo);
      e.hi = std::max(e.hi, hi);
      return;
    }
  }
  c.pending.push_back({lo, hi, producer, -1});
}
// Vector instructions and UB DMA need 32-byte aligned UB addresses (docs: "address alignment").
inline void CheckAlign(const void* p, const char* what) {
  CoreCtx& c = Core();
  if (c.kind != CoreKind::AIV) return;
  const auto off = static_cast<const uint8_t*>(p) - c.ub.data();
  if (off % 32 != 0) Fail(std::string(what) + ": UB operand not 32-byte aligned (offset " + std::to_string(off) + ")");
}

// Alignment of a cube-side operand inside its buffer (docs, Mmad: A and B 512 bytes, C 64 bytes).
inline void CheckAlignIn(const void* p, const std::vector<uint8_t>& arena, size_t bytes, const char* what) {
  const auto off = static_cast<const uint8_t*>(p) - arena.data();
  if (off % bytes != 0) {
    Fail(std::string(what) + ": operand not " + std::to_string(bytes) + "-byte aligned (offset " +
         std::to_string(off) + ")");
  }
}

// TQue synchronises its own tensors: drop pending entries of `producer` inside [lo, hi).
inline void QueueSync(const void* p, size_t bytes, int producer) {
  CoreCtx& c = Core();
  auto* lo = static_cast<const uint8_t*>(p);
  auto* hi = lo + bytes;
  c.pending.erase(std::remove_if(c.pending.begin(), c.pending.end(),
                                 [&](const CoreCtx::Pending& e) {
                                   return e.producer == producer && Overlap(lo, hi, e.lo, e.hi);
                                 }),
                  c.pending.end());
}

// Vector-side BF16/INT conversions with the documented round modes.
inline float Bf16ToF32(bfloat16_t v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bfloat16_t F32ToBf16(float f, bool ties_away) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return bfloat16_t{uint16_t((u >> 16) | 0x40)};
  // CAST_RINT: nearest, ties to even; CAST_ROUND: nearest, ties away from zero (on the
  // sign-magnitude pattern, adding half an ulp rounds the magnitude up on a tie).
  const uint32_t r = ties_away ? u + 0x8000u : u + 0x7FFFu + ((u >> 16) & 1u);
  return bfloat16_t{uint16_t(r >> 16)};
}

}  // namespace ferrattn_cpu

#define KERNEL_TASK_TYPE_DEFAULT(value) (::ferrattn_cpu::Core().task_type = int(value))
// Only `if ASCEND_IS_AIC {` parses, as with the real `constexpr(...)` form: the macro is an
// if-statement initialiser, which an expression (a ?: condition) cannot contain.
#define ASCEND_IS_AIC \
  (const bool ferrattn_is_aic_ = ::ferrattn_cpu::Core().kind == ::ferrattn_cpu::CoreKind::AIC; ferrattn_is_aic_)
#define ASCEND_IS_AIV \
  (const bool ferrattn_is_aiv_ = ::ferrattn_cpu::Core().kind == ::ferrattn_cpu::CoreKind::AIV; ferrattn_is_aiv_)

namespace AscendC {

enum class TPosition : uint8_t { GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC };
using QuePosition = TPosition;
enum class RoundMode { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
enum class HardEvent : uint8_t {
  MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M, V_V, MTE3_MTE1, MTE1_MTE3,
  MTE1_V, MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2, MTE2_MTE3, S_V, V_S, S_MTE2, MTE2_S, S_MTE3,
  MTE3_S, MTE2_FIX, FIX_MTE2, FIX_S, M_S, FIX_MTE3, MTE1_FIX, FIX_MTE1, FIX_FIX, MAX
};
enum class ReduceOrder : uint8_t { ORDER_VALUE_INDEX = 0, ORDER_INDEX_VALUE, ORDER_ONLY_VALUE, ORDER_ONLY_INDEX };
enum class QuantMode_t { NoQuant };
enum class CO2Layout : uint8_t { NZ = 0, ROW_MAJOR, COLUMN_MAJOR };
struct FixpipeConfig {
  CO2Layout format;
};
constexpr FixpipeConfig CFG_NZ = {CO2Layout::NZ};
constexpr FixpipeConfig CFG_ROW_MAJOR = {CO2Layout::ROW_MAJOR};

// ---------------------------------------------------------------- tensors
template <typename T>
class GlobalTensor {
 public:
  __aicore__ inline GlobalTensor() {}
  __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) {
    ptr_ = buffer;
    size_ = bufferSize;
  }
  __aicore__ inline GlobalTensor operator[](const uint64_t offset) const {
    if (offset > size_) ferrattn_cpu::Fail("GlobalTensor[]: offset past SetGlobalBuffer's size");
    GlobalTensor g;
    g.ptr_ = ptr_ + offset;
    g.size_ = size_ - offset;
    return g;
  }
  __aicore__ inline T GetValue(const uint64_t offset) const {
    Check(offset, 1);
    return ptr_[offset];
  }
  __aicore__ inline void SetValue(const uint64_t offset, T value) {
    Check(offset, 1);
    ptr_[offset] = value;
  }
  __aicore__ inline __gm__ T* GetPhyAddr() const { return ptr_; }
  // model: checks [offset, offset + n) against the declared size and the host allocations
  void Check(uint64_t offset, uint64_t n) const {
    if (offset + n > size_) ferrattn_cpu::Fail("GM access past SetGlobalBuffer's size");
    ferrattn_cpu::CheckGm(ptr_ + offset, n * sizeof(T), "GlobalTensor");
  }
  uint64_t Size() const { return size_; }

 private:
  T* ptr_ = nullptr;
  uint64_t size_ = 0;
};

template <typename T>
class LocalTensor {
 public:
  __aicore__ inline LocalTensor() {}
  __aicore__ inline LocalTensor operator[](const uint32_t offset) const {
    if (uint64_t(offset) > len_) ferrattn_cpu::Fail("LocalTensor[]: offset past the buffer");
    LocalTensor t = *this;
    t.ptr_ += offset;
    t.len_ -= offset;
    return t;
  }
  __aicore__ inline T GetValue(const uint32_t offset) const {
    Check(offset, 1);
    return ptr_[offset];
  }
  __aicore__ inline void SetValue(const uint32_t offset, const T value) const {
    Check(offset, 1);
    ptr_[offset] = value;
  }
  template <typename U>
  __aicore__ inline LocalTensor<U> ReinterpretCast() const {
    LocalTensor<U> u;
    u.ptr_ = reinterpret_cast<U*>(ptr_);
    u.len_ = len_ * sizeof(T) / sizeof(U);
    u.pos_ = pos_;
    return u;
  }
  __aicore__ inline uint32_t GetSize() const { return uint32_t(len_); }
  // model
  void Check(uint64_t offset, uint64_t n) const {
    if (ptr_ == nullptr) ferrattn_cpu::Fail("LocalTensor used before allocation");
    if (offset + n > len_) ferrattn_cpu::Fail("LocalTensor access past the end of its buffer");
  }
  T* ptr_ = nullptr;
  uint64_t len_ = 0;
  TPosition pos_ = TPosition::GM;
};

// ---------------------------------------------------------------- TPipe, TQue, TBuf
class TPipe;
template <TPosition pos, int32_t depth, auto mask = 0>
class TQue {
 public:
  __aicore__ inline TQue() {}
  template <typename T>
  __aicore__ inline LocalTensor<T> AllocTensor() {
    for (int i = 0; i < num_; ++i) {
      const int s = (next_ + i) % num_;
      if (!used_[s]) {
        used_[s] = true;
        next_ = (s + 1) % num_;
        // a fresh buffer holds whatever an earlier tile or kernel left: poison it (NaN)
        std::memset(base_ + size_t(s) * len_, 0xFF, len_);
        LocalTensor<T> t;
        t.ptr_ = reinterpret_cast<T*>(base_ + size_t(s) * len_);
        t.len_ = len_ / sizeof(T);
        t.pos_ = pos;
        return t;
      }
    }
    ferrattn_cpu::Fail("TQue::AllocTensor: every buffer of the queue is in use (a hang on the device)");
  }
  template <typename T>
  __aicore__ inline bool EnQue(const LocalTensor<T>& t) {
    if (count_ >= depth) ferrattn_cpu::Fail("TQue::EnQue: queue depth exceeded");
    fifo_[(head_ + count_) % kMaxBufs] = Slot(t);
    ++count_;
    // the queue inserts the producer -> consumer flag (VECOUT: V -> MTE3, VECIN: MTE2 -> V)
    if (pos == TPosition::VECOUT) ferrattn_cpu::QueueSync(t.ptr_, len_, 1);
    return true;
  }
  template <typename T>
  __aicore__ inline LocalTensor<T> DeQue() {
    if (count_ == 0) ferrattn_cpu::Fail("TQue::DeQue on an empty queue (a hang on the device)");
    const int s = fifo_[head_];
    head_ = (head_ + 1) % kMaxBufs;
    --count_;
    LocalTensor<T> t;
    t.ptr_ = reinterpret_cast<T*>(base_ + size_t(s) * len_);
    t.len_ = len_ / sizeof(T);
    t.pos_ = pos;
    if (pos == TPosition::VECIN) ferrattn_cpu::QueueSync(t.ptr_, len_, 0);
    return t;
  }
  template <typename T>
  __aicore__ inline void FreeTensor(LocalTensor<T>& t) {
    const int s = Slot(t);
    if (!used_[s]) ferrattn_cpu::Fail("TQue::FreeTensor of a buffer that is not allocated");
    used_[s] = false;
    // the next AllocTensor waits for the consumer (VECOUT: MTE3 -> V)
    if (pos == TPosition::VECOUT) ferrattn_cpu::QueueSync(base_ + size_t(s) * len_, len_, 2);
  }

 private:
  friend class TPipe;
  static constexpr int kMaxBufs = 8;
  template <typename T>
  int Slot(const LocalTensor<T>& t) const {
    auto* p = reinterpret_cast<uint8_t*>(t.ptr_);
    if (p < base_ || p >= base_ + size_t(num_) * len_ || (p - base_) % len_ != 0) {
      ferrattn_cpu::Fail("TQue: tensor does not belong to this queue");
    }
    return int((p - base_) / len_);
  }
  uint8_t* base_ = nullptr;
  uint32_t len_ = 0;
  int num_ = 0, next_ = 0, head_ = 0, count_ = 0;
  bool used_[kMaxBufs] = {};
  int fifo_[kMaxBufs] = {};
};

template <TPosition pos = TPosition::LCM>
class TBuf {
 public:
  __aicore__ inline TBuf() {}
  template <typename T>
  __aicore__ inline LocalTensor<T> Get() {
    LocalTensor<T> t;
    t.ptr_ = reinterpret_cast<T*>(base_);
    t.len_ = len_ / sizeof(T);
    t.pos_ = pos;
    return t;
  }

 private:
  friend class TPipe;
  uint8_t* base_ = nullptr;
  uint32_t len_ = 0;
};

class TPipe {
 public:
  __aicore__ inline TPipe() {}
  template <class T>
  __aicore__ inline bool InitBuffer(T& que, uint8_t num, uint32_t len) {
    if (num > 8) ferrattn_cpu::Fail("TPipe::InitBuffer: more than 8 buffers in a queue");
    que.base_ = Take(PosOf(que), size_t(num) * len);
    que.len_ = len;
    que.num_ = num;
    return true;
  }
  template <TPosition bufPos>
  __aicore__ inline bool InitBuffer(TBuf<bufPos>& buf, uint32_t len) {
    buf.base_ = Take(bufPos, len);
    buf.len_ = len;
    return true;
  }

 private:
  template <TPosition p, int32_t d, auto m>
  static TPosition PosOf(const TQue<p, d, m>&) {
    return p;
  }
  // A1/B1 -> L1, A2 -> L0A, B2 -> L0B, CO1 -> L0C, VEC* -> UB (capacities of the Ascend 910B)
  static uint8_t* Take(TPosition p, size_t bytes) {
    auto& c = ferrattn_cpu::Core();
    std::vector<uint8_t>* mem;
    size_t* used;
    const char* name;
    const bool cube = c.kind == ferrattn_cpu::CoreKind::AIC;
    switch (p) {
      case TPosition::A1:
      case TPosition::B1: mem = &c.l1; used = &c.l1_used; name = "L1"; break;
      case TPosition::A2: mem = &c.l0a; used = &c.l0a_used; name = "L0A"; break;
      case TPosition::B2: mem = &c.l0b; used = &c.l0b_used; name = "L0B"; break;
      case TPosition::CO1: mem = &c.l0c; used = &c.l0c_used; name = "L0C"; break;
      default: mem = &c.ub; used = &c.ub_used; name = "UB"; break;
    }
    const bool vec_pos = mem == &c.ub;
    if (cube == vec_pos) ferrattn_cpu::Fail(std::string(name) + " buffer requested on the wrong core type");
    const size_t aligned = (*used + 31) / 32 * 32;
    if (aligned + bytes > mem->size()) {
      ferrattn_cpu::Fail(std::string("TPipe::InitBuffer: ") + name + " overflows (" + std::to_string(aligned + bytes) +
                         " B > " + std::to_string(mem->size()) + " B)");
    }
    *used = aligned + bytes;
    return mem->data() + aligned;
  }
};

// ---------------------------------------------------------------- parameter structs (real fields)
struct DataCopyParams {
  __aicore__ DataCopyParams() {}
  __aicore__ DataCopyParams(const uint16_t count, const uint16_t len, const uint16_t srcStrideIn,
                            const uint16_t dstStrideIn)
      : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
  uint16_t blockCount = 1;
  uint16_t blockLen = 0;   // 32-byte blocks
  uint16_t srcStride = 0;  // 32-byte blocks between bursts
  uint16_t dstStride = 0;
};
struct DataCopyExtParams {
  __aicore__ DataCopyExtParams() {}
  __aicore__ DataCopyExtParams(const uint16_t count, const uint32_t len, const uint32_t srcStrideIn,
                               const uint32_t dstStrideIn, const uint32_t rsvIn)
      : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;   // bytes
  uint32_t srcStride = 0;  // GM -> UB: bytes between GM bursts; UB -> GM: 32-byte blocks in UB
  uint32_t dstStride = 0;  // GM -> UB: 32-byte blocks in UB; UB -> GM: bytes in GM
  uint32_t rsv = 0;
};
template <typename T>
struct DataCopyPadExtParams {
  __aicore__ DataCopyPadExtParams() {}
  __aicore__ DataCopyPadExtParams(const bool isPadValue, const uint8_t leftPadValue, const uint8_t rightPadValue,
                                  T padValue)
      : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue), paddingValue(padValue) {}
  bool isPad = false;
  uint8_t leftPadding = 0;
  uint8_t rightPadding = 0;
  T paddingValue{};
};
struct Nd2NzParams {
  __aicore__ Nd2NzParams() {}
  __aicore__ Nd2NzParams(const uint16_t ndNumIn, const uint16_t nValueIn, const uint32_t dValueIn,
                         const uint64_t srcNdMatrixStrideIn, const uint64_t srcDValueIn, const uint16_t dstNzC0StrideIn,
                         const uint16_t dstNzNStrideIn, const uint32_t dstNzMatrixStrideIn)
      : ndNum(ndNumIn), nValue(nValueIn), dValue(dValueIn), srcNdMatrixStride(srcNdMatrixStrideIn),
        srcDValue(srcDValueIn), dstNzC0Stride(dstNzC0StrideIn), dstNzNStride(dstNzNStrideIn),
        dstNzMatrixStride(dstNzMatrixStrideIn) {}
  uint16_t ndNum = 0;
  uint16_t nValue = 0;
  uint32_t dValue = 0;
  uint64_t srcNdMatrixStride = 0;
  uint64_t srcDValue = 0;      // elements between source rows
  uint16_t dstNzC0Stride = 0;  // C0 rows (32 B) between the starts of consecutive column blocks
  uint16_t dstNzNStride = 0;   // C0 rows between consecutive rows
  uint32_t dstNzMatrixStride = 0;
};
struct LoadData2DParams {
  __aicore__ LoadData2DParams() {}
  __aicore__ LoadData2DParams(const uint16_t startIndexIn, const uint8_t repeatTimesIn, const uint16_t srcStrideIn,
                              const uint8_t sidIn, const uint16_t dstGapIn, const bool ifTransposeIn,
                              const uint8_t addrModeIn)
      : startIndex(startIndexIn), dstGap(dstGapIn), srcStride(srcStrideIn), ifTranspose(ifTransposeIn),
        repeatTimes(repeatTimesIn), sid(sidIn), addrMode(addrModeIn) {}
  uint16_t startIndex = 0;  // fractals
  uint16_t dstGap = 0;      // fractals skipped in dst between repeats
  uint16_t srcStride = 0;   // fractals between source repeats
  bool ifTranspose = 0;
  uint8_t repeatTimes = 0;  // one 512-byte fractal per repeat
  uint8_t sid = 0;
  uint8_t addrMode = 0;
};
struct InitConstValueParams_base {};
template <typename T>
struct InitConstValueParams {
  __aicore__ InitConstValueParams() {}
  __aicore__ InitConstValueParams(const uint16_t repeatTimesIn, const uint16_t blockNumIn, const uint16_t dstGapIn,
                                  const T initValueIn)
      : repeatTimes(repeatTimesIn), blockNum(blockNumIn), dstGap(dstGapIn), initValue(initValueIn) {}
  uint16_t repeatTimes = 0;
  uint16_t blockNum = 0;  // 32-byte blocks written per repeat
  uint16_t dstGap = 0;    // 32-byte blocks skipped after each repeat
  T initValue{};
};
struct MmadParams {
  __aicore__ MmadParams() {}
  __aicore__ MmadParams(const uint16_t mIn, const uint16_t nIn, const uint16_t kIn, const bool isBiasIn,
                        const int32_t fmOffsetIn, const bool enSsparseIn, const bool enWinogradAIn,
                        const bool enWinogradBIn)
      : m(mIn), n(nIn), k(kIn), isBias(isBiasIn), fmOffset(fmOffsetIn), enSsparse(enSsparseIn),
        enWinogradA(enWinogradAIn), enWinogradB(enWinogradBIn) {}
  __aicore__ MmadParams(const uint16_t mIn, const uint16_t nIn, const uint16_t kIn, const uint8_t unitFlagIn,
                        const bool cmatrixSourceIn, const bool cmatrixInitValIn)
      : m(mIn), n(nIn), k(kIn), unitFlag(unitFlagIn), cmatrixSource(cmatrixSourceIn), cmatrixInitVal(cmatrixInitValIn) {}
  uint16_t m = 0;
  uint16_t n = 0;
  uint16_t k = 0;
  bool isBias = false;
  int32_t fmOffset = 0;
  bool enSsparse = false;
  bool enWinogradA = false;
  bool enWinogradB = false;
  uint8_t unitFlag = 0;
  bool kDirectionAlign = false;
  bool cmatrixSource = false;
  bool cmatrixInitVal = true;  // true: C starts at 0; false: accumulate onto L0C
};
struct FixpipeParamsV220 {
  __aicore__ FixpipeParamsV220() {}
  __aicore__ FixpipeParamsV220(const uint16_t nSizeIn, const uint16_t mSizeIn, const uint16_t srcStrideIn,
                               const uint32_t dstStrideIn, const bool reluEnIn)
      : nSize(nSizeIn), mSize(mSizeIn), srcStride(srcStrideIn), dstStride(dstStrideIn), reluEn(reluEnIn) {}
  uint16_t nSize = 0;
  uint16_t mSize = 0;
  uint16_t srcStride = 0;  // L0C: C0 rows (16 elements) between column blocks (= Align16(m))
  uint32_t dstStride = 0;  // ND dst: elements between rows
  QuantMode_t quantPre = QuantMode_t::NoQuant;
  uint64_t deqScalar = 0;
  uint16_t ndNum = 1;
  uint16_t srcNdStride = 0;
  uint16_t dstNdStride = 0;
  bool reluEn = false;
  uint8_t unitFlag = 0;
  bool isChannelSplit = false;
};
struct BinaryRepeatParams {
  __aicore__ BinaryRepeatParams() {}
  __aicore__ BinaryRepeatParams(const uint8_t dstBlkStrideIn, const uint8_t src0BlkStrideIn,
                                const uint8_t src1BlkStrideIn, const uint8_t dstRepStrideIn,
                                const uint8_t src0RepStrideIn, const uint8_t src1RepStrideIn)
      : dstBlkStride(dstBlkStrideIn), src0BlkStride(src0BlkStrideIn), src1BlkStride(src1BlkStrideIn),
        dstRepStride(dstRepStrideIn), src0RepStride(src0RepStrideIn), src1RepStride(src1RepStrideIn) {}
  uint32_t blockNumber = 8;
  uint8_t dstBlkStride = 1;
  uint8_t src0BlkStride = 1;
  uint8_t src1BlkStride = 1;
  uint8_t dstRepStride = 8;
  uint8_t src0RepStride = 8;
  uint8_t src1RepStride = 8;
  bool repeatStrideMode = false;
  bool strideSizeMode = false;
};
struct UnaryRepeatParams {
  __aicore__ UnaryRepeatParams() {}
  __aicore__ UnaryRepeatParams(const uint16_t dstBlkStrideIn, const uint16_t srcBlkStrideIn,
                               const uint8_t dstRepStrideIn, const uint8_t srcRepStrideIn)
      : dstBlkStride(dstBlkStrideIn), srcBlkStride(srcBlkStrideIn), dstRepStride(dstRepStrideIn),
        srcRepStride(srcRepStrideIn) {}
  uint32_t blockNumber = 8;
  uint16_t dstBlkStride = 1;
  uint16_t srcBlkStride = 1;
  uint8_t dstRepStride = 8;
  uint8_t srcRepStride = 8;
  bool repeatStrideMode = false;
  bool strideSizeMode = false;
  bool halfBlock = false;
};
struct BrcbRepeatParams {
  __aicore__ BrcbRepeatParams() {}
  __aicore__ BrcbRepeatParams(const uint16_t dstBlkStrideIn, const uint16_t dstRepStrideIn)
      : dstRepStride(dstRepStrideIn), dstBlkStride(dstBlkStrideIn) {}
  uint32_t blockNumber = 8;
  uint16_t dstRepStride = 8;
  uint16_t dstBlkStride = 1;
  uint8_t src0BlkStride = 1;
  uint8_t src0RepStride = 8;
  bool repeatStrideMode = false;
  bool strideSizeMode = false;
};

// ---------------------------------------------------------------- system
__aicore__ inline int64_t GetBlockNum() { return ferrattn_cpu::Core().block_num; }
// On the vector cores of a mixed 1:2 kernel the index runs over [0, 2 x blocks):
// cube index x 2 + sub-block index (docs: GetBlockIdx, "Mix mode").
__aicore__ inline int64_t GetBlockIdx() {
  auto& c = ferrattn_cpu::Core();
  return c.kind == ferrattn_cpu::CoreKind::AIV ? c.block_idx * 2 + c.sub_idx : c.block_idx;
}
__aicore__ inline int64_t GetSubBlockIdx() { return ferrattn_cpu::Core().sub_idx; }
// vector cores per cube core on a vector core (2 in a 1:2 kernel), 1 on the cube core
__aicore__ inline int64_t GetTaskRatio() { return ferrattn_cpu::Core().kind == ferrattn_cpu::CoreKind::AIV ? 2 : 1; }
__aicore__ inline void SetSyncBaseAddr(uint64_t config) { ferrattn_cpu::Core().sync_base = config; }

template <typename T>
__aicore__ inline void SetAtomicAdd() {
  static_assert(sizeof(T) == 4, "the model implements FP32 and INT32 atomic adds");
  ferrattn_cpu::Core().atomic = std::is_same<T, float>::value ? 1 : 2;
}
__aicore__ inline void SetAtomicNone() { ferrattn_cpu::Core().atomic = 0; }

// ---- intra-core flags: pairing and the hazards they order
template <HardEvent event>
__aicore__ inline void SetFlag(int32_t eventID) {
  auto& c = ferrattn_cpu::Core();
  if (eventID < 0 || eventID > 15) ferrattn_cpu::Fail("SetFlag: event id out of range");
  const int e = int(event);
  c.event_count[e][eventID]++;
  int producer = -1;
  if (event == HardEvent::MTE2_V) producer = 0;
  if (event == HardEvent::V_MTE3) producer = 1;
  if (event == HardEvent::MTE3_V || event == HardEvent::MTE3_MTE2) producer = 2;
  for (auto& p : c.pending) {
    if (p.producer == producer && p.event < 0) p.event = e * 16 + eventID;
  }
}
template <HardEvent event>
__aicore__ inline void WaitFlag(int32_t eventID) {
  auto& c = ferrattn_cpu::Core();
  const int e = int(event);
  if (c.event_count[e][eventID] == 0) ferrattn_cpu::Fail("WaitFlag without a SetFlag of the same event (hangs)");
  c.event_count[e][eventID]--;
  const int key = e * 16 + eventID;
  c.pending.erase(std::remove_if(c.pending.begin(), c.pending.end(),
                                 [&](const ferrattn_cpu::CoreCtx::Pending& p) { return p.event == key; }),
                  c.pending.end());
}
template <pipe_t pipe>
__aicore__ inline void PipeBarrier() {
  if (pipe == PIPE_ALL) ferrattn_cpu::Core().pending.clear();
}

// ---- cross-core flags. modeId 2 (AIC <-> its AIVs): a set on the cube core raises the flag on
// both of its vector cores; a set on a vector core raises it for the cube core, whose wait needs
// the flag from both vector cores (docs: CrossCoreSetFlag, mode 2).
template <uint8_t modeId, pipe_t pipe>
__aicore__ inline void CrossCoreSetFlag(uint16_t flagId) {
  static_assert(modeId == 2, "the model implements mode 2 (AIC <-> AIVs of one AI Core)");
  auto& c = ferrattn_cpu::Core();
  auto& l = ferrattn_cpu::L();
  if (flagId > 15) ferrattn_cpu::Fail("CrossCoreSetFlag: flag id > 15");
  if (c.sync_base != l.hardware_sync_addr || c.sync_base == 0) {
    ferrattn_cpu::Fail("CrossCoreSetFlag before SetSyncBaseAddr(hardware sync address): the flag goes nowhere");
  }
  std::lock_guard<std::mutex> g(l.mu);
  auto& gr = *c.group;
  if (c.kind == ferrattn_cpu::CoreKind::AIC) {
    for (int s = 0; s < 2; ++s) {
      if (++gr.aiv[s][flagId] > 15) ferrattn_cpu::Fail("cross-core flag counter past 15");
    }
  } else if (++gr.aic[c.sub_idx][flagId] > 15) {
    ferrattn_cpu::Fail("cross-core flag counter past 15");
  }
  l.cv.notify_all();
}
template <uint8_t modeId = 0, pipe_t pipe = PIPE_S>
__aicore__ inline void CrossCoreWaitFlag(uint16_t flagId) {
  auto& c = ferrattn_cpu::Core();
  auto& l = ferrattn_cpu::L();
  if (flagId > 15) ferrattn_cpu::Fail("CrossCoreWaitFlag: flag id > 15");
  if (c.sync_base != l.hardware_sync_addr || c.sync_base == 0) {
    ferrattn_cpu::Fail("CrossCoreWaitFlag before SetSyncBaseAddr(hardware sync address): waits forever");
  }
  std::unique_lock<std::mutex> g(l.mu);
  auto& gr = *c.group;
  auto ready = [&] {
    if (l.aborted) return true;
    if (c.kind == ferrattn_cpu::CoreKind::AIV) return gr.aiv[c.sub_idx][flagId] > 0;
    return gr.aic[0][flagId] > 0 && gr.aic[1][flagId] > 0;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(l.opt.flag_timeout_s);
  if (!l.cv.wait_until(g, deadline, ready)) {
    g.unlock();
    ferrattn_cpu::Fail(std::string("hang: ") + (c.kind == ferrattn_cpu::CoreKind::AIC ? "cube" : "vector") +
                       " core " + std::to_string(c.block_idx) + "." + std::to_string(c.sub_idx) +
                       " waits for cross-core flag " + std::to_string(flagId) + " that is never set");
  }
  if (l.aborted) ferrattn_cpu::Fail("aborted: another core failed");
  if (c.kind == ferrattn_cpu::CoreKind::AIV) {
    gr.aiv[c.sub_idx][flagId]--;
  } else {
    gr.aic[0][flagId]--;
    gr.aic[1][flagId]--;
  }
}

// ---------------------------------------------------------------- data movement
namespace detail {
template <typename T>
inline void GmWrite(T* dst, const T* src, uint32_t n) {
  auto& c = ferrattn_cpu::Core();
  if (c.atomic == 0) {
    std::memcpy(dst, src, size_t(n) * sizeof(T));
    return;
  }
  std::lock_guard<std::mutex> g(ferrattn_cpu::L().mu);
  for (uint32_t i = 0; i < n; ++i) {
    if (c.atomic == 1) {
      float a, b;
      std::memcpy(&a, dst + i, 4);
      std::memcpy(&b, src + i, 4);
      a += b;
      std::memcpy(dst + i, &a, 4);
    } else {  // INT32 add wraps (two's complement), as the hardware adder does
      uint32_t a, b;
      std::memcpy(&a, dst + i, 4);
      std::memcpy(&b, src + i, 4);
      a += b;
      std::memcpy(dst + i, &a, 4);
    }
  }
}
}  // namespace detail

// GM -> UB / L1, contiguous (count elements, a multiple of 32 bytes)
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count) {
  if (count * sizeof(T) % 32 != 0) ferrattn_cpu::Fail("DataCopy: count is not a multiple of 32 bytes");
  dst.Check(0, count);
  src.Check(0, count);
  ferrattn_cpu::CheckAlign(dst.ptr_, "DataCopy GM->UB");
  ferrattn_cpu::Access(0, true, dst.ptr_, count * sizeof(T), "DataCopy GM->UB");
  std::memcpy(dst.ptr_, src.GetPhyAddr(), size_t(count) * sizeof(T));
}
// UB -> GM, contiguous
template <typename T>
__aicore__ inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  if (count * sizeof(T) % 32 != 0) ferrattn_cpu::Fail("DataCopy: count is not a multiple of 32 bytes");
  src.Check(0, count);
  dst.Check(0, count);
  ferrattn_cpu::CheckAlign(src.ptr_, "DataCopy UB->GM");
  ferrattn_cpu::Access(2, false, src.ptr_, count * sizeof(T), "DataCopy UB->GM");
  detail::GmWrite(dst.GetPhyAddr(), src.ptr_, count);
}
// UB -> GM with bursts: blockCount bursts of blockLen 32-byte blocks, gaps in 32-byte blocks
template <typename T>
__aicore__ inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
  constexpr uint32_t e = 32 / sizeof(T);
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    const uint64_t so = uint64_t(b) * (p.blockLen + p.srcStride) * e;
    const uint64_t d0 = uint64_t(b) * (p.blockLen + p.dstStride) * e;
    src.Check(so, p.blockLen * e);
    dst.Check(d0, p.blockLen * e);
    ferrattn_cpu::CheckAlign(src.ptr_ + so, "DataCopy UB->GM");
    ferrattn_cpu::Access(2, false, src.ptr_ + so, p.blockLen * 32, "DataCopy UB->GM");
    detail::GmWrite(dst.GetPhyAddr() + d0, src.ptr_ + so, p.blockLen * e);
  }
}
// UB -> UB copy (vector pipe)
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
  constexpr uint32_t e = 32 / sizeof(T);
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    const uint64_t so = uint64_t(b) * (p.blockLen + p.srcStride) * e;
    const uint64_t d0 = uint64_t(b) * (p.blockLen + p.dstStride) * e;
    src.Check(so, p.blockLen * e);
    dst.Check(d0, p.blockLen * e);
    ferrattn_cpu::Access(1, false, src.ptr_ + so, p.blockLen * 32, "DataCopy UB->UB");
    ferrattn_cpu::Access(1, true, dst.ptr_ + d0, p.blockLen * 32, "DataCopy UB->UB");
    std::memmove(dst.ptr_ + d0, src.ptr_ + so, p.blockLen * 32);
  }
}
// GM (ND) -> L1 (NZ): row r, column c of the source lands at
// (c / C0) * dstNzC0Stride * C0 + r * dstNzNStride * C0 + c % C0, C0 = 32 B / sizeof(T).
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const Nd2NzParams& p) {
  constexpr uint32_t c0 = 32 / sizeof(T);
  if (p.ndNum != 1) ferrattn_cpu::Fail("Nd2Nz: the model implements ndNum 1");
  for (uint32_t r = 0; r < p.nValue; ++r) {
    src.Check(uint64_t(r) * p.srcDValue, p.dValue);
    for (uint32_t col = 0; col < p.dValue; ++col) {
      const uint64_t d = uint64_t(col / c0) * p.dstNzC0Stride * c0 + uint64_t(r) * p.dstNzNStride * c0 + col % c0;
      dst.Check(d, 1);
      dst.ptr_[d] = src.GetPhyAddr()[uint64_t(r) * p.srcDValue + col];
    }
  }
}
// GM -> UB, byte-exact bursts; each burst starts on a 32-byte block in UB, and with isPad the
// rightPadding elements after it are set to paddingValue.
template <typename T>
__aicore__ inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                                   const DataCopyExtParams& p, const DataCopyPadExtParams<T>& pad) {
  if (p.blockLen % sizeof(T) != 0) ferrattn_cpu::Fail("DataCopyPad: blockLen is not whole elements");
  const uint32_t n = p.blockLen / sizeof(T);
  const uint32_t ub_blocks = (p.blockLen + 31) / 32;
  const uint32_t per_blk = 32 / sizeof(T);
  if (pad.leftPadding != 0) ferrattn_cpu::Fail("DataCopyPad: the model implements rightPadding only");
  if (pad.isPad && n + pad.rightPadding > ub_blocks * per_blk) ferrattn_cpu::Fail("DataCopyPad: padding past the block");
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    const uint64_t so = uint64_t(b) * (p.blockLen + p.srcStride) / sizeof(T);
    const uint64_t d0 = uint64_t(b) * (ub_blocks + p.dstStride) * per_blk;
    src.Check(so, n);
    dst.Check(d0, ub_blocks * per_blk);
    ferrattn_cpu::CheckAlign(dst.ptr_ + d0, "DataCopyPad GM->UB");
    ferrattn_cpu::Access(0, true, dst.ptr_ + d0, ub_blocks * 32, "DataCopyPad GM->UB");
    std::memcpy(dst.ptr_ + d0, src.GetPhyAddr() + so, p.blockLen);
    if (pad.isPad) {
      for (uint32_t i = 0; i < pad.rightPadding; ++i) dst.ptr_[d0 + n + i] = pad.paddingValue;
    }
  }
}
// UB -> GM, byte-exact bursts (srcStride in 32-byte UB blocks, dstStride in GM bytes)
template <typename T>
__aicore__ inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                                   const DataCopyExtParams& p) {
  if (p.blockLen % sizeof(T) != 0) ferrattn_cpu::Fail("DataCopyPad: blockLen is not whole elements");
  const uint32_t n = p.blockLen / sizeof(T);
  const uint32_t ub_blocks = (p.blockLen + 31) / 32;
  const uint32_t per_blk = 32 / sizeof(T);
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    const uint64_t so = uint64_t(b) * (ub_blocks + p.srcStride) * per_blk;
    const uint64_t d0 = uint64_t(b) * (p.blockLen + p.dstStride) / sizeof(T);
    src.Check(so, n);
    dst.Check(d0, n);
    ferrattn_cpu::CheckAlign(src.ptr_ + so, "DataCopyPad UB->GM");
    ferrattn_cpu::Access(2, false, src.ptr_ + so, p.blockLen, "DataCopyPad UB->GM");
    detail::GmWrite(dst.GetPhyAddr() + d0, src.ptr_ + so, n);
  }
}

// L1 -> L0A/L0B: repeatTimes fractals of 512 bytes; repeat i reads fractal startIndex + i x
// srcStride and writes fractal i x (dstGap + 1); ifTranspose transposes each 16 x 16 fractal.
template <typename T>
__aicore__ inline void LoadData(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2DParams& p) {
  static_assert(sizeof(T) == 2, "the model implements 16-bit LoadData2D");
  constexpr uint32_t f = 256;
  if (p.addrMode != 0) ferrattn_cpu::Fail("LoadData2D: the model implements addrMode 0");
  for (uint32_t i = 0; i < p.repeatTimes; ++i) {
    const uint64_t s0 = (uint64_t(p.startIndex) + uint64_t(i) * p.srcStride) * f;
    const uint64_t d0 = uint64_t(i) * (p.dstGap + 1) * f;
    src.Check(s0, f);
    dst.Check(d0, f);
    for (uint32_t r = 0; r < 16; ++r) {
      for (uint32_t c = 0; c < 16; ++c) {
        dst.ptr_[d0 + r * 16 + c] = p.ifTranspose ? src.ptr_[s0 + c * 16 + r] : src.ptr_[s0 + r * 16 + c];
      }
    }
  }
}
// Fills repeatTimes x blockNum 32-byte blocks of an L1 buffer, skipping dstGap blocks after each.
template <typename T, typename U>
__aicore__ inline void InitConstValue(const LocalTensor<T>& dst, const InitConstValueParams<U>& p) {
  constexpr uint32_t e = 32 / sizeof(T);
  for (uint32_t r = 0; r < p.repeatTimes; ++r) {
    const uint64_t d0 = uint64_t(r) * (p.blockNum + p.dstGap) * e;
    dst.Check(d0, uint64_t(p.blockNum) * e);
    for (uint32_t i = 0; i < p.blockNum * e; ++i) dst.ptr_[d0 + i] = p.initValue;
  }
}

// C (L0C, NZ: (n / 16) x Align16(m) x 16 + m x 16 + n % 16) = A B (+ C).
// A in L0A zZ: ((m / 16) x K1 + k / 16) x 256 + (m % 16) x 16 + k % 16, K1 = ceil(k / 16);
// B in L0B nZ: ((k / 16) x N1 + n / 16) x 256 + (n % 16) x 16 + k % 16, N1 = ceil(n / 16).
// OPEN: the Cube's summation order inside a fractal is not documented. The model adds the
// products of one output element in increasing k, one FP32 rounding per add (a BF16 x BF16
// product is exact in FP32), onto the value in L0C (or onto 0 with cmatrixInitVal).
template <typename Tc, typename T>
__aicore__ inline void Mmad(const LocalTensor<Tc>& c, const LocalTensor<T>& a, const LocalTensor<T>& b,
                            const MmadParams& p) {
  static_assert(sizeof(T) == 2 && sizeof(Tc) == 4, "the model implements BF16 x BF16 -> FP32");
  const auto& opt = ferrattn_cpu::L().opt;
  const uint32_t m1 = (p.m + 15) / 16, k1 = (p.k + 15) / 16, n1 = (p.n + 15) / 16;
  const uint32_t kk = opt.mmad_k_align16 ? k1 * 16 : p.k;
  a.Check(0, uint64_t(m1) * k1 * 256);
  b.Check(0, uint64_t(k1) * n1 * 256);
  c.Check(0, uint64_t(n1) * m1 * 256);
  ferrattn_cpu::CheckAlignIn(a.ptr_, ferrattn_cpu::Core().l0a, 512, "Mmad A");
  ferrattn_cpu::CheckAlignIn(b.ptr_, ferrattn_cpu::Core().l0b, 512, "Mmad B");
  ferrattn_cpu::CheckAlignIn(c.ptr_, ferrattn_cpu::Core().l0c, 64, "Mmad C");
  for (uint32_t m = 0; m < p.m; ++m) {
    for (uint32_t n = 0; n < p.n; ++n) {
      float& acc = c.ptr_[(n / 16) * m1 * 256 + m * 16 + n % 16];
      float s = p.cmatrixInitVal ? 0.0f : acc;
      for (uint32_t k = 0; k < kk; ++k) {
        const float x = ferrattn_cpu::Bf16ToF32(a.ptr_[((m / 16) * k1 + k / 16) * 256 + (m % 16) * 16 + k % 16]);
        const float y = ferrattn_cpu::Bf16ToF32(b.ptr_[((k / 16) * n1 + n / 16) * 256 + (n % 16) * 16 + k % 16]);
        s = s + x * y;
      }
      acc = s;
    }
  }
}

// L0C (NZ, srcStride C0 rows between column blocks) -> GM (ND with CFG_ROW_MAJOR, dstStride
// elements between rows), FP32 out without quantisation; an atomic add mode set by
// SetAtomicAdd applies.
template <typename T, typename U, const FixpipeConfig& config = CFG_ROW_MAJOR>
__aicore__ inline void Fixpipe(const GlobalTensor<T>& dst, const LocalTensor<U>& src, const FixpipeParamsV220& p) {
  static_assert(sizeof(T) == 4 && sizeof(U) == 4, "the model implements FP32 -> FP32 Fixpipe");
  if (config.format != CO2Layout::ROW_MAJOR) ferrattn_cpu::Fail("Fixpipe: the model implements NZ -> ND");
  if (p.reluEn || p.ndNum != 1) ferrattn_cpu::Fail("Fixpipe: relu and ndNum > 1 are not modelled");
  std::vector<T> row(p.nSize);
  for (uint32_t m = 0; m < p.mSize; ++m) {
    for (uint32_t n = 0; n < p.nSize; ++n) {
      const uint64_t s = uint64_t(n / 16) * p.srcStride * 16 + m * 16 + n % 16;
      src.Check(s, 1);
      std::memcpy(&row[n], &src.ptr_[s], 4);
    }
    dst.Check(uint64_t(m) * p.dstStride, p.nSize);
    detail::GmWrite(dst.GetPhyAddr() + uint64_t(m) * p.dstStride, row.data(), p.nSize);
  }
}

// ---------------------------------------------------------------- vector ops
namespace detail {
template <typename T>
inline void VecW(const LocalTensor<T>& t, uint64_t n, const char* w) {
  t.Check(0, n);
  ferrattn_cpu::CheckAlign(t.ptr_, w);
  ferrattn_cpu::Access(1, true, t.ptr_, n * sizeof(T), w);
}
template <typename T>
inline void VecR(const LocalTensor<T>& t, uint64_t n, const char* w) {
  t.Check(0, n);
  ferrattn_cpu::CheckAlign(t.ptr_, w);
  ferrattn_cpu::Access(1, false, t.ptr_, n * sizeof(T), w);
}
template <typename T, typename F>
inline void Unary2(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t count, F f, const char* w) {
  VecR(src, count, w);
  VecW(dst, count, w);
  for (int32_t i = 0; i < count; ++i) dst.ptr_[i] = f(src.ptr_[i]);
}
template <typename T, typename F>
inline void Binary2(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t count, F f,
                    const char* w) {
  VecR(a, count, w);
  VecR(b, count, w);
  VecW(dst, count, w);
  for (int32_t i = 0; i < count; ++i) dst.ptr_[i] = f(a.ptr_[i], b.ptr_[i]);
}
// Level 0: repeatTime repeats of 8 blocks x (32 / sizeof(T)) elements, the first `mask`
// elements of each repeat active (continuous mask mode), strides in 32-byte blocks.
template <typename T, typename F>
inline void Binary0(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, uint64_t mask,
                    uint8_t repeat, const BinaryRepeatParams& r, F f, const char* w) {
  constexpr uint32_t e = 32 / sizeof(T);
  if (mask == 0 || mask > 8 * e) ferrattn_cpu::Fail(std::string(w) + ": mask out of range");
  if (repeat == 0) return;
  // the span each operand covers (checked and recorded once per instruction)
  const uint32_t last_blk = uint32_t((mask - 1) / e);
  auto span = [&](uint8_t rep_stride, uint8_t blk_stride) {
    return (uint64_t(repeat - 1) * rep_stride + uint64_t(last_blk) * blk_stride) * e + e;
  };
  const uint64_t nd = span(r.dstRepStride, r.dstBlkStride), na = span(r.src0RepStride, r.src0BlkStride),
                 nb = span(r.src1RepStride, r.src1BlkStride);
  a.Check(0, na);
  b.Check(0, nb);
  dst.Check(0, nd);
  ferrattn_cpu::CheckAlign(a.ptr_, w);
  ferrattn_cpu::CheckAlign(b.ptr_, w);
  ferrattn_cpu::CheckAlign(dst.ptr_, w);
  ferrattn_cpu::Access(1, false, a.ptr_, na * sizeof(T), w);
  ferrattn_cpu::Access(1, false, b.ptr_, nb * sizeof(T), w);
  ferrattn_cpu::Access(1, true, dst.ptr_, nd * sizeof(T), w);
  for (uint32_t rep = 0; rep < repeat; ++rep) {
    for (uint32_t i = 0; i < mask; ++i) {
      const uint32_t blk = i / e, el = i % e;
      const uint64_t d = (uint64_t(rep) * r.dstRepStride + blk * r.dstBlkStride) * e + el;
      const uint64_t x = (uint64_t(rep) * r.src0RepStride + blk * r.src0BlkStride) * e + el;
      const uint64_t y = (uint64_t(rep) * r.src1RepStride + blk * r.src1BlkStride) * e + el;
      dst.ptr_[d] = f(a.ptr_[x], b.ptr_[y]);
    }
  }
}
}  // namespace detail

template <typename T>
__aicore__ inline void Add(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           const int32_t& count) {
  detail::Binary2(dst, src0, src1, count, [](T x, T y) { return T(x + y); }, "Add");
}
template <typename T>
__aicore__ inline void Sub(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           const int32_t& count) {
  detail::Binary2(dst, src0, src1, count, [](T x, T y) { return T(x - y); }, "Sub");
}
template <typename T>
__aicore__ inline void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           const int32_t& count) {
  detail::Binary2(dst, src0, src1, count, [](T x, T y) { return T(x * y); }, "Mul");
}
template <typename T>
__aicore__ inline void Div(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           const int32_t& count) {
  detail::Binary2(dst, src0, src1, count, [](T x, T y) { return T(x / y); }, "Div");
}
template <typename T>
__aicore__ inline void Max(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           const int32_t& count) {
  detail::Binary2(dst, src0, src1, count, [](T x, T y) { return x > y ? x : y; }, "Max");
}
template <typename T, bool isSetMask = true>
__aicore__ inline void Add(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           uint64_t mask, const uint8_t repeatTime, const BinaryRepeatParams& repeatParams) {
  detail::Binary0(dst, src0, src1, mask, repeatTime, repeatParams, [](T x, T y) { return T(x + y); }, "Add");
}
template <typename T, bool isSetMask = true>
__aicore__ inline void Sub(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           uint64_t mask, const uint8_t repeatTime, const BinaryRepeatParams& repeatParams) {
  detail::Binary0(dst, src0, src1, mask, repeatTime, repeatParams, [](T x, T y) { return T(x - y); }, "Sub");
}
template <typename T, bool isSetMask = true>
__aicore__ inline void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           uint64_t mask, const uint8_t repeatTime, const BinaryRepeatParams& repeatParams) {
  detail::Binary0(dst, src0, src1, mask, repeatTime, repeatParams, [](T x, T y) { return T(x * y); }, "Mul");
}
template <typename T, bool isSetMask = true>
__aicore__ inline void Div(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           uint64_t mask, const uint8_t repeatTime, const BinaryRepeatParams& repeatParams) {
  detail::Binary0(dst, src0, src1, mask, repeatTime, repeatParams, [](T x, T y) { return T(x / y); }, "Div");
}
template <typename T, bool isSetMask = true>
__aicore__ inline void Max(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                           uint64_t mask, const uint8_t repeatTime, const BinaryRepeatParams& repeatParams) {
  detail::Binary0(dst, src0, src1, mask, repeatTime, repeatParams, [](T x, T y) { return x > y ? x : y; }, "Max");
}
template <typename T, bool isSetMask = true>
__aicore__ inline void Muls(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,
                            const int32_t& count) {
  detail::Unary2(dst, src, count, [&](T x) { return T(x * scalarValue); }, "Muls");
}
template <typename T, bool isSetMask = true>
__aicore__ inline void Adds(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,
                            const int32_t& count) {
  detail::Unary2(dst, src, count, [&](T x) { return T(x + scalarValue); }, "Adds");
}
template <typename T, bool isSetMask = true>
__aicore__ inline void Maxs(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,
                            const int32_t& count) {
  detail::Unary2(dst, src, count, [&](T x) { return x > scalarValue ? x : scalarValue; }, "Maxs");
}
template <typename T, bool isReuseSource = false>
__aicore__ inline void Exp(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count) {
  detail::Unary2(dst, src, count, [](T x) { return T(std::exp(x)); }, "Exp");
}
template <typename T, bool isReuseSource = false>
__aicore__ inline void Ln(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count) {
  detail::Unary2(dst, src, count, [](T x) { return T(std::log(x)); }, "Ln");
}
template <typename T>
__aicore__ inline void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count) {
  detail::VecW(dst, count, "Duplicate");
  for (int32_t i = 0; i < count; ++i) dst.ptr_[i] = scalarValue;
}

// Level 0 with a bit mask (mask[0] lanes 0-63, mask[1] lanes 64-127 of each repeat).
template <typename T, bool isSetMask = true>
__aicore__ inline void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, uint64_t mask[],
                                 const uint8_t repeatTime, const uint16_t dstBlockStride,
                                 const uint8_t dstRepeatStride) {
  constexpr uint32_t e = 32 / sizeof(T);
  ferrattn_cpu::CheckAlign(dst.ptr_, "Duplicate");
  // masked-off lanes are not accessed: check and record the enabled ones only
  for (uint32_t rep = 0; rep < repeatTime; ++rep) {
    for (uint32_t i = 0; i < 8 * e; ++i) {
      if (((mask[i / 64] >> (i % 64)) & 1u) == 0) continue;
      const uint64_t d = (uint64_t(rep) * dstRepeatStride + (i / e) * dstBlockStride) * e + i % e;
      dst.Check(d, 1);
      ferrattn_cpu::Access(1, true, dst.ptr_ + d, sizeof(T), "Duplicate");
      dst.ptr_[d] = scalarValue;
    }
  }
}

// Brcb: each repeat reads 8 32-bit elements and writes each one to all 8 lanes of one 32-byte
// block; blocks dstBlkStride apart, repeats dstRepStride blocks apart.
template <typename T>
__aicore__ inline void Brcb(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint8_t repeatTime,
                            const BrcbRepeatParams& r) {
  static_assert(sizeof(T) == 4, "the model implements 32-bit Brcb");
  if (repeatTime == 0) return;
  const uint64_t nd = (uint64_t(repeatTime - 1) * r.dstRepStride + 7u * r.dstBlkStride) * 8 + 8;
  src.Check(0, uint64_t(repeatTime) * 8);
  dst.Check(0, nd);
  ferrattn_cpu::CheckAlign(src.ptr_, "Brcb");
  ferrattn_cpu::CheckAlign(dst.ptr_, "Brcb");
  ferrattn_cpu::Access(1, false, src.ptr_, uint64_t(repeatTime) * 32, "Brcb");
  ferrattn_cpu::Access(1, true, dst.ptr_, nd * 4, "Brcb");
  for (uint32_t rep = 0; rep < repeatTime; ++rep) {
    for (uint32_t i = 0; i < 8; ++i) {
      const uint64_t d = (uint64_t(rep) * r.dstRepStride + i * r.dstBlkStride) * 8;
      for (uint32_t e = 0; e < 8; ++e) dst.ptr_[d + e] = src.ptr_[rep * 8 + i];
    }
  }
}

namespace detail {
template <typename T, typename F>
inline void WholeReduce(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t mask, int32_t repeat,
                        int32_t dstRepStride, int32_t srcBlkStride, int32_t srcRepStride, F f, T identity,
                        bool adjacent, const char* w) {
  constexpr int32_t e = 32 / sizeof(T);
  if (mask <= 0 || mask > 8 * e) ferrattn_cpu::Fail(std::string(w) + ": mask out of range");
  T v[8 * e];
  if (repeat <= 0) return;
  const uint64_t ns = (uint64_t(repeat - 1) * srcRepStride + uint64_t((mask - 1) / e) * srcBlkStride) * e + e;
  const uint64_t nd = uint64_t(repeat - 1) * dstRepStride + 1;
  src.Check(0, ns);
  dst.Check(0, nd);
  ferrattn_cpu::CheckAlign(src.ptr_, w);
  ferrattn_cpu::CheckAlign(dst.ptr_, w);
  ferrattn_cpu::Access(1, false, src.ptr_, ns * sizeof(T), w);
  ferrattn_cpu::Access(1, true, dst.ptr_, nd * sizeof(T), w);
  for (int32_t rep = 0; rep < repeat; ++rep) {
    for (int32_t i = 0; i < 8 * e; ++i) {
      if (i < mask) {
        const uint64_t s = (uint64_t(rep) * srcRepStride + (i / e) * srcBlkStride) * e + i % e;
        v[i] = src.ptr_[s];
      } else {
        v[i] = identity;
      }
    }
    for (int32_t len = 8 * e; len > 1; len /= 2) {
      for (int32_t i = 0; i < len / 2; ++i) v[i] = adjacent ? f(v[2 * i], v[2 * i + 1]) : f(v[i], v[i + len / 2]);
    }
    dst.ptr_[uint64_t(rep) * dstRepStride] = v[0];
  }
}
}  // namespace detail

// One value per repeat (ORDER_ONLY_VALUE), written dstRepStride elements apart.
// OPEN: the unit of dstRepStride for value-only output; the model reads it as elements.
template <typename T, bool isSetMask = true>
__aicore__ inline void WholeReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                                      const int32_t repeatTime, const int32_t dstRepStride,
                                      const int32_t srcBlkStride, const int32_t srcRepStride,
                                      ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX) {
  if (order != ReduceOrder::ORDER_ONLY_VALUE) ferrattn_cpu::Fail("WholeReduceMax: the model writes values only");
  detail::WholeReduce(dst, src, mask, repeatTime, dstRepStride, srcBlkStride, srcRepStride,
                      [](T x, T y) { return x > y ? x : y; }, T(-INFINITY), false, "WholeReduceMax");
}
template <typename T, bool isSetMask = true>
__aicore__ inline void WholeReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                                      const int32_t repeatTime, const int32_t dstRepStride,
                                      const int32_t srcBlkStride, const int32_t srcRepStride) {
  detail::WholeReduce(dst, src, mask, repeatTime, dstRepStride, srcBlkStride, srcRepStride,
                      [](T x, T y) { return T(x + y); }, T(0), ferrattn_cpu::L().opt.reduce_sum_adjacent,
                      "WholeReduceSum");
}

// Cast with the documented round modes (CAST_RINT: nearest even; CAST_ROUND: nearest, ties away
// from zero; CAST_NONE: exact widening or, int -> float, nearest even).
template <typename T, typename U>
__aicore__ inline void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& round_mode,
                            const uint32_t count) {
  detail::VecR(src, count, "Cast");
  detail::VecW(dst, count, "Cast");
  for (uint32_t i = 0; i < count; ++i) {
    const U x = src.ptr_[i];
    if constexpr (std::is_same<T, bfloat16_t>::value && std::is_same<U, float>::value) {
      if (round_mode != RoundMode::CAST_RINT && round_mode != RoundMode::CAST_ROUND) {
        ferrattn_cpu::Fail("Cast f32 -> bf16: the model implements CAST_RINT and CAST_ROUND");
      }
      dst.ptr_[i] = ferrattn_cpu::F32ToBf16(x, round_mode == RoundMode::CAST_ROUND);
    } else if constexpr (std::is_same<T, float>::value && std::is_same<U, bfloat16_t>::value) {
      dst.ptr_[i] = ferrattn_cpu::Bf16ToF32(x);
    } else if constexpr (std::is_same<T, float>::value && std::is_same<U, float>::value) {
      if (round_mode != RoundMode::CAST_ROUND) ferrattn_cpu::Fail("Cast f32 -> f32: the model implements CAST_ROUND");
      dst.ptr_[i] = std::round(x);
    } else if constexpr (std::is_same<T, int32_t>::value && std::is_same<U, float>::value) {
      if (round_mode != RoundMode::CAST_ROUND && round_mode != RoundMode::CAST_RINT) {
        ferrattn_cpu::Fail("Cast f32 -> s32: the model implements CAST_RINT and CAST_ROUND");
      }
      const float r = round_mode == RoundMode::CAST_ROUND ? std::round(x) : std::nearbyint(x);
      // saturating, as the vector unit converts
      dst.ptr_[i] = r >= 2147483648.0f ? INT32_MAX : (r < -2147483648.0f ? INT32_MIN : int32_t(r));
    } else if constexpr (std::is_same<T, float>::value && std::is_same<U, int32_t>::value) {
      dst.ptr_[i] = float(x);
    } else {
      static_assert(sizeof(T) == 0, "Cast: conversion not modelled");
    }
  }
}

}  // namespace AscendC
