// decoder_stack: every decoder layer of a Llama-family model whose projections are all GGUF block
// codes, then the final norm at the rows that need logits, as ONE call running in ONE OpenMP
// parallel region (how llama.cpp runs its graph):
//
//   res = h                                          the residual stream [T, H] fp32
//   per layer:  x = RMSNorm(res) -> qkv -> attention (RoPE, KV store, paged attention) -> o_proj
//               res += o;  x = RMSNorm(res) -> gate_up -> silu(gate) * up -> down;  res += down
//   out[s] = RMSNorm(res[logits_indices[s]]) with the final norm's weight          -> [S, H]
//
// The same math as the model's per-op path (models/llama.py: the reference RMSNorm and SiLU, the
// quant_matmul and attention kernels, which this file calls), for any step: decode rows and prefill
// chunks alike, so a sequence's tokens do not depend on its batch-mates (nor on the thread count).
// Threads meet at barriers between phases: each takes a contiguous range of a matmul's output
// groups (16 rows), and of attention's (sequence, KV head) items. Up to kRepeatedRowsUpTo rows,
// every thread adds, normalises and quantizes all rows for itself (microseconds) instead of
// waiting at a barrier while one thread does; beyond that each thread prepares its share of rows.
//
// Measured on a 2-core AVX2 box (the default model, 2 threads, interleaved pairs in one process,
// embedding + stack + head against the Inductor graph of the per-op model): 7.9 against 8.9 ms a
// step at one row (paired ratio 1.12, 30 pairs), 35.7 against 37.9 ms at 16 rows (1.06). It also
// removes the graph: no compile at start-up (warm start 4 s against 14 s) and 65 MB of RSS.
#include "attention.h"
#include "gil.h"
#include "quant_matmul.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <omp.h>

#include <cmath>
#include <vector>

namespace mstar_cpu {
namespace {

// Thread tid's share [first, second) of n items split into nt contiguous ranges.
inline std::pair<int64_t, int64_t> share(int64_t n, int tid, int nt) {
  const int64_t chunk = (n + nt - 1) / nt, a = std::min<int64_t>(n, tid * chunk);
  return {a, std::min<int64_t>(n, a + chunk)};
}

// out = weight * (x / sqrt(mean(x^2) + eps)), one row of H in fp32 (kernels/reference/rms_norm.py).
inline void rms_norm_row(const float* x, const float* weight, float eps, int64_t H, float* out) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < H; ++i) sum += x[i] * x[i];
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(H) + eps);
#pragma omp simd
  for (int64_t i = 0; i < H; ++i) out[i] = weight[i] * (x[i] * inv);
}

struct Layer {
  const float* input_norm;
  const float* post_norm;
  qmm::Weight qkv, o, gate_up, down;
  void* k_cache;
  void* v_cache;
};

// At most this many rows, every thread normalises and quantizes all of them for itself (a few
// microseconds of repeated work) instead of one thread doing it while the others wait at a barrier.
constexpr int64_t kRepeatedRowsUpTo = 4;

// The rows a thread prepares for the matmuls: the residual stream, the normalised rows, SiLU x up,
// and their quantized forms. Shared by the threads (each preparing its share), or one per thread.
struct Rows {
  std::vector<float> res, x, mid;
  qmm::QuantizedActivations acts_h, acts_attn, acts_f;

  void start(const float* h, int64_t T, int64_t H, int64_t HqD, int64_t F) {
    res.assign(h, h + T * H);
    x.resize(T * H);
    mid.resize(T * F);
    qmm::reserve(acts_h, T, H);
    qmm::reserve(acts_attn, T, HqD);
    qmm::reserve(acts_f, T, F);
  }
};

// A step's buffers shared by the threads (the calling thread's, reused across calls).
struct Buffers {
  Rows rows;  // when the threads split the rows
  std::vector<float> qkv, q, attn, o, gate_up, down;
  std::vector<attn::Item> items;
};

template <typename C>
void run_stack(const std::vector<Layer>& layers, const attn::Shapes& s, int64_t H, int64_t F, const float* h,
               const float* final_norm, const int64_t* positions, const int64_t* slots, const int32_t* block_tables,
               const int32_t* cu, const int32_t* context_lens, const int64_t* logits_rows, int64_t S,
               const float* cos_sin, float scale, float eps, float* out, Buffers& b, int nt) {
  const int64_t T = s.T, HqD = s.Hq * s.D, Nqkv = (s.Hq + 2 * s.Hk) * s.D;
  const bool repeated = T <= kRepeatedRowsUpTo && nt > 1;
  b.qkv.resize(T * Nqkv);
  b.q.resize(T * HqD);
  b.attn.resize(T * HqD);
  b.o.resize(T * H);
  b.gate_up.resize(T * 2 * F);
  b.down.resize(T * H);
  if (!repeated) b.rows.start(h, T, H, HqD, F);
  attn::build_items(s.B, s.Hk, cu, b.items);
  const int64_t n_items = static_cast<int64_t>(b.items.size());

#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num(), threads = omp_get_num_threads();
    thread_local attn::Scratch scratch;
    thread_local Rows own;
    if (repeated) own.start(h, T, H, HqD, F);
    // Rows this thread prepares (adds to the residual stream, normalises, quantizes).
    const auto [p0, p1] = repeated ? std::pair<int64_t, int64_t>{0, T} : share(T, tid, threads);
    Rows& rows = repeated ? own : b.rows;
    float* res = rows.res.data();
    float* x = rows.x.data();
    float* mid = rows.mid.data();
    qmm::QuantizedActivations& acts_h = rows.acts_h;
    qmm::QuantizedActivations& acts_attn = rows.acts_attn;
    qmm::QuantizedActivations& acts_f = rows.acts_f;
    thread_local std::vector<float> final_row;
    auto ready = [&] {  // the prepared rows are shared: wait until every thread has done its share
      if (!repeated) {
#pragma omp barrier
      }
    };
    // The residual stream plus a sublayer's output, normalised and quantized for the next matmul.
    auto add_norm_quantize = [&](const float* added, const float* weight) {
      for (int64_t t = p0; t < p1; ++t) {
        float* r = res + t * H;
        if (added != nullptr)
          for (int64_t i = 0; i < H; ++i) r[i] += added[t * H + i];
        rms_norm_row(r, weight, eps, H, x + t * H);
      }
      qmm::quantize_rows(x, p0, p1, H, acts_h);
      ready();
    };
    // Each thread takes one contiguous range of output groups: one long stream of codes, scales and
    // offsets that the hardware prefetcher follows. Handing out 2 groups at a time as threads ask
    // (omp dynamic) was 0.5-2.8 ms a step slower at one row: every chunk a new, short stream.
    auto matmul = [&](const qmm::Weight& w, const qmm::QuantizedActivations& a, float* dst) {
      const auto [g0, g1] = share(w.groups(), tid, threads);
      qmm::run_group_range(w, T, a, dst, w.n, g0, g1);
#pragma omp barrier
    };
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      C* kc = static_cast<C*>(L.k_cache);
      C* vc = static_cast<C*>(L.v_cache);
      add_norm_quantize(l == 0 ? nullptr : b.down.data(), L.input_norm);
      matmul(L.qkv, acts_h, b.qkv.data());
      {
        const auto [t0, t1] = share(T, tid, threads);
        attn::rotate_and_store<float, C>(s, b.qkv.data(), positions, cos_sin, kc, vc, slots, b.q.data(), scale, t0, t1);
      }
#pragma omp barrier
      {
        const auto [i0, i1] = share(n_items, tid, threads);
        for (int64_t j = i0; j < i1; ++j)
          attn::attend<float, C>(s, b.items[j], b.q.data(), kc, vc, block_tables, cu, context_lens, b.attn.data(),
                                 scratch);
        if (tid == 0)  // rows no sequence owns (none in the engine's steps) attend nothing
          std::fill(b.attn.begin() + cu[s.B] * HqD, b.attn.begin() + T * HqD, 0.f);
      }
#pragma omp barrier
      qmm::quantize_rows(b.attn.data(), p0, p1, HqD, acts_attn);
      ready();
      matmul(L.o, acts_attn, b.o.data());
      add_norm_quantize(b.o.data(), L.post_norm);
      matmul(L.gate_up, acts_h, b.gate_up.data());
      for (int64_t t = p0; t < p1; ++t) {
        const float* g = b.gate_up.data() + t * 2 * F;
        float* m = mid + t * F;
#pragma omp simd
        for (int64_t i = 0; i < F; ++i) {  // silu(gate) * up; sigmoid from exp(-|x|) <= 1, vectorised
          const float e = attn::exp_nonpositive(-std::fabs(g[i]));
          const float sigmoid = g[i] >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
          m[i] = g[i] * sigmoid * g[F + i];
        }
      }
      qmm::quantize_rows(mid, p0, p1, F, acts_f);
      ready();
      matmul(L.down, acts_f, b.down.data());
    }
    const auto [s0, s1] = share(S, tid, threads);
    for (int64_t j = s0; j < s1; ++j) {
      const int64_t t = logits_rows[j];
      final_row.resize(H);  // the final sum (a row may be listed twice: the stream itself is not changed)
      for (int64_t i = 0; i < H; ++i) final_row[i] = res[t * H + i] + b.down[t * H + i];
      rms_norm_row(final_row.data(), final_norm, eps, H, out + j * H);
    }
  }
}

const float* float_data(const at::Tensor& t, int64_t numel, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == numel, "decoder_stack: ", what,
              " must be contiguous fp32 with ", numel, " elements");
  return t.data_ptr<float>();
}

}  // namespace

at::Tensor decoder_stack(const at::Tensor& h, at::TensorList norms, at::TensorList codes, at::TensorList scales,
                         at::TensorList offsets, at::IntArrayRef bits, at::IntArrayRef rows, at::TensorList k_caches,
                         at::TensorList v_caches, const at::Tensor& positions, const at::Tensor& slot_mapping,
                         const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q,
                         const at::Tensor& context_lens, const at::Tensor& logits_indices, const at::Tensor& cos_sin,
                         int64_t num_heads, int64_t num_kv_heads, double scale, double eps) {
  const int64_t L = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(L > 0 && v_caches.size() == k_caches.size() && norms.size() == 2 * L + 1 && codes.size() == 4 * L &&
                  scales.size() == 4 * L && offsets.size() == 4 * L && bits.size() == 4 * L && rows.size() == 4 * L,
              "decoder_stack: per layer 2 norms (+ the final one), 4 projections and a K and a V cache");
  TORCH_CHECK(h.dim() == 2, "decoder_stack: h must be [T, H]");
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
              "decoder_stack: num_heads must be a multiple of num_kv_heads");
  const int64_t T = h.size(0), H = h.size(1), F = rows[2] / 2;
  const at::Tensor& k0 = k_caches[0];
  TORCH_CHECK(k0.dim() == 4 && k0.size(2) == num_kv_heads, "decoder_stack: caches must be [NB, BS, Hk, D]");
  const int64_t D = k0.size(3);
  attn::Shapes s{T, context_lens.size(0), num_heads, num_kv_heads, num_heads / num_kv_heads, D, k0.size(1),
                 block_tables.size(1), cos_sin.size(0)};
  TORCH_CHECK(positions.scalar_type() == at::kLong && slot_mapping.scalar_type() == at::kLong &&
                  logits_indices.scalar_type() == at::kLong && positions.numel() == T && slot_mapping.numel() == T &&
                  positions.is_contiguous() && slot_mapping.is_contiguous() && logits_indices.is_contiguous(),
              "decoder_stack: positions and slot_mapping must be int64 [T], logits_indices int64 [S]");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && cu_seqlens_q.scalar_type() == at::kInt &&
                  context_lens.scalar_type() == at::kInt && block_tables.is_contiguous() &&
                  cu_seqlens_q.is_contiguous() && context_lens.is_contiguous() && cu_seqlens_q.numel() == s.B + 1 &&
                  block_tables.size(0) == s.B,
              "decoder_stack: block_tables [B, W], cu_seqlens_q [B + 1] and context_lens [B] must be int32");
  const bool bf16 = k0.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || k0.scalar_type() == at::kFloat, "decoder_stack: the caches must be fp32 or bf16");
  std::vector<Layer> layers(L);
  for (int64_t l = 0; l < L; ++l) {
    const int64_t expect[4][2] = {{(num_heads + 2 * num_kv_heads) * D, H}, {H, num_heads * D}, {2 * F, H}, {H, F}};
    qmm::Weight w[4];
    for (int p = 0; p < 4; ++p) {
      const int64_t i = 4 * l + p;
      TORCH_CHECK(rows[i] == expect[p][0], "decoder_stack: layer ", l, " projection ", p, " has ", rows[i],
                  " rows, not ", expect[p][0]);
      w[p] = qmm::checked_weight(codes[i], scales[i], offsets[i], bits[i], rows[i], expect[p][1], "decoder_stack");
    }
    for (const at::Tensor* c : {&k_caches[l], &v_caches[l]})
      TORCH_CHECK(c->sizes() == k0.sizes() && c->scalar_type() == k0.scalar_type() && c->is_contiguous(),
                  "decoder_stack: every K and V cache must be contiguous and shaped like the first");
    layers[l] = Layer{float_data(norms[2 * l], H, "a norm"), float_data(norms[2 * l + 1], H, "a norm"),
                      w[0], w[1], w[2], w[3], k_caches[l].data_ptr(), v_caches[l].data_ptr()};
  }
  const float* final_norm = float_data(norms[2 * L], H, "the final norm");
  const float* cs = float_data(cos_sin, s.P * D, "cos_sin");
  const at::Tensor hc = h.contiguous();
  const float* hp = float_data(hc, T * H, "h");
  const int64_t S = logits_indices.numel();
  const int64_t* li = logits_indices.data_ptr<int64_t>();
  for (int64_t j = 0; j < S; ++j)
    TORCH_CHECK(li[j] >= 0 && li[j] < T, "decoder_stack: logits_indices[", j, "] = ", li[j], " is not a row of ", T);
  at::Tensor out = at::empty({S, H}, h.options().dtype(at::kFloat));
  if (T == 0) return out;
  thread_local Buffers buffers;
  const int nt = at::in_parallel_region() ? 1 : at::get_num_threads();
  const float sc = static_cast<float>(scale), ep = static_cast<float>(eps);
  WithoutGil released;  // everything below reads raw pointers only
  if (bf16)
    run_stack<c10::BFloat16>(layers, s, H, F, hp, final_norm, positions.data_ptr<int64_t>(),
                             slot_mapping.data_ptr<int64_t>(), block_tables.data_ptr<int32_t>(),
                             cu_seqlens_q.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(),
                             logits_indices.data_ptr<int64_t>(), S, cs, sc, ep, out.data_ptr<float>(), buffers, nt);
  else
    run_stack<float>(layers, s, H, F, hp, final_norm, positions.data_ptr<int64_t>(), slot_mapping.data_ptr<int64_t>(),
                     block_tables.data_ptr<int32_t>(), cu_seqlens_q.data_ptr<int32_t>(),
                     context_lens.data_ptr<int32_t>(), logits_indices.data_ptr<int64_t>(), S, cs, sc, ep,
                     out.data_ptr<float>(), buffers, nt);
  return out;
}

}  // namespace mstar_cpu
