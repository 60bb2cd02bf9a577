// attention: one layer's whole attention between the qkv and o projections, in one op:
//
//   RoPE(q, k) at positions -> store k, v in the paged cache at slot_mapping -> paged causal attention
//
// for a step's flat batch of T tokens mixing decode rows and prefill chunks (the kernels/reference
// oracle does the same with apply_rotary_ref + store_kv_ref + paged_attention_ref):
//
//   qkv [T, (Hq + 2 Hk) D] (fp32 or bf16)    positions [T] int64     cos_sin [P, D] fp32 = cat(cos, sin)
//   k_cache, v_cache [NB, BS, Hk, D] (fp32 or bf16), written at slot = block * BS + offset (-1 = skip)
//   block_tables [B, W] int32, cu_seqlens_q [B + 1] int32, context_lens [B] int32
//   -> out [T, Hq D] in qkv's dtype. Sequence i owns rows cu[i]:cu[i+1], the last q_len of its
//   context_lens[i] positions; row r at position p attends keys 0 .. p (GQA: Hq % Hk == 0), or with a
//   sliding window W > 0 only p - W < n <= p (keys before the item's first window are not read).
//
// Math in fp32, softmax in two passes over the row's scores (max, then exp and sum). All tokens'
// K/V are stored before any row attends (a prefill chunk attends its own keys). Work items are
// (sequence, KV head, up to kRowsPerItem query rows): each K/V vector read serves the G query
// heads of its group and all rows of the item.
#pragma once
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

// The kernels, shared by attention.cpp (the op) and decoder.cpp (the fused decoder stack).
namespace mstar_cpu::attn {


constexpr int64_t kRowsPerItem = 8;

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }
template <typename T>
inline T from_float(float v) { return static_cast<T>(v); }

struct Shapes {
  int64_t T, B, Hq, Hk, G, D, BS, W, P;
  int64_t window = 0;  // sliding window in keys; 0 = every key up to the row's position
};

// The first key any of rows [p0, p1] can see: 0, or the first row's window start.
inline int64_t first_key(const Shapes& s, int64_t p0) { return s.window > 0 ? std::max<int64_t>(0, p0 - s.window + 1) : 0; }

// Phase 1: RoPE on q (scaled, into q_out fp32 [T, Hq, D]) and k; k, v into the cache.
template <typename X, typename C>
void rotate_and_store(const Shapes& s, const X* qkv, const int64_t* positions, const float* cos_sin, C* k_cache,
                      C* v_cache, const int64_t* slots, float* q_out, float scale, int64_t t0, int64_t t1) {
  const int64_t half = s.D / 2, row = (s.Hq + 2 * s.Hk) * s.D;
  for (int64_t t = t0; t < t1; ++t) {
    const float* cs = cos_sin + positions[t] * s.D;  // cos[half], then sin[half]
    const X* x = qkv + t * row;
    for (int64_t h = 0; h < s.Hq; ++h) {
      const X* xh = x + h * s.D;
      float* o = q_out + (t * s.Hq + h) * s.D;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = to_float(xh[i]), x2 = to_float(xh[i + half]);
        o[i] = (x1 * cs[i] - x2 * cs[half + i]) * scale;
        o[i + half] = (x2 * cs[i] + x1 * cs[half + i]) * scale;
      }
    }
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    for (int64_t h = 0; h < s.Hk; ++h) {
      const X* kh = x + (s.Hq + h) * s.D;
      const X* vh = x + (s.Hq + s.Hk + h) * s.D;
      C* kc = k_cache + (slot * s.Hk + h) * s.D;
      C* vc = v_cache + (slot * s.Hk + h) * s.D;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = to_float(kh[i]), x2 = to_float(kh[i + half]);
        kc[i] = from_float<C>(x1 * cs[i] - x2 * cs[half + i]);
        kc[i + half] = from_float<C>(x2 * cs[i] + x1 * cs[half + i]);
      }
      for (int64_t i = 0; i < s.D; ++i) vc[i] = from_float<C>(to_float(vh[i]));
    }
  }
}

struct Item {
  int64_t seq, row0, rows, kv_head;
};

// exp(x) for x <= 0 (softmax after subtracting the row max) as 2^i * 2^f, 2^f by its degree-6
// Taylor polynomial on [-1/2, 1/2] (relative error < 2e-7). Plain float code: the compiler
// vectorises it inside an `omp simd` loop, where std::exp stays one libm call per element
// (measured 5x slower attention at 1,000 keys). x < -87 gives ~1e-38, -1e30 gives 0.
inline float exp_nonpositive(float x) {
  const float t = std::max(x, -87.f) * 1.4426950408889634f;  // x log2(e)
  const float whole = std::nearbyint(t);
  const float f = t - whole;
  float p = 1.5403530393381606e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  const float scaled = std::bit_cast<float>(std::bit_cast<int32_t>(p) + (static_cast<int32_t>(whole) << 23));
  return x < -1e29f ? 0.f : scaled;
}

// Scratch reused across calls by each thread (the op runs ~30 times a step: no allocation per call).
struct Scratch {
  std::vector<float> scores, acc, inv_sum;
};

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define MSTAR_DECODE_REGISTERS 1
// The decode case (one query row per item: every decode step) with the head dim in NV vectors of
// kLanes floats: q and the output accumulators of the G heads stay in registers, each key's K and V
// vectors are loaded once for the whole GQA group. ~5x the generic loops below (which re-read the
// accumulators from memory and pay a loop prologue per 64-float dot product). One body for both
// widths: AVX-512 (16 lanes) and AVX2 (8 lanes; 16 ymm registers, so a GQA group of 3 at D = 64
// spills some of q to L1, still ~3x the generic loops).
#if defined(__AVX512F__)
using vf = __m512;
constexpr int kLanes = 16;
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline vf vload(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float x) { return _mm512_set1_ps(x); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vfmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
inline void vstore(float* p, vf v) { _mm512_store_ps(p, v); }
#else
using vf = __m256;
constexpr int kLanes = 8;
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline vf vload(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset1(float x) { return _mm256_set1_ps(x); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vfmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vf v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
inline void vstore(float* p, vf v) { _mm256_store_ps(p, v); }
#endif

constexpr int kMaxGroup = 8;

template <int NV, typename X, typename C>
bool attend_decode(const Shapes& s, const Item& it, const float* q, const C* k_cache, const C* v_cache,
                   const int32_t* table, int64_t n0, int64_t n_keys, X* out, std::vector<float>& scores) {
  // keys n0 .. n_keys - 1 (n0 > 0 only under a sliding window); scores keep absolute key indices
  if (s.G > kMaxGroup) return false;
  const int64_t key_stride = s.Hk * s.D, G = s.G;
  const float* qh = q + (it.kv_head * G) * s.D;  // the group's G query heads, contiguous
  scores.resize(G * n_keys);
  vf qv[kMaxGroup][NV];
  for (int64_t g = 0; g < G; ++g)
    for (int v = 0; v < NV; ++v) qv[g][v] = vload(qh + g * s.D + v * kLanes);
  for (int64_t p0 = n0 / s.BS * s.BS; p0 < n_keys; p0 += s.BS) {
    const C* kpage = k_cache + (static_cast<int64_t>(table[p0 / s.BS]) * s.BS * s.Hk + it.kv_head) * s.D;
    const int64_t in_page = std::min(s.BS, n_keys - p0);
    for (int64_t jj = std::max<int64_t>(0, n0 - p0); jj < in_page; ++jj) {
      const C* k = kpage + jj * key_stride;
      vf kv[NV];
      for (int v = 0; v < NV; ++v) kv[v] = vload(k + v * kLanes);
      for (int64_t g = 0; g < G; ++g) {
        vf d = vmul(qv[g][0], kv[0]);
        for (int v = 1; v < NV; ++v) d = vfmadd(qv[g][v], kv[v], d);
        scores[g * n_keys + p0 + jj] = vsum(d);
      }
    }
  }
  float inv_sum[kMaxGroup];
  for (int64_t g = 0; g < G; ++g) {
    float* sc = scores.data() + g * n_keys;
    float mx = sc[n0];
    for (int64_t n = n0 + 1; n < n_keys; ++n) mx = std::max(mx, sc[n]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t n = n0; n < n_keys; ++n) {
      sc[n] = exp_nonpositive(sc[n] - mx);
      sum += sc[n];
    }
    inv_sum[g] = 1.f / sum;
  }
  vf acc[kMaxGroup][NV];
  for (int64_t g = 0; g < G; ++g)
    for (int v = 0; v < NV; ++v) acc[g][v] = vzero();
  for (int64_t p0 = n0 / s.BS * s.BS; p0 < n_keys; p0 += s.BS) {
    const C* vpage = v_cache + (static_cast<int64_t>(table[p0 / s.BS]) * s.BS * s.Hk + it.kv_head) * s.D;
    const int64_t in_page = std::min(s.BS, n_keys - p0);
    for (int64_t jj = std::max<int64_t>(0, n0 - p0); jj < in_page; ++jj) {
      const C* vrow = vpage + jj * key_stride;
      vf vv[NV];
      for (int v = 0; v < NV; ++v) vv[v] = vload(vrow + v * kLanes);
      for (int64_t g = 0; g < G; ++g) {
        const vf p = vset1(scores[g * n_keys + p0 + jj]);
        for (int v = 0; v < NV; ++v) acc[g][v] = vfmadd(p, vv[v], acc[g][v]);
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    alignas(64) float row[NV * kLanes];
    for (int v = 0; v < NV; ++v) vstore(row + v * kLanes, vmul(acc[g][v], vset1(inv_sum[g])));
    X* o = out + (it.kv_head * G + g) * s.D;
    for (int64_t i = 0; i < s.D; ++i) o[i] = from_float<X>(row[i]);
  }
  return true;
}
#endif

// Phase 2 for one item: rows [row0, row0 + rows) of sequence seq, the G query heads of kv_head.
template <typename X, typename C>
void attend(const Shapes& s, const Item& it, const float* q, const C* k_cache, const C* v_cache,
            const int32_t* block_tables, const int32_t* cu, const int32_t* context_lens, X* out, Scratch& scratch) {
  const int64_t first = cu[it.seq], q_len = cu[it.seq + 1] - first, ctx = context_lens[it.seq];
  const int64_t start = ctx - q_len;      // position of the sequence's first query row
  const int64_t last = start + it.row0 + it.rows - 1;  // the item's last row sees keys 0..last
  const int64_t n_keys = last + 1, n_q = it.rows * s.G;
  if (n_keys <= 0) {  // a padding row (context 0): nothing to attend, the output is zero
    for (int64_t r = 0; r < it.rows; ++r)
      for (int64_t g = 0; g < s.G; ++g) {
        X* o = out + ((first + it.row0 + r) * s.Hq + it.kv_head * s.G + g) * s.D;
        for (int64_t i = 0; i < s.D; ++i) o[i] = from_float<X>(0.f);
      }
    return;
  }
  const int32_t* table = block_tables + it.seq * s.W;
  const int64_t n0 = first_key(s, start + it.row0);  // no row of the item sees a key before it
#if defined(MSTAR_DECODE_REGISTERS)
  if (it.rows == 1 && n_keys > 0) {  // a decode row (or the last row of a chunk): the register path
    const float* qr = q + (first + it.row0) * s.Hq * s.D;
    X* o = out + (first + it.row0) * s.Hq * s.D;
    const bool done =
        s.D == 64    ? attend_decode<64 / kLanes, X, C>(s, it, qr, k_cache, v_cache, table, n0, n_keys, o, scratch.scores)
        : s.D == 128 ? attend_decode<128 / kLanes, X, C>(s, it, qr, k_cache, v_cache, table, n0, n_keys, o, scratch.scores)
        : s.D == 32  ? attend_decode<32 / kLanes, X, C>(s, it, qr, k_cache, v_cache, table, n0, n_keys, o, scratch.scores)
                     : false;
    if (done) return;
  }
#endif
  std::vector<float>& scores = scratch.scores;
  std::vector<float>& acc = scratch.acc;
  std::vector<float>& inv_sum = scratch.inv_sum;
  scores.resize(n_q * n_keys);
  acc.assign(n_q * s.D, 0.f);
  inv_sum.resize(n_q);
  const int64_t key_stride = s.Hk * s.D;  // between consecutive keys of a page
  auto qrow = [&](int64_t r, int64_t g) { return q + ((first + it.row0 + r) * s.Hq + it.kv_head * s.G + g) * s.D; };
  auto page = [&](const C* cache, int64_t p0) {  // the first key of the page holding key p0 (p0 % BS == 0)
    return cache + (static_cast<int64_t>(table[p0 / s.BS]) * s.BS * s.Hk + it.kv_head) * s.D;
  };
  constexpr float kMasked = -1e30f;  // a key this row must not see: its exp is exactly 0
  for (int64_t p0 = n0 / s.BS * s.BS; p0 < n_keys; p0 += s.BS) {
    const C* kpage = page(k_cache, p0);
    const int64_t in_page = std::min(s.BS, n_keys - p0);
    for (int64_t jj = std::max<int64_t>(0, n0 - p0); jj < in_page; ++jj) {
      const int64_t n = p0 + jj;
      const C* k = kpage + jj * key_stride;
      for (int64_t r = 0; r < it.rows; ++r) {
        const int64_t pos = start + it.row0 + r;
        const bool visible = n <= pos && (s.window == 0 || n > pos - s.window);
        for (int64_t g = 0; g < s.G; ++g) {
          float dot = kMasked;
          if (visible) {
            const float* qv = qrow(r, g);
            dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < s.D; ++i) dot += qv[i] * to_float(k[i]);
          }
          scores[(r * s.G + g) * n_keys + n] = dot;
        }
      }
    }
  }
  for (int64_t j = 0; j < n_q; ++j) {
    float* sc = scores.data() + j * n_keys;
    float mx = kMasked;
    for (int64_t n = n0; n < n_keys; ++n) mx = std::max(mx, sc[n]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t n = n0; n < n_keys; ++n) {
      sc[n] = exp_nonpositive(sc[n] - mx);
      sum += sc[n];
    }
    inv_sum[j] = 1.f / sum;
  }
  for (int64_t p0 = n0 / s.BS * s.BS; p0 < n_keys; p0 += s.BS) {
    const C* vpage = page(v_cache, p0);
    const int64_t in_page = std::min(s.BS, n_keys - p0);
    for (int64_t jj = std::max<int64_t>(0, n0 - p0); jj < in_page; ++jj) {
      const C* v = vpage + jj * key_stride;
      for (int64_t j = 0; j < n_q; ++j) {
        const float p = scores[j * n_keys + p0 + jj];
        if (p == 0.f) continue;
        float* a = acc.data() + j * s.D;
#pragma omp simd
        for (int64_t i = 0; i < s.D; ++i) a[i] += p * to_float(v[i]);
      }
    }
  }
  for (int64_t r = 0; r < it.rows; ++r)
    for (int64_t g = 0; g < s.G; ++g) {
      const int64_t j = r * s.G + g;
      X* o = out + ((first + it.row0 + r) * s.Hq + it.kv_head * s.G + g) * s.D;
      for (int64_t i = 0; i < s.D; ++i) o[i] = from_float<X>(acc[j * s.D + i] * inv_sum[j]);
    }
}

// The work items of a step: (sequence, KV head, up to kRowsPerItem query rows).
inline void build_items(int64_t B, int64_t Hk, const int32_t* cu, std::vector<Item>& items) {
  items.clear();
  for (int64_t i = 0; i < B; ++i)
    for (int64_t r0 = 0; r0 < cu[i + 1] - cu[i]; r0 += kRowsPerItem)
      for (int64_t h = 0; h < Hk; ++h) items.push_back({i, r0, std::min<int64_t>(kRowsPerItem, cu[i + 1] - cu[i] - r0), h});
}

}  // namespace mstar_cpu::attn
