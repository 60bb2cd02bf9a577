// quant_matmul: activations x GGUF block-quantized weights, the CPU serving path's projections.
// The kernels and the layout they read are in quant_matmul.h.
#include "quant_matmul.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

namespace mstar_cpu {
namespace qmm {

Weight checked_weight(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset, int64_t bits,
                      int64_t n, int64_t K, const char* who) {
  TORCH_CHECK(bits == 4 || bits == 8, who, ": bits must be 4 or 8, got ", bits);
  TORCH_CHECK(K % kBlock == 0, who, ": K = ", K, " is not a multiple of ", kBlock);
  const int64_t nb = K / kBlock, groups = (n + kRows - 1) / kRows;
  const int64_t vectors = bits == 4 ? 4 : 8;
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.numel() == groups * nb * vectors * 64,
              who, ": codes must be contiguous uint8 with ", groups * nb * vectors * 64, " bytes");
  const bool half = scale.scalar_type() == at::kHalf;
  for (const at::Tensor* p : {&scale, &offset})
    TORCH_CHECK((p->scalar_type() == at::kFloat || p->scalar_type() == at::kHalf) &&
                    p->scalar_type() == scale.scalar_type() && p->is_contiguous() && p->numel() == groups * nb * kRows,
                who, ": scale and offset must be contiguous fp16 or fp32 [", groups, ", ", nb, ", 16] of one dtype");
  return Weight{codes.data_ptr<uint8_t>(), scale.data_ptr(), offset.data_ptr(), half, static_cast<int>(bits), n, K};
}

}  // namespace qmm

at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset,
                        int64_t bits, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "quant_matmul: x must be a 2-D CPU tensor");
  const int64_t M = x.size(0), K = x.size(1);
  const qmm::Weight w = qmm::checked_weight(codes, scale, offset, bits, n, K, "quant_matmul");
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({M, n}, x.options().dtype(at::kFloat));
  if (M == 0 || n == 0) return out;

  thread_local qmm::QuantizedActivations a;  // the calling thread's, reused: no allocation per call
  qmm::reserve(a, M, K);
  const float* xp = xf.data_ptr<float>();
  float* op = out.data_ptr<float>();
  qmm::QuantizedActivations& acts = a;  // not `a` in the lambdas: a thread_local there is the worker's own (empty) one
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) { qmm::quantize_rows(xp, m0, m1, K, acts); });
  at::parallel_for(0, w.groups(), 1, [&](int64_t g0, int64_t g1) { qmm::run_group_range(w, M, acts, op, n, g0, g1); });
  return out;
}

}  // namespace mstar_cpu
