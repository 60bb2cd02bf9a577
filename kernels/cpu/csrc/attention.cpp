// attention: one layer's RoPE + KV-cache write + paged causal attention as one op. The kernels and
// what they compute are in attention.h.
#include "attention.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

namespace mstar_cpu {
namespace {
using namespace attn;

template <typename X, typename C>
void run(const Shapes& s, const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos_sin,
         at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
         const at::Tensor& cu_seqlens_q, const at::Tensor& context_lens, float scale, at::Tensor& out) {
  thread_local std::vector<float> q;  // [T, Hq, D] rotated, scaled queries (the calling thread's)
  thread_local std::vector<Item> items;
  q.resize(s.T * s.Hq * s.D);
  const X* x = qkv.data_ptr<X>();
  C* kc = k_cache.data_ptr<C>();
  C* vc = v_cache.data_ptr<C>();
  float* qp = q.data();
  at::parallel_for(0, s.T, 4, [&](int64_t t0, int64_t t1) {
    rotate_and_store<X, C>(s, x, positions.data_ptr<int64_t>(), cos_sin.data_ptr<float>(), kc, vc,
                           slot_mapping.data_ptr<int64_t>(), qp, scale, t0, t1);
  });
  const int32_t* cu = cu_seqlens_q.data_ptr<int32_t>();
  build_items(s.B, s.Hk, cu, items);
  X* op = out.data_ptr<X>();
  for (int64_t t = cu[s.B]; t < s.T; ++t)  // rows no sequence owns (none in the engine's steps)
    for (int64_t i = 0; i < s.Hq * s.D; ++i) op[t * s.Hq * s.D + i] = from_float<X>(0.f);
  const Item* ip = items.data();  // not `items` in the lambda: a thread_local there is the worker's own (empty) one
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t a, int64_t b) {
    thread_local Scratch scratch;
    for (int64_t j = a; j < b; ++j)
      attend<X, C>(s, ip[j], qp, kc, vc, block_tables.data_ptr<int32_t>(), cu, context_lens.data_ptr<int32_t>(),
                   op, scratch);
  });
}

}  // namespace

at::Tensor attention(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos_sin, at::Tensor k_cache,
                     at::Tensor v_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                     const at::Tensor& cu_seqlens_q, const at::Tensor& context_lens, int64_t num_heads,
                     int64_t num_kv_heads, double scale, int64_t window) {
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
              "attention: num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous(), "attention: qkv must be a contiguous [T, (Hq + 2 Hk) D] tensor");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.sizes() == v_cache.sizes() && k_cache.scalar_type() == v_cache.scalar_type(),
              "attention: k_cache and v_cache must be contiguous [NB, BS, Hk, D] of one dtype");
  const int64_t D = k_cache.size(3);
  Shapes s{qkv.size(0), context_lens.size(0), num_heads, num_kv_heads, num_heads / num_kv_heads, D,
           k_cache.size(1), block_tables.size(1), cos_sin.size(0), window};
  TORCH_CHECK(window >= 0, "attention: window must be >= 0 (0 = every key)");
  TORCH_CHECK(k_cache.size(2) == num_kv_heads && qkv.size(1) == (num_heads + 2 * num_kv_heads) * D,
              "attention: qkv width ", qkv.size(1), " does not match heads ", num_heads, "+2x", num_kv_heads, " of dim ", D);
  TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.is_contiguous() && cos_sin.size(1) == D,
              "attention: cos_sin must be contiguous fp32 [max_pos, D]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slot_mapping.scalar_type() == at::kLong &&
                  positions.numel() == s.T && slot_mapping.numel() == s.T,
              "attention: positions and slot_mapping must be int64 [T]");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && cu_seqlens_q.scalar_type() == at::kInt &&
                  context_lens.scalar_type() == at::kInt && block_tables.is_contiguous() &&
                  cu_seqlens_q.numel() == s.B + 1 && block_tables.size(0) == s.B,
              "attention: block_tables [B, W], cu_seqlens_q [B + 1] and context_lens [B] must be int32");
  at::Tensor out = at::empty({s.T, num_heads * D}, qkv.options());  // every element is written once
  const float sc = static_cast<float>(scale);
  const bool x_bf16 = qkv.scalar_type() == at::kBFloat16, c_bf16 = k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK((x_bf16 || qkv.scalar_type() == at::kFloat) && (c_bf16 || k_cache.scalar_type() == at::kFloat),
              "attention: qkv and the caches must be fp32 or bf16");
  if (x_bf16 && c_bf16)
    run<c10::BFloat16, c10::BFloat16>(s, qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, cu_seqlens_q, context_lens, sc, out);
  else if (x_bf16)
    run<c10::BFloat16, float>(s, qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, cu_seqlens_q, context_lens, sc, out);
  else if (c_bf16)
    run<float, c10::BFloat16>(s, qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, cu_seqlens_q, context_lens, sc, out);
  else
    run<float, float>(s, qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, cu_seqlens_q, context_lens, sc, out);
  return out;
}

}  // namespace mstar_cpu
