// quant_matmul: activations x GGUF block-quantized weights, the CPU serving path's projections.
//
// A weight row n is stored as GGUF stores it, in blocks of 32: w[n, 32b + i] = s[n,b] * c[n,b,i] + o[n,b]
// with unsigned codes c (4-bit 0..15 or 8-bit 0..255) and a per-block scale s and offset o (Q4_0:
// o = -8 s; Q4_1/Q4_K/Q5_*: the block's min; Q8_0: codes + 128 with o = -128 s). The activations
// are quantized per 32-wide block to int8, x[m, 32b + i] ~= dx[m,b] * q[m,b,i] (what llama.cpp does
// for these formats), so the inner loop is an integer u8 x s8 dot product:
//
//   out[m, n] = sum_b s[n,b] dx[m,b] * (sum_i c[n,b,i] q[m,b,i])  +  o[n,b] * dx[m,b] * (sum_i q[m,b,i])
//
// Layout (kernels/cpu/packing.py): output rows in groups of 16. For group g and block b, vector j
// (64 bytes) holds 4 consecutive codes of each of the 16 rows, so one vpdpbusd lane = one output row:
//   8-bit: codes[g][b][j][r][i] = c[16g + r, b, 4j + i]                              j < 8
//   4-bit: codes[g][b][j][r][i] = c[16g + r, b, 4j + i] | c[16g + r, b, 16 + 4j + i] << 4   j < 4
//   scale[g][b][r], offset[g][b][r]: fp16 when the file's values are exactly fp16 (Q4_0/1, Q5_0/1,
//   Q8_0: 2+2 bytes a block instead of 4+4; at one activation row the step is bound by reading
//   these bytes), else fp32 (the K types' d * sc products).
// Paths: AVX512-VNNI (vpdpbusd), AVX2 (maddubs + madd), and a scalar one for any other CPU; the
// library is built for the machine it runs on (-march=native, kernels/cpu/library.py).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

// The kernels, shared by quant_matmul.cpp (the op) and decoder.cpp (the fused decoder stack).
namespace mstar_cpu::qmm {


constexpr int64_t kBlock = 32;  // weights per quantization block
constexpr int64_t kRows = 16;   // output rows per interleaved group

// The activations of M rows quantized per block: q [M, K] int8, d [M, nb] scale, ds [M, nb] = d * sum(q),
// sum [M, nb] = sum(q) (the AVX2 8-bit path needs the integer sum).
struct QuantizedActivations {
  std::vector<int8_t> q;
  std::vector<float> d, ds;
  std::vector<int32_t> sum;
};

inline void quantize_rows(const float* x, int64_t m0, int64_t m1, int64_t K, QuantizedActivations& a) {
  const int64_t nb = K / kBlock;
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kBlock;
      int8_t* qb = a.q.data() + m * K + b * kBlock;
#if defined(__AVX512F__) && defined(__AVX512BW__)
      __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
      __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(inv)));  // round to nearest even
      __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(inv)));
      int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtsepi32_epi8(q1));
#elif defined(__AVX2__)
      // As llama.cpp's quantize_row_q8_0: 4 vectors of 8, the same rounding as the scalar path.
      __m256 v[4];
      const __m256 sign = _mm256_set1_ps(-0.f);
      __m256 vmax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      float d = _mm_cvtss_f32(h) / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));  // nearest even
      __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
      int32_t s = _mm_cvtsi128_si32(t);
      // packs work per 128-bit lane (saturating, like the scalar clamp): put the 8 dwords back in order.
      __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), bytes);
#else
      float amax = 0.f;
      for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
      float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
      int32_t s = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        int32_t v = static_cast<int32_t>(std::nearbyint(xb[i] * inv));  // round to nearest even
        qb[i] = static_cast<int8_t>(std::clamp(v, -127, 127));
        s += qb[i];
      }
#endif
      a.d[m * nb + b] = d;
      a.ds[m * nb + b] = d * static_cast<float>(s);
      a.sum[m * nb + b] = s;
    }
  }
}

// One group of 16 output rows x MT activation rows over all blocks. codes/scale/offset point at the
// group; q/d/ds/sum at the first activation row; out at [row 0, column 16g] with row stride ldo.
template <typename S>
struct Tile {
  const uint8_t* codes;
  const S* scale;
  const S* offset;
  int64_t nb, K;
  const int8_t* q;
  const float* d;
  const float* ds;
  const int32_t* sum;
  float* out;
  int64_t ldo;
  int ncols;  // valid output columns of this group (16 except in a padded last group)
};

// At one activation row a tile streams each weight byte from DRAM once and does little with
// it, and a layer's matrices are short streams (0.2-2 MB, split between threads) that the hardware
// prefetcher ramps up on again at every call. So both SIMD paths ask for the block a fixed distance
// ahead (T0; prefetches never fault, so running past the weight's end is harmless); bit for bit the
// same. AVX2 (a 2-core Zen 2-class box): the default model's projections and head at one row ran at
// 14 GB/s against 21 GB/s for a plain 2-thread read; 1 KB ahead made that 5-12 % faster (medians
// 7.1 and 7.8 against 8.1 ms; 6.6 against 7.2), 2 KB and 4 KB gained less, NTA kept nothing else in
// cache. AVX-512 VNNI (a 2-core Zen 4 EPYC, whole 1-row steps, interleaved runs, best median of 20
// rounds): no prefetch 3.70-4.15 ms, 1 KB 3.39-3.60, 2 KB 2.94-3.51, 4 KB 3.55-3.85, so 2 KB there.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int64_t kPrefetchBytes = 2048;
#else
constexpr int64_t kPrefetchBytes = 1024;
#endif

template <int BITS, typename S>
inline void prefetch_ahead(const Tile<S>& t, const uint8_t* block_codes, int64_t b) {
  constexpr int64_t block_bytes = BITS == 4 ? 4 * 64 : 8 * 64, ahead = kPrefetchBytes / block_bytes;
  for (int64_t k = 0; k < block_bytes; k += 64)
    _mm_prefetch(reinterpret_cast<const char*>(block_codes + kPrefetchBytes + k), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(t.scale + (b + ahead) * kRows), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(t.offset + (b + ahead) * kRows), _MM_HINT_T0);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int kMaxTileRows = 8;

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int BITS, int MT, typename S>
void run_tile(const Tile<S>& t) {
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < t.nb; ++b) {
    __m512i w[8];
    if constexpr (BITS == 4) {
      const uint8_t* p = t.codes + b * 4 * 64;
      prefetch_ahead<BITS>(t, p, b);
      for (int j = 0; j < 4; ++j) {
        __m512i v = _mm512_loadu_si512(p + j * 64);
        w[j] = _mm512_and_si512(v, low4);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      }
    } else {
      const uint8_t* p = t.codes + b * 8 * 64;
      prefetch_ahead<BITS>(t, p, b);
      for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(p + j * 64);
    }
    const __m512 s = load16(t.scale + b * kRows);
    const __m512 o = load16(t.offset + b * kRows);
    for (int r = 0; r < MT; ++r) {
      const int32_t* a = reinterpret_cast<const int32_t*>(t.q + r * t.K + b * kBlock);
      // Two chains of 4 (even and odd j), added once: one chain of 8 dependent vpdpbusd was the
      // block's latency at one row.
      __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        even = _mm512_dpbusd_epi32(even, w[j], _mm512_set1_epi32(a[j]));
        odd = _mm512_dpbusd_epi32(odd, w[j + 1], _mm512_set1_epi32(a[j + 1]));
      }
      const __m512i dot = _mm512_add_epi32(even, odd);
      const int64_t ab = r * t.nb + b;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(t.d[ab])), acc[r]);
      acc[r] = _mm512_fmadd_ps(o, _mm512_set1_ps(t.ds[ab]), acc[r]);
    }
  }
  const __mmask16 keep = t.ncols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << t.ncols) - 1);
  for (int r = 0; r < MT; ++r) _mm512_mask_storeu_ps(t.out + r * t.ldo, keep, acc[r]);
}

#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kMaxTileRows = 4;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// u8 x s8 dot of 4-byte groups into int32 lanes. maddubs saturates int16 pairs: fine for codes < 128
// (|15 * 127 * 2| < 2^15); 8-bit codes go through the signed form (|c - 128| <= 128, see below).
// All 16 output rows of the group at once: each activation broadcast feeds two weight vectors.
// The j loops are unrolled by pragma and each row's sums pinned to a register after every step
// (the empty asm): left to itself, GCC reassociated a block's adds into a tree over all its
// products and spilled them to the stack, and this tile ran 1.3x slower (bench/quant_matmul.py).
template <int BITS, int MT, typename S>
void run_tile(const Tile<S>& t) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[MT][2];
  for (int r = 0; r < MT; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < t.nb; ++b) {
    __m256i dot[MT][2];
    const int32_t* arow[MT];
    for (int r = 0; r < MT; ++r) arow[r] = reinterpret_cast<const int32_t*>(t.q + r * t.K + b * kBlock);
    if constexpr (BITS == 4) {
      // The block's 8 maddubs results add up in int16 (per lane |sum| <= 8 * 2 * 15 * 127 = 30480 < 2^15)
      // and widen once per block.
      __m256i dot16[MT][2];
      for (int r = 0; r < MT; ++r) dot16[r][0] = dot16[r][1] = _mm256_setzero_si256();
      const uint8_t* p = t.codes + b * 4 * 64;
      prefetch_ahead<BITS>(t, p, b);
      // Low nibbles (weights 0-15 of the block), then high nibbles (16-31): two weight vectors live at a
      // time, so the 2 MT int16 sums stay in the 16 ymm registers.
#pragma GCC unroll 2
      for (int hi = 0; hi < 2; ++hi) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j * 64));
          __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j * 64 + 32));
          if (hi) w0 = _mm256_srli_epi16(w0, 4), w1 = _mm256_srli_epi16(w1, 4);
          w0 = _mm256_and_si256(w0, low4);
          w1 = _mm256_and_si256(w1, low4);
          for (int r = 0; r < MT; ++r) {
            const __m256i a = _mm256_set1_epi32(arow[r][j + 4 * hi]);
            dot16[r][0] = _mm256_add_epi16(dot16[r][0], _mm256_maddubs_epi16(w0, a));
            dot16[r][1] = _mm256_add_epi16(dot16[r][1], _mm256_maddubs_epi16(w1, a));
          }
          for (int r = 0; r < MT; ++r) __asm__("" : "+x"(dot16[r][0]), "+x"(dot16[r][1]));
        }
      }
      for (int r = 0; r < MT; ++r)
        for (int h = 0; h < 2; ++h) dot[r][h] = _mm256_madd_epi16(dot16[r][h], ones);
    } else {
      for (int r = 0; r < MT; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
      const uint8_t* p = t.codes + b * 8 * 64;
      prefetch_ahead<BITS>(t, p, b);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j * 64)), bias);
        const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j * 64 + 32)), bias);
        const __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);  // |c - 128|
        for (int r = 0; r < MT; ++r) {
          const __m256i a = _mm256_set1_epi32(arow[r][j]);
          dot[r][0] = _mm256_add_epi32(dot[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(a, w0)), ones));
          dot[r][1] = _mm256_add_epi32(dot[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(a, w1)), ones));
        }
        for (int r = 0; r < MT; ++r) __asm__("" : "+x"(dot[r][0]), "+x"(dot[r][1]));
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 s = load8(t.scale + b * kRows + h * 8);
      const __m256 o = load8(t.offset + b * kRows + h * 8);
      for (int r = 0; r < MT; ++r) {
        const int64_t ab = r * t.nb + b;
        __m256i d = dot[r][h];
        if constexpr (BITS == 8) d = _mm256_add_epi32(d, _mm256_set1_epi32(128 * t.sum[ab]));  // undo the c - 128
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(s, _mm256_set1_ps(t.d[ab])), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(o, _mm256_set1_ps(t.ds[ab]), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < MT; ++r) {
    alignas(32) float v[16];
    _mm256_store_ps(v, acc[r][0]);
    _mm256_store_ps(v + 8, acc[r][1]);
    for (int c = 0; c < t.ncols; ++c) t.out[r * t.ldo + c] = v[c];
  }
}

#else
constexpr int kMaxTileRows = 1;

template <int BITS, int MT, typename S>
void run_tile(const Tile<S>& t) {
  const int64_t vectors = BITS == 4 ? 4 : 8;
  for (int r = 0; r < MT; ++r) {
    for (int c = 0; c < t.ncols; ++c) {
      float acc = 0.f;
      for (int64_t b = 0; b < t.nb; ++b) {
        const int8_t* a = t.q + r * t.K + b * kBlock;
        int32_t dot = 0;
        for (int64_t j = 0; j < 8; ++j) {
          const uint8_t* p = t.codes + (b * vectors + (BITS == 4 ? j % 4 : j)) * 64 + c * 4;
          for (int i = 0; i < 4; ++i) {
            int32_t code = BITS == 4 ? (j < 4 ? p[i] & 0x0F : p[i] >> 4) : p[i];
            dot += code * a[j * 4 + i];
          }
        }
        const int64_t ab = r * t.nb + b;
        acc += static_cast<float>(t.scale[b * kRows + c]) * t.d[ab] * static_cast<float>(dot) +
               static_cast<float>(t.offset[b * kRows + c]) * t.ds[ab];
      }
      t.out[r * t.ldo + c] = acc;
    }
  }
}
#endif

// By reference and inlined: a Tile passed by value through the PLT was stored in pieces and re-read
// whole, a failed store-to-load forward at every group call (perf put ~8 % of a 1-row step there).
template <int BITS, typename S>
inline __attribute__((always_inline)) void run_rows(const Tile<S>& t, int64_t rows) {
  // Tiles of kMaxTileRows activation rows share each unpacked weight vector.
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxTileRows) {
    Tile<S> u = t;
    u.q += r0 * t.K;
    u.d += r0 * t.nb;
    u.ds += r0 * t.nb;
    u.sum += r0 * t.nb;
    u.out += r0 * t.ldo;
    switch (std::min<int64_t>(kMaxTileRows, rows - r0)) {
      case 1: run_tile<BITS, 1, S>(u); break;
#if defined(__AVX2__)
      case 2: run_tile<BITS, 2, S>(u); break;
      case 3: run_tile<BITS, 3, S>(u); break;
      case 4: run_tile<BITS, 4, S>(u); break;
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
      case 5: run_tile<BITS, 5, S>(u); break;
      case 6: run_tile<BITS, 6, S>(u); break;
      case 7: run_tile<BITS, 7, S>(u); break;
      case 8: run_tile<BITS, 8, S>(u); break;
#endif
      default: TORCH_CHECK(false, "unreachable tile size");
    }
  }
}

// One projection's packed weight (kernels/cpu/packing.py) as raw pointers: scale and offset are fp16
// (half) or fp32, n output rows, K inputs.
struct Weight {
  const uint8_t* codes;
  const void* scale;
  const void* offset;
  bool half;
  int bits;
  int64_t n, K;
  int64_t groups() const { return (n + kRows - 1) / kRows; }
};

// Output groups [g0, g1) of x @ w.T for the M quantized rows a, into out [M, ldo] at column 16g.
template <typename S>
void run_group_range_as(const Weight& w, int64_t M, const QuantizedActivations& a, float* out, int64_t ldo,
                        int64_t g0, int64_t g1) {
  const int64_t nb = w.K / kBlock, vectors = w.bits == 4 ? 4 : 8;
  const S* sp = static_cast<const S*>(w.scale);
  const S* op = static_cast<const S*>(w.offset);
  for (int64_t g = g0; g < g1; ++g) {
    Tile<S> t{w.codes + g * nb * vectors * 64, sp + g * nb * kRows, op + g * nb * kRows, nb, w.K,
              a.q.data(), a.d.data(), a.ds.data(), a.sum.data(), out + g * kRows, ldo,
              static_cast<int>(std::min<int64_t>(kRows, w.n - g * kRows))};
    if (w.bits == 4) run_rows<4, S>(t, M); else run_rows<8, S>(t, M);
  }
}

inline void run_group_range(const Weight& w, int64_t M, const QuantizedActivations& a, float* out, int64_t ldo,
                            int64_t g0, int64_t g1) {
  if (w.half) run_group_range_as<c10::Half>(w, M, a, out, ldo, g0, g1);
  else run_group_range_as<float>(w, M, a, out, ldo, g0, g1);
}

// Room for M rows of K inputs.
inline void reserve(QuantizedActivations& a, int64_t M, int64_t K) {
  a.q.resize(M * K);
  a.d.resize(M * (K / kBlock));
  a.ds.resize(M * (K / kBlock));
  a.sum.resize(M * (K / kBlock));
}

// The tensors of a packed weight, checked (shapes, dtypes, contiguity) for K inputs; `who` names the op.
Weight checked_weight(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset, int64_t bits,
                      int64_t n, int64_t K, const char* who);

}  // namespace mstar_cpu::qmm
