// argmax_rows: the greedy draw, logits [B, V] fp32 -> [B] int64, the first index of each row's
// maximum (ties go to the lowest index, like torch.argmax). torch.argmax on CPU walks the row one
// element at a time: 1.4 ms for 16 x 49,152 logits on the 2-core box, 5 % of a 16-sequence decode
// step; this is two vectorised passes (the max, then the first position holding it), 16 lanes wide
// on AVX-512 and 8 on AVX2.
// Rows must be finite (the sampler replaces non-finite rows before drawing).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace mstar_cpu {

namespace {

int64_t argmax_row(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 run[4] = {_mm512_set1_ps(m), _mm512_set1_ps(m), _mm512_set1_ps(m), _mm512_set1_ps(m)};
  for (; i + 64 <= n; i += 64)  // four independent running maxima: no dependency chain
    for (int v = 0; v < 4; ++v) run[v] = _mm512_max_ps(run[v], _mm512_loadu_ps(x + i + 16 * v));
  m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(run[0], run[1]), _mm512_max_ps(run[2], run[3])));
#elif defined(__AVX2__)
  __m256 run[4] = {_mm256_set1_ps(m), _mm256_set1_ps(m), _mm256_set1_ps(m), _mm256_set1_ps(m)};
  for (; i + 32 <= n; i += 32)
    for (int v = 0; v < 4; ++v) run[v] = _mm256_max_ps(run[v], _mm256_loadu_ps(x + i + 8 * v));
  const __m256 r = _mm256_max_ps(_mm256_max_ps(run[0], run[1]), _mm256_max_ps(run[2], run[3]));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  m = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  i = 0;
#if defined(__AVX512F__)
  const __m512 mv = _mm512_set1_ps(m);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmpeq_ps_mask(_mm512_loadu_ps(x + i), mv);
    if (hit) return i + __builtin_ctz(hit);
  }
#elif defined(__AVX2__)
  const __m256 mv = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(hit);
  }
#endif
  for (; i < n; ++i)
    if (x[i] == m) return i;
  return 0;  // no element equals the max: only possible with NaN, which the caller excludes
}

}  // namespace

at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu(),
              "argmax_rows: logits must be a 2-D fp32 CPU tensor");
  at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) op[r] = n ? argmax_row(xp + r * n, n) : 0;
  });
  return out;
}

}  // namespace mstar_cpu
