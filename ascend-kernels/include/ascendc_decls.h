// Declarations of the subset of the AscendC API that ascend-kernels use, with the documented
// signatures (CANN "Ascend C API reference": kernel_operator.h), so the kernels can be checked
// with a host compiler where CANN is absent:
//
//   g++ -std=c++17 -fsyntax-only -DFERRATTN_ASCENDC_DECLS -Iascend-kernels/include
//       -Iascend-kernels/amla ascend-kernels/amla/amla_decode.cpp
//
// Declarations only: nothing here runs (no CPU bodies; see docs/ASCEND.md). On a CANN machine
// the real kernel_operator.h is used instead.
#pragma once
#include <cstdint>

#define __global__
#define __aicore__
#define __gm__
using GM_ADDR = uint8_t*;
#define KERNEL_TASK_TYPE_DEFAULT(t) (void)(t)
extern bool g_is_aic;  // stands for the compiler's core-type predicate
#define ASCEND_IS_AIC (g_is_aic)
#define ASCEND_IS_AIV (!g_is_aic)

enum KernelMetaType { KERNEL_TYPE_AIV_ONLY, KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_MIX_AIC_1_2 };
enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_FIX, PIPE_ALL };

struct bfloat16_t {
  uint16_t bits;
};

namespace AscendC {

enum class TPosition { GM, A1, A2, B1, B2, CO1, CO2, VECIN, VECOUT, VECCALC };
using QuePosition = TPosition;
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC };
enum class HardEvent { MTE2_MTE1, MTE1_M, M_FIX, MTE2_V, V_MTE3, MTE3_MTE2, MTE3_V, V_MTE2, FIX_MTE2 };

template <typename T>
class GlobalTensor {
 public:
  __aicore__ void SetGlobalBuffer(__gm__ T* buffer, uint64_t size);
  __aicore__ GlobalTensor operator[](uint64_t offset) const;
  __aicore__ T GetValue(uint64_t offset) const;
  __aicore__ void SetValue(uint64_t offset, T value);
};

template <typename T>
class LocalTensor {
 public:
  __aicore__ LocalTensor operator[](uint32_t offset) const;
  __aicore__ T GetValue(uint32_t offset) const;
  __aicore__ void SetValue(uint32_t offset, T value);
  template <typename U>
  __aicore__ LocalTensor<U> ReinterpretCast() const;
};

template <TPosition pos, int32_t depth>
class TQue {
 public:
  template <typename T>
  __aicore__ LocalTensor<T> AllocTensor();
  template <typename T>
  __aicore__ void EnQue(const LocalTensor<T>& t);
  template <typename T>
  __aicore__ LocalTensor<T> DeQue();
  template <typename T>
  __aicore__ void FreeTensor(LocalTensor<T>& t);
};

template <TPosition pos>
class TBuf {
 public:
  template <typename T>
  __aicore__ LocalTensor<T> Get();
};

class TPipe {
 public:
  template <TPosition pos, int32_t depth>
  __aicore__ void InitBuffer(TQue<pos, depth>& que, uint8_t num, uint32_t len);
  template <TPosition pos>
  __aicore__ void InitBuffer(TBuf<pos>& buf, uint32_t len);
};

struct DataCopyParams {
  uint16_t blockCount;
  uint16_t blockLen;   // in 32-byte blocks
  uint16_t srcStride;
  uint16_t dstStride;
};

struct Nd2NzParams {
  uint16_t ndNum;
  uint16_t nValue;
  uint16_t dValue;
  uint16_t srcNdMatrixStride;
  uint16_t srcDValue;
  uint16_t dstNzC0Stride;
  uint16_t dstNzNStride;
  uint16_t dstNzMatrixStride;
};

struct LoadData2DParams {
  uint16_t startIndex;
  uint8_t repeatTimes;
  uint16_t srcStride;
  uint8_t sid;
  uint16_t dstGap;
  bool ifTranspose;
  uint8_t addrMode;
};

struct MmadParams {
  uint16_t m;
  uint16_t n;
  uint16_t k;
  bool cmatrixInitVal;  // true: overwrite L0C, false: accumulate
};

struct FixpipeParamsV220 {
  uint16_t nSize;
  uint16_t mSize;
  uint16_t srcStride;
  uint32_t dstStride;
};

template <typename T>
__aicore__ void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count);
template <typename T>
__aicore__ void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count);
template <typename T>
__aicore__ void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p);
template <typename T>
__aicore__ void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p);
template <typename T>
__aicore__ void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const Nd2NzParams& p);
template <typename T>
__aicore__ void LoadData(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2DParams& p);
template <typename Tc, typename T>
__aicore__ void Mmad(const LocalTensor<Tc>& c, const LocalTensor<T>& a, const LocalTensor<T>& b, const MmadParams& p);
template <typename Tg, typename Tl>
__aicore__ void Fixpipe(const GlobalTensor<Tg>& dst, const LocalTensor<Tl>& src, const FixpipeParamsV220& p);

template <typename T>
__aicore__ void SetAtomicAdd();
__aicore__ void SetAtomicNone();

template <typename T>
__aicore__ void Muls(const LocalTensor<T>& dst, const LocalTensor<T>& src, T scalar, int32_t count);
template <typename T>
__aicore__ void Adds(const LocalTensor<T>& dst, const LocalTensor<T>& src, T scalar, int32_t count);
template <typename T>
__aicore__ void Add(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t count);
template <typename T>
__aicore__ void Sub(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t count);
template <typename T>
__aicore__ void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t count);
template <typename T>
__aicore__ void Div(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t count);
template <typename T>
__aicore__ void Max(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t count);
template <typename T>
__aicore__ void Maxs(const LocalTensor<T>& dst, const LocalTensor<T>& src, T scalar, int32_t count);
template <typename T>
__aicore__ void Exp(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t count);
template <typename T>
__aicore__ void Duplicate(const LocalTensor<T>& dst, T scalar, int32_t count);
template <typename Td, typename Ts>
__aicore__ void Cast(const LocalTensor<Td>& dst, const LocalTensor<Ts>& src, RoundMode mode, uint32_t count);
template <typename T>
__aicore__ void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& work,
                          int32_t count, bool calIndex = false);
template <typename T>
__aicore__ void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& work,
                          int32_t count);

template <uint8_t modeId, pipe_t pipe>
__aicore__ void CrossCoreSetFlag(uint16_t flagId);
__aicore__ void CrossCoreWaitFlag(uint16_t flagId);
template <HardEvent event>
__aicore__ void SetFlag(int32_t eventId);
template <HardEvent event>
__aicore__ void WaitFlag(int32_t eventId);
template <pipe_t pipe>
__aicore__ void PipeBarrier();

__aicore__ int64_t GetBlockIdx();
__aicore__ int64_t GetBlockNum();
__aicore__ int64_t GetSubBlockIdx();

}  // namespace AscendC

