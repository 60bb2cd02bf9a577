// argmax_rows: the greedy draw, logits [B, V] fp32 -> [B] int64, the first index of each row's
// maximum (ties go to the lowest index, like torch.argmax). torch.argmax on CPU walks the row one
// element at a time: 1.4 ms for 16 x 49,152 logits on the 2-core box, 5 % of a 16-sequence decode
// step; this is two vectorised passes (the max, then the first position holding it), 16 lanes wide
// on AVX-512 and 8 on AVX2.
// Rows may hold -inf (tokens a grammar mask or a filter removed); not all of them, and no NaN.
// greedy_rows: the same draw straight from the model's logits, with the sampler's finiteness check
// folded into the max pass: -1 for a row holding a NaN or an infinity (a broken forward). The
// sampler takes it for an all-greedy batch (services/generation/sampler.py): one pass and one call
// instead of a sum, an isfinite, a host copy and six parameter tensors (0.5 ms of a 1-row step
// after the weights have streamed through the caches).
// gumbel_argmax: the sampled draw, logits [R, V] fp32 (already filtered: removed tokens are -inf),
// temperature [R] fp32, seeds and offsets [R] int64 -> [R] int64:
// argmax_v x_v / t + g_v with g_v = -log(-log(u_v)), u_v = counter_hash(key, v), the reference's
// draw (kernels/reference/sampling.py draw_ref) with the same integer hash and fp32 steps; a row
// with t = 0 takes the argmax; keys as counter_hash.row_keys. The reference hashes and takes two logs of every token: 3.2 ms a
// row at V = 49,152 on the 2-core box, as long as a 1-row decode step (every sampled token and every
// sampled speculative verify row pays it). Here only tokens that can win are hashed: u <= 1 - 2^-24,
// so g_v < 16.64, and a token whose x_v / t + 16.7 is below the score of the row's largest logit
// cannot be the argmax; a row's tokens are split in chunks over the threads. Logs are the C library's logf where the reference uses torch's: the two
// can differ in the last bit, which changes a token only at a near-exact tie of two scores.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace mstar_cpu {

namespace {

// The first index of the row's max; with check_finite, -1 when the row holds a NaN or an infinity.
template <bool check_finite>
int64_t argmax_row(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 run[4] = {_mm512_set1_ps(m), _mm512_set1_ps(m), _mm512_set1_ps(m), _mm512_set1_ps(m)};
  __m512 zero = _mm512_setzero_ps(), probe = zero;  // probe += x * 0: stays 0 iff every x is finite
  for (; i + 64 <= n; i += 64)  // four independent running maxima: no dependency chain
    for (int v = 0; v < 4; ++v) {
      const __m512 xv = _mm512_loadu_ps(x + i + 16 * v);
      run[v] = _mm512_max_ps(run[v], xv);
      if constexpr (check_finite) probe = _mm512_add_ps(probe, _mm512_mul_ps(xv, zero));
    }
  m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(run[0], run[1]), _mm512_max_ps(run[2], run[3])));
  if constexpr (check_finite)
    if (_mm512_cmp_ps_mask(probe, zero, _CMP_NEQ_UQ)) return -1;
#elif defined(__AVX2__)
  __m256 run[4] = {_mm256_set1_ps(m), _mm256_set1_ps(m), _mm256_set1_ps(m), _mm256_set1_ps(m)};
  __m256 zero = _mm256_setzero_ps(), probe = zero;  // probe += x * 0: stays 0 iff every x is finite
  for (; i + 32 <= n; i += 32)
    for (int v = 0; v < 4; ++v) {
      const __m256 xv = _mm256_loadu_ps(x + i + 8 * v);
      run[v] = _mm256_max_ps(run[v], xv);
      if constexpr (check_finite) probe = _mm256_add_ps(probe, _mm256_mul_ps(xv, zero));
    }
  const __m256 r = _mm256_max_ps(_mm256_max_ps(run[0], run[1]), _mm256_max_ps(run[2], run[3]));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  m = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  if constexpr (check_finite)
    if (_mm256_movemask_ps(_mm256_cmp_ps(probe, zero, _CMP_NEQ_UQ))) return -1;
#endif
  for (; i < n; ++i) {
    if constexpr (check_finite)
      if (!std::isfinite(x[i])) return -1;
    m = std::max(m, x[i]);
  }
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

template <bool check_finite>
at::Tensor argmax_each_row(const at::Tensor& logits, const char* name) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu(), name,
              ": logits must be a 2-D fp32 CPU tensor");
  at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) op[r] = n ? argmax_row<check_finite>(xp + r * n, n) : 0;
  });
  return out;
}

inline uint32_t mix32(uint32_t x) {  // counter_hash.mix32: lowbias32, arithmetic mod 2^32
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

uint32_t row_key(int64_t seed, int64_t offset) {  // counter_hash.row_keys
  const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
  uint32_t key = mix32(static_cast<uint32_t>(o >> 32) ^ 0x9E3779B9u);  // ^ GOLDEN
  key = mix32(static_cast<uint32_t>(o) ^ key);
  key = mix32(static_cast<uint32_t>(s >> 32) ^ key);
  return mix32(static_cast<uint32_t>(s) ^ key);
}

inline float gumbel(uint32_t key, int64_t v) {
  const uint32_t h = mix32(key ^ mix32(static_cast<uint32_t>(v) + 0x632BE5ABu));  // + SALT mod 2^32
  const float u = static_cast<float>((h >> 9) * 2 + 1) * 0x1p-24f;  // an odd multiple of 2^-24 in (0, 1)
  return -std::log(-std::log(u));
}

struct Best {
  float score;
  int64_t index;
  bool beats(const Best& other) const {  // ties: the lowest index, as torch.argmax
    return score > other.score || (score == other.score && index < other.index);
  }
};

// The best token of x[v0, v1) against `floor` (the score of the row's largest logit, `top`).
Best best_in(const float* x, int64_t v0, int64_t v1, float t, uint32_t key, Best floor) {
  constexpr float kMostNoise = 16.7f;  // > -log(-log(1 - 2^-24)) = 16.64, the largest g
  Best best = floor;
  for (int64_t v = v0; v < v1; ++v) {
    const float s = x[v] / t;
    if (s + kMostNoise < floor.score || v == floor.index) continue;
    const Best here{s + gumbel(key, v), v};
    if (here.beats(best)) best = here;
  }
  return best;
}

}  // namespace

at::Tensor gumbel_argmax(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& seeds,
                         const at::Tensor& offsets) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu(),
              "gumbel_argmax: logits must be a 2-D fp32 CPU tensor");
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(temperature.scalar_type() == at::kFloat && temperature.numel() == rows &&
                  seeds.scalar_type() == at::kLong && seeds.numel() == rows && offsets.scalar_type() == at::kLong &&
                  offsets.numel() == rows,
              "gumbel_argmax: temperature [R] fp32, seeds and offsets [R] int64 for logits [R, V]");
  at::Tensor x = logits.contiguous(), t = temperature.contiguous();
  at::Tensor sd = seeds.contiguous(), of = offsets.contiguous();
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  const float* tp = t.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  std::vector<uint32_t> keys(rows);
  std::vector<Best> floors(rows);
  std::vector<bool> sampled(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xp + r * n;
    const int64_t top = n ? argmax_row<false>(row, n) : 0;
    op[r] = top;  // greedy rows, and rows with every token removed, keep it
    sampled[r] = n && tp[r] != 0.0f && row[top] > -std::numeric_limits<float>::infinity();
    keys[r] = row_key(sd.data_ptr<int64_t>()[r], of.data_ptr<int64_t>()[r]);
    if (sampled[r]) floors[r] = Best{row[top] / tp[r] + gumbel(keys[r], top), top};
  }
  // Work items of up to 8,192 tokens, so one row's draw takes every thread.
  constexpr int64_t kChunk = 8192;
  const int64_t chunks = std::max<int64_t>(1, (n + kChunk - 1) / kChunk);
  std::vector<Best> found(rows * chunks);
  at::parallel_for(0, rows * chunks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / chunks, c = i % chunks;
      if (sampled[r])
        found[i] = best_in(xp + r * n, c * kChunk, std::min(n, (c + 1) * kChunk), tp[r], keys[r], floors[r]);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    if (!sampled[r]) continue;
    Best best = floors[r];
    for (int64_t c = 0; c < chunks; ++c)
      if (found[r * chunks + c].beats(best)) best = found[r * chunks + c];
    op[r] = best.index;
  }
  return out;
}

at::Tensor argmax_rows(const at::Tensor& logits) { return argmax_each_row<false>(logits, "argmax_rows"); }

at::Tensor greedy_rows(const at::Tensor& logits) { return argmax_each_row<true>(logits, "greedy_rows"); }

}  // namespace mstar_cpu
