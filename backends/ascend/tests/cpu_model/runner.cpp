// Runs ascend-kernels/amla/amla_decode.cpp on the CPU model of the AscendC API
// (ascend-kernels/include/ascendc_decls.h): one host thread per core, block dim AI Cores, each a
// cube core and its two vector cores, as a mixed 1:2 kernel runs on an Ascend 910B.
//
// Built by the test kernel_cpu with the system g++ into a shared library and called through
// `ferrattn_amla_cpu_launch`. Nothing here changes what the kernel computes: the launch goes
// through the same wrapper ascendc_library generates for a mixed kernel (entry
// auto_gen_<name>_kernel, a hidden first ffts_addr that sets the hardware sync base, a trailing
// overflow_status), so a kernel that relies on anything else fails here too.
#include "amla_decode.cpp"

#include <cstdio>
#include <exception>
#include <memory>
#include <thread>

// What ascendc_library generates around a mixed kernel on dav-c220 (asc-devkit
// cmake/asc/legacy_modules/util/extract_host_stub.py, _generate_ffts_source): set the sync base
// from the hidden first argument, then call the kernel.
extern "C" void auto_gen_amla_decode_bf16_576_512_kernel(GM_ADDR ffts_addr, GM_ADDR q, GM_ADDR kv, GM_ADDR seqlens,
                                                         GM_ADDR o_acc, GM_ADDR out, GM_ADDR lse, GM_ADDR workspace,
                                                         GM_ADDR params, GM_ADDR overflow_status) {
  (void)overflow_status;
  if (ffts_addr != nullptr) AscendC::SetSyncBaseAddr(reinterpret_cast<uint64_t>(ffts_addr));
  amla_decode_bf16_576_512(q, kv, seqlens, o_acc, out, lse, workspace, params);
}

namespace {

using Body = void (*)(void* ctx);

// Runs `body` on block_dim x (1 cube + 2 vector) threads; returns 0 or 1 with the first error.
int RunCores(uint32_t block_dim, uint64_t sync_addr, const void* const* allocs, const size_t* sizes, size_t n_allocs,
             uint32_t flags, double timeout_s, Body body, void* ctx, char* err, size_t err_len) {
  // one launch at a time: the model's launch state is process-wide (as one NPU stream)
  static std::mutex one_launch;
  std::lock_guard<std::mutex> serial(one_launch);
  ferrattn_cpu::Launch launch;
  launch.opt.mmad_k_align16 = (flags & 1u) != 0;
  launch.opt.reduce_sum_adjacent = (flags & 2u) != 0;
  launch.opt.flag_timeout_s = timeout_s;
  launch.hardware_sync_addr = sync_addr;
  for (size_t i = 0; i < n_allocs; ++i) launch.gm.emplace_back(static_cast<const uint8_t*>(allocs[i]), sizes[i]);
  ferrattn_cpu::g_launch = &launch;
  std::vector<std::unique_ptr<ferrattn_cpu::Group>> groups;
  std::vector<std::unique_ptr<ferrattn_cpu::CoreCtx>> cores;
  for (uint32_t i = 0; i < block_dim; ++i) {
    groups.push_back(std::make_unique<ferrattn_cpu::Group>());
    for (int k = 0; k < 3; ++k) {
      auto c = std::make_unique<ferrattn_cpu::CoreCtx>();
      c->kind = k == 0 ? ferrattn_cpu::CoreKind::AIC : ferrattn_cpu::CoreKind::AIV;
      c->block_idx = i;
      c->sub_idx = k == 0 ? 0 : k - 1;
      c->block_num = block_dim;
      c->group = groups.back().get();
      // Ascend 910B capacities; stale contents are modelled as 0xFF bytes (NaN)
      if (k == 0) {
        c->l1.assign(512 * 1024, 0xFF);
        c->l0a.assign(64 * 1024, 0xFF);
        c->l0b.assign(64 * 1024, 0xFF);
        c->l0c.assign(128 * 1024, 0xFF);
      } else {
        c->ub.assign(192 * 1024, 0xFF);
      }
      cores.push_back(std::move(c));
    }
  }
  std::vector<std::thread> threads;
  for (auto& c : cores) {
    ferrattn_cpu::CoreCtx* cp = c.get();
    threads.emplace_back([cp, body, ctx] {
      ferrattn_cpu::tls_core = cp;
      try {
        body(ctx);
      } catch (const std::exception& e) {
        ferrattn_cpu::Abort(std::string(cp->kind == ferrattn_cpu::CoreKind::AIC ? "cube" : "vector") + " core " +
                            std::to_string(cp->block_idx) + "." + std::to_string(cp->sub_idx) + ": " + e.what());
      }
      ferrattn_cpu::tls_core = nullptr;
    });
  }
  for (auto& t : threads) t.join();
  ferrattn_cpu::g_launch = nullptr;
  if (launch.aborted) {
    std::snprintf(err, err_len, "%s", launch.first_error.c_str());
    return 1;
  }
  for (auto& c : cores) {
    if (body != nullptr && c->task_type >= 0 && c->task_type != KERNEL_TYPE_MIX_AIC_1_2) {
      std::snprintf(err, err_len, "kernel declared task type %d, not KERNEL_TYPE_MIX_AIC_1_2", c->task_type);
      return 1;
    }
  }
  return 0;
}

struct KernelArgs {
  void* ffts;
  void* const* args;  // the kernel's 8 arguments
};

void KernelBody(void* ctx) {
  auto* k = static_cast<KernelArgs*>(ctx);
  auto a = [&](int i) { return static_cast<GM_ADDR>(k->args[i]); };
  auto_gen_amla_decode_bf16_576_512_kernel(static_cast<GM_ADDR>(k->ffts), a(0), a(1), a(2), a(3), a(4), a(5), a(6),
                                           a(7), nullptr);
}

// A kernel whose vector cores wait for a flag the cube core never sets.
void HangBody(void*) {
  AscendC::SetSyncBaseAddr(ferrattn_cpu::L().hardware_sync_addr);
  if ASCEND_IS_AIV {
    CrossCoreWaitFlag(5);
  }
}

}  // namespace

// Launches the AMLA kernel on block_dim AI Cores of the model. `args`: q, kv, seqlens, o_acc,
// out, lse, workspace, params (host pointers standing for device memory); `allocs`/`sizes`: every
// buffer the host allocated (GM accesses outside them fail); `ffts`: the hardware sync address
// (null: the sync base is never set); flags bit 0: Mmad reads Align16(k), bit 1: adjacent-pair
// WholeReduceSum. Returns 0, or 1 with a message in err.
extern "C" int ferrattn_amla_cpu_launch(uint32_t block_dim, void* ffts, void* const* args, const void* const* allocs,
                                        const size_t* sizes, size_t n_allocs, uint32_t flags, double timeout_s,
                                        char* err, size_t err_len) {
  KernelArgs k{ffts, args};
  return RunCores(block_dim, reinterpret_cast<uint64_t>(ffts), allocs, sizes, n_allocs, flags, timeout_s, KernelBody,
                  &k, err, err_len);
}

// Runs HangBody: must fail with a hang report after timeout_s.
extern "C" int ferrattn_cpu_hang_probe(double timeout_s, char* err, size_t err_len) {
  static uint8_t sync_word;
  return RunCores(1, reinterpret_cast<uint64_t>(&sync_word), nullptr, nullptr, 0, 0, timeout_s, HangBody, nullptr, err,
                  err_len);
}
