// Registers the CPU serving ops as torch.ops.mstar_cpu.* (schemas here, implementations in the
// other files of this folder). Python side: kernels/cpu/library.py builds and loads this library,
// kernels/cpu/__init__.py gives the ops shapes for torch.compile (fake tensors).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <string>

namespace mstar_cpu {
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset,
                        int64_t bits, int64_t n);
at::Tensor attention(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos_sin, at::Tensor k_cache,
                     at::Tensor v_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                     const at::Tensor& cu_seqlens_q, const at::Tensor& context_lens, int64_t num_heads,
                     int64_t num_kv_heads, double scale, int64_t window);
at::Tensor decoder_stack(const at::Tensor& h, at::TensorList norms, at::TensorList codes, at::TensorList scales,
                         at::TensorList offsets, at::IntArrayRef bits, at::IntArrayRef rows, at::TensorList k_caches,
                         at::TensorList v_caches, const at::Tensor& positions, const at::Tensor& slot_mapping,
                         const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q,
                         const at::Tensor& context_lens, const at::Tensor& logits_indices, const at::Tensor& cos_sin,
                         int64_t num_heads, int64_t num_kv_heads, double scale, double eps);
at::Tensor dequantize_rows(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset, int64_t bits,
                           int64_t n, int64_t k, const at::Tensor& ids);
at::Tensor argmax_rows(const at::Tensor& logits);
at::Tensor greedy_rows(const at::Tensor& logits);
at::Tensor gumbel_argmax(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& seeds,
                         const at::Tensor& offsets);

// The instruction sets this build was compiled for, among those the kernels' #if paths test
// (quant_matmul.h, attention.h, sampling.cpp), named as /proc/cpuinfo names them: a test checks
// that a build forced with MSTAR_KERNEL_ISA (library.py) runs the paths it was asked for.
std::string instruction_sets() {
  std::string names;
#if defined(__AVX2__)
  names += " avx2";
#endif
#if defined(__FMA__)
  names += " fma";
#endif
#if defined(__AVX512F__)
  names += " avx512f";
#endif
#if defined(__AVX512BW__)
  names += " avx512bw";
#endif
#if defined(__AVX512VNNI__)
  names += " avx512_vnni";
#endif
  return names.empty() ? names : names.substr(1);
}
}  // namespace mstar_cpu

TORCH_LIBRARY(mstar_cpu, m) {
  m.def("quant_matmul(Tensor x, Tensor codes, Tensor scale, Tensor offset, int bits, int n) -> Tensor");
  m.def(
      "attention(Tensor qkv, Tensor positions, Tensor cos_sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slot_mapping, Tensor block_tables, Tensor cu_seqlens_q, Tensor context_lens, int num_heads, "
      "int num_kv_heads, float scale, int window=0) -> Tensor");
  m.def(
      "decoder_stack(Tensor h, Tensor[] norms, Tensor[] codes, Tensor[] scales, Tensor[] offsets, int[] bits, "
      "int[] rows, Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, Tensor positions, Tensor slot_mapping, "
      "Tensor block_tables, Tensor cu_seqlens_q, Tensor context_lens, Tensor logits_indices, Tensor cos_sin, "
      "int num_heads, int num_kv_heads, float scale, float eps) -> Tensor");
  m.def("dequantize_rows(Tensor codes, Tensor scale, Tensor offset, int bits, int n, int k, Tensor ids) -> Tensor");
  m.def("argmax_rows(Tensor logits) -> Tensor");
  m.def("greedy_rows(Tensor logits) -> Tensor");
  m.def("gumbel_argmax(Tensor logits, Tensor temperature, Tensor seeds, Tensor offsets) -> Tensor");
  m.def("instruction_sets() -> str", &mstar_cpu::instruction_sets);  // no tensor to dispatch on: every key
}

TORCH_LIBRARY_IMPL(mstar_cpu, CPU, m) {
  m.impl("quant_matmul", &mstar_cpu::quant_matmul);
  m.impl("attention", &mstar_cpu::attention);
  m.impl("decoder_stack", &mstar_cpu::decoder_stack);
  m.impl("dequantize_rows", &mstar_cpu::dequantize_rows);
  m.impl("argmax_rows", &mstar_cpu::argmax_rows);
  m.impl("greedy_rows", &mstar_cpu::greedy_rows);
  m.impl("gumbel_argmax", &mstar_cpu::gumbel_argmax);
}

