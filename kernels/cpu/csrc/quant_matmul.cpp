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

at::Tensor dequantize_rows(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset, int64_t bits,
                           int64_t n, int64_t k, const at::Tensor& ids) {
  const qmm::Weight w = qmm::checked_weight(codes, scale, offset, bits, n, k, "dequantize_rows");
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "dequantize_rows: ids must be int64 [T]");
  const at::Tensor idc = ids.contiguous();
  const int64_t T = idc.numel(), nb = k / qmm::kBlock, vectors = bits == 4 ? 4 : 8;
  const int64_t* ip = idc.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(ip[t] >= 0 && ip[t] < n, "dequantize_rows: id ", ip[t], " is not a row of ", n);
  at::Tensor out = at::empty({T, k}, scale.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  auto value = [](float code, float s, float o) {  // s * code + o rounded twice, as packing.unpack_rows
    float p = code * s;
    __asm__("" : "+x"(p));  // keeps the compiler from fusing the two roundings into one FMA
    return p + o;
  };
  for (int64_t t = 0; t < T; ++t) {
    const int64_t g = ip[t] / qmm::kRows, r = ip[t] % qmm::kRows;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* block = w.codes + ((g * nb + b) * vectors) * 64 + r * 4;
      const int64_t at = (g * nb + b) * qmm::kRows + r;
      const float s = w.half ? static_cast<float>(static_cast<const c10::Half*>(w.scale)[at])
                             : static_cast<const float*>(w.scale)[at];
      const float o = w.half ? static_cast<float>(static_cast<const c10::Half*>(w.offset)[at])
                             : static_cast<const float*>(w.offset)[at];
      float* dst = op + t * k + b * qmm::kBlock;
      for (int64_t j = 0; j < vectors; ++j)
        for (int64_t i = 0; i < 4; ++i) {
          const uint8_t c = block[j * 64 + i];
          if (bits == 4) {
            dst[4 * j + i] = value(static_cast<float>(c & 0x0F), s, o);
            dst[16 + 4 * j + i] = value(static_cast<float>(c >> 4), s, o);
          } else {
            dst[4 * j + i] = value(static_cast<float>(c), s, o);
          }
        }
    }
  }
  return out;
}

}  // namespace mstar_cpu
