// AMLA decode on Ascend 910: configuration constants of the target in one place, and the
// parameter block shared with the host (ferrattn-ascend `kernels::KernelParams`, same layout).
#pragma once
#include <cstdint>

namespace amla {

// Section 4.2 hierarchical tiling (validated on the host by ferrattn-core amla::tiling).
constexpr uint32_t kDk = 576;          // Q/K head dim (512 latent + 64 RoPE)
constexpr uint32_t kDv = 512;          // V head dim = first 512 latent columns
constexpr uint32_t kBlockK = 512;      // KV tokens per FlashAttention iteration
constexpr uint32_t kMaxRows = 256;     // M: 128 heads x 2 query tokens
constexpr uint32_t kSingleM = 128;     // Q/P stripe rows in L1
constexpr uint32_t kSingleKC1 = 288;   // C1 singleK
constexpr uint32_t kSingleKC2 = 256;   // C2 singleK
constexpr uint32_t kBaseM = 128;
constexpr uint32_t kBaseN = 128;
constexpr uint32_t kBaseKC1 = 96;      // 576 = 6 x 96
constexpr uint32_t kBaseKC2 = 128;     // 512 = 4 x 128
constexpr uint32_t kL1BufBytes = 72 * 1024;
constexpr uint32_t kL1QPBufs = 4;      // Q, then P, resident for an iteration
constexpr uint32_t kL1KVBufs = 3;      // K/V ring
constexpr uint32_t kVecRows = 16;      // S rows per UB pass of [V1] and the last [V]
constexpr uint32_t kVecMaxRows = kMaxRows / 2;  // rows of one vector core (its half of M)
constexpr uint32_t kNBrcb = 128;       // INT32 words of N per row per atomic-add burst
constexpr uint32_t kPreload = 2;       // Preload count (section 4.1.3)
constexpr uint32_t kWsDepth = kPreload + 1;  // S/P blocks in flight per core in the GM workspace

// Cross-core flag ids (Cube <-> Vector), one per direction and purpose.
constexpr uint16_t kFlagSReady = 1;    // C1 FixP of S done      (Cube -> Vector)
constexpr uint16_t kFlagPReady = 2;    // V1 wrote P             (Vector -> Cube)
constexpr uint16_t kFlagOAdded = 3;    // C2 FixP added into O   (Cube -> Vector)

// Intra-core event ids of the vector core (HardEvent flags around TBuf tensors, which get no
// automatic synchronisation from a queue).
constexpr int32_t kEventN = 0;         // nbuf: V writes N, MTE3 atomically adds it into O

// Per-core GM workspace: kWsDepth blocks of S (FP32) then kWsDepth blocks of P (BF16), each
// kMaxRows x kBlockK. The host allocates block_dim times this (ferrattn-ascend launch.rs).
constexpr uint64_t kWsBytesPerCore = uint64_t(kWsDepth) * kMaxRows * kBlockK * (4 + 2);

struct AmlaParams {
  uint32_t batch;
  uint32_t seq_q;
  uint32_t heads;
  uint32_t max_seq_k;
  uint32_t block_k;
  uint32_t compensation;
  uint32_t causal;
  uint32_t reserved;
  float scale;
  uint32_t reserved2;
};

}  // namespace amla
