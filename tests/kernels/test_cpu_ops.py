"""kernels/cpu's C++ ops against their plain-torch oracles (kernels/reference).

quant_matmul must equal quant_matmul_ref up to fp32 summation order (both quantize the activations
the same way), and stay within the activation-quantization error of the dense matmul with the
dequantized weight. attention (RoPE + KV-cache write + paged attention in one call) must leave the
same cache and give the same output as apply_rotary_ref + store_kv_ref + paged_attention_ref.
"""

from __future__ import annotations

import pytest
import torch

from kernels import cpu
from kernels.cpu import library
from kernels.dispatch import KernelOps
from kernels.reference import build_cos_sin_cache, greedy_ref, quant_matmul_ref

pytestmark = pytest.mark.skipif(cpu.load_error() is not None, reason=f"kernels/cpu unavailable: {cpu.load_error()}")


def test_the_loaded_build_has_the_instruction_sets_asked_for():
    # test_cpu_isa.py reruns this file against each build ($MSTAR_KERNEL_ISA): this says it got it.
    reported = {"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"}  # what ops.cpp's instruction_sets() names
    isa = library.chosen_isa()
    features = library.ISAS[isa]
    expected = set(library.detect_cpu_flags().split() if features is None else features) & reported
    assert library.loaded_isa() == isa and set(cpu.instruction_sets()) == expected


def _weight(n: int, k: int, bits: int, half_scales: bool):
    codes = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8)
    scale = torch.rand(n, k // 32) * 0.02
    offset = -torch.rand(n, k // 32) * 0.05 * (2**bits) / 16
    if half_scales:  # as GGUF stores Q4_0/1, Q5_0/1, Q8_0: the packer keeps them fp16
        scale, offset = scale.half().float(), offset.half().float()
    return codes, scale, offset


# (N, K, M): N not a multiple of 16 (a padded last group), M across the kernel's 8-row tiles, K = one block.
SHAPES = [(1, 32, 1), (17, 32, 9), (50, 96, 3), (960, 576, 1), (576, 1536, 16), (33, 64, 70)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("half_scales", [True, False], ids=["fp16-scales", "fp32-scales"])
@pytest.mark.parametrize(("n", "k", "m"), SHAPES)
def test_quant_matmul_is_its_reference(bits, half_scales, n, k, m):
    codes, scale, offset = _weight(n, k, bits, half_scales)
    packed = cpu.pack(codes, scale, offset, bits)
    assert packed.scale.dtype == (torch.float16 if half_scales else torch.float32)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(m, k).to(dtype)
        got, want = cpu.quant_matmul(x, packed), quant_matmul_ref(x, codes, scale, offset)
        assert got.dtype == torch.float32 and got.shape == (m, n)
        # Same integer dot products; only the fp32 accumulation order over blocks differs.
        torch.testing.assert_close(got, want, atol=2e-6 * want.abs().max().item(), rtol=1e-5)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 4, 5])
def test_extreme_codes_and_activations_do_not_overflow_the_integer_sums(bits, m):
    """The largest codes against activations at +-127 in every lane: the AVX2 paths add products in
    int16 before widening (4-bit: a whole block), so this is the case that would wrap."""
    n, k = 32, 64
    codes = torch.full((n, k), 2**bits - 1, dtype=torch.uint8)
    codes[1::2] = 0  # and the smallest, in every other row
    scale, offset = torch.full((n, k // 32), 0.5), torch.zeros(n, k // 32)
    x = torch.ones(m, k)
    x[1::2] = -1.0
    got = cpu.quant_matmul(x, cpu.pack(codes, scale, offset, bits))
    torch.testing.assert_close(got, quant_matmul_ref(x, codes, scale, offset), atol=0, rtol=1e-6)


@pytest.mark.parametrize("bits", [4, 8])
def test_quant_matmul_stays_within_activation_quantization_of_the_dense_matmul(bits):
    codes, scale, offset = _weight(96, 256, bits, True)
    dense = (codes.view(96, 8, 32).float() * scale[..., None] + offset[..., None]).view(96, 256)
    x = torch.randn(5, 256)
    got, want = cpu.quant_matmul(x, cpu.pack(codes, scale, offset, bits)), x @ dense.T
    # int8 activations: each block's error is <= half a step (amax / 254) per element
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("half_scales", [True, False])
def test_unpacked_rows_are_the_dequantized_rows(bits, half_scales):
    codes, scale, offset = _weight(37, 96, bits, half_scales)
    dense = (codes.view(37, 3, 32).float() * scale[..., None] + offset[..., None]).view(37, 96)
    ids = torch.tensor([0, 36, 15, 16, 15])
    packed = cpu.pack(codes, scale, offset, bits)
    assert torch.equal(cpu.unpack_rows(packed, ids), dense[ids])
    assert torch.equal(cpu.dequantize_rows(packed, ids), dense[ids])  # the C++ lookup the engine uses
    with pytest.raises(RuntimeError, match="id 37 is not a row of 37"):
        cpu.dequantize_rows(packed, torch.tensor([37]))


def test_bad_shapes_are_refused_with_the_reason():
    codes, scale, offset = _weight(16, 64, 4, True)
    with pytest.raises(ValueError, match="K % 32"):
        cpu.pack(codes[:, :40], scale, offset, 4)
    packed = cpu.pack(codes, scale, offset, 4)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        cpu.quant_matmul(torch.randn(2, 48), packed)


def _attention_case(specs, n_heads, n_kv_heads, head_dim, block_size, qkv_dtype, cache_dtype, pad_rows=0):
    """specs: (context_len, q_len) per sequence; the last q_len positions are this step's tokens.
    pad_rows: padding sequences as a decode graph adds them (slot -1, context 0)."""
    blocks_per_seq = [-(-c // block_size) for c, _ in specs]
    n_blocks = sum(blocks_per_seq) + 2
    perm = torch.randperm(n_blocks).to(torch.int32)
    width = max(blocks_per_seq) + 1
    tables = torch.zeros(len(specs) + pad_rows, width, dtype=torch.int32)
    positions, slots, used = [], [], 0
    for i, ((ctx, q_len), nb) in enumerate(zip(specs, blocks_per_seq, strict=True)):
        tables[i, :nb] = perm[used : used + nb]
        used += nb
        for p in range(ctx - q_len, ctx):
            positions.append(p)
            slots.append(int(tables[i, p // block_size]) * block_size + p % block_size)
    positions += [0] * pad_rows
    slots += [-1] * pad_rows
    q_lens = [q for _, q in specs] + [1] * pad_rows
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    ctx = torch.tensor([c for c, _ in specs] + [0] * pad_rows, dtype=torch.int32)
    t = int(cu[-1])
    qkv = torch.randn(t, (n_heads + 2 * n_kv_heads) * head_dim).to(qkv_dtype)
    cache = [torch.randn(n_blocks, block_size, n_kv_heads, head_dim).to(cache_dtype) for _ in range(2)]
    meta = (torch.tensor(positions), torch.tensor(slots), tables, cu, ctx)
    return qkv, meta, cache


CASES = [  # (specs, Hq, Hk, D, BS)
    pytest.param([(37, 1), (20, 20), (50, 5), (1, 1)], 9, 3, 64, 16, id="decode+prompt+chunk-gqa3"),
    pytest.param([(5, 1), (9, 1), (33, 1)], 4, 1, 16, 4, id="decode-only-mqa"),
    pytest.param([(70, 70)], 2, 2, 32, 16, id="one-long-prompt-mha"),
    pytest.param([(3, 2), (17, 1)], 6, 2, 8, 4, id="tiny-head-dim"),
    # decode rows take a register path for D in {32, 64, 128} and G <= 8; the rest the generic loops
    pytest.param([(12, 1), (40, 1), (3, 3)], 4, 2, 128, 16, id="decode-d128"),
    pytest.param([(12, 1), (33, 1)], 4, 4, 32, 8, id="decode-d32-mha"),
    pytest.param([(12, 1), (40, 1)], 16, 1, 64, 16, id="decode-group16-generic"),
]


@pytest.mark.parametrize(("specs", "n_heads", "n_kv_heads", "head_dim", "block_size"), CASES)
@pytest.mark.parametrize(("qkv_dtype", "cache_dtype"), [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                        (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("window", [0, 1, 7, 16], ids=lambda w: f"window{w}")
def test_fused_attention_is_rotary_store_and_paged_attention(specs, n_heads, n_kv_heads, head_dim, block_size,
                                                             qkv_dtype, cache_dtype, window):
    """window: a sliding window (1 = only the row's own key; 7 and 16 against pages of 4, 8 and 16:
    windows starting mid-page) against the reference's masked attention."""
    qkv, meta, (k_cache, v_cache) = _attention_case(specs, n_heads, n_kv_heads, head_dim, block_size, qkv_dtype,
                                                    cache_dtype, pad_rows=2)
    cos_sin = build_cos_sin_cache(head_dim, 256, 10000.0)
    args = (n_heads, n_kv_heads, head_dim**-0.5, window)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    want = KernelOps.create("cpu", backend="reference").attention(qkv.clone(), *meta, cos_sin, k_ref, v_ref, *args)
    got = KernelOps.create("cpu", backend="cpu").attention(qkv, *meta, cos_sin, k_cache, v_cache, *args)
    assert got.dtype == qkv_dtype and got.shape == want.shape
    # fp32: the C++ RoPE may fuse a multiply-add (1 ulp) and sums in another order. bf16 results are
    # rounded once from fp32 here, after every op in the reference: a couple of bf16 ulps.
    tol = {"atol": 1e-5, "rtol": 1e-5} if qkv_dtype == cache_dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    torch.testing.assert_close(k_cache.float(), k_ref.float(), **tol)
    torch.testing.assert_close(v_cache, v_ref, atol=0, rtol=0)
    torch.testing.assert_close(got.float(), want.float(), **tol)
    assert not got[-2:].any()  # padding rows (context 0) attend nothing


@pytest.mark.parametrize("vocab", [1, 7, 16, 49152 + 3])
def test_argmax_rows_is_torch_argmax_ties_included(vocab):
    logits = torch.randn(5, vocab)
    logits[1] = 0.5  # an all-tie row: the first index
    logits[2, vocab // 2 :] = float("-inf")  # filtered tokens
    logits[3, -1] = logits[3].max() + 1  # the max in the tail past the last full vector
    if vocab > 3:
        logits[4, 2] = logits[4, 3] = logits[4].max() + 1  # a tie between two maxima
    assert cpu.argmax_rows(logits).tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize("vocab", [1, 7, 16, 33, 49152 + 3])
def test_greedy_rows_is_the_reference_and_flags_rows_that_are_not_finite(vocab):
    logits = torch.randn(7, vocab)
    logits[1] = 0.5  # an all-tie row: the first index
    logits[2, vocab // 2] = float("nan")
    logits[3, -1] = float("inf")  # in the tail past the last full vector
    logits[4, 0] = float("-inf")
    logits[5, -1] = logits[5].max() + 1
    got = cpu.greedy_rows(logits).tolist()
    assert got == greedy_ref(logits).tolist()
    assert got[2] == got[3] == got[4] == -1 and got[1] == 0 and got[5] == vocab - 1
    assert got[6] == int(logits[6].argmax())


def test_greedy_draw_respects_a_grammar_mask():
    # Structured output (grammar/bitmask.py) sets every disallowed token to -inf before the draw;
    # the greedy argmax must pick among the allowed ones even when a masked token had the max.
    vocab = 49152
    logits = torch.randn(3, vocab)
    logits[:, 7] = 100.0  # what the model wants, disallowed below
    allowed = [[40_000, 123, 49_151], [5], [vocab - 1]]
    for row, ids in enumerate(allowed):
        keep = logits[row, ids].clone()
        logits[row] = float("-inf")
        logits[row, ids] = keep
    ops = KernelOps.create("cpu", backend="cpu")
    zeros = torch.zeros(3)
    ints = torch.zeros(3, dtype=torch.int64)
    tokens = ops.sample(logits, zeros, ints, torch.ones(3), zeros, ints, ints).tolist()
    assert tokens == logits.argmax(-1).tolist() and all(t in ids for t, ids in zip(tokens, allowed, strict=True))


def test_greedy_rows_draw_with_the_vectorised_argmax_and_sampled_rows_with_the_reference():
    from kernels.reference import sample_ref

    logits = torch.randn(4, 300)
    params = {"top_k": torch.zeros(4, dtype=torch.int64), "top_p": torch.ones(4), "min_p": torch.zeros(4),
              "seeds": torch.arange(4), "offsets": torch.zeros(4, dtype=torch.int64)}
    ops = KernelOps.create("cpu", backend="cpu")
    for temperature in (torch.zeros(4), torch.tensor([0.0, 0.7, 0.0, 1.3])):
        assert ops.sample(logits, temperature, **params).tolist() == sample_ref(logits, temperature, **params).tolist()


@pytest.mark.parametrize("vocab", [1, 7, 300, 49152 + 3])
@pytest.mark.parametrize("spread", [0.01, 1.0, 30.0], ids=["flat", "normal", "peaked"])  # how many tokens can win
def test_the_sampled_draw_is_the_references(vocab, spread):
    """gumbel_argmax hashes only the tokens that can win, and draws what draw_ref draws: over seeds
    (negative ones too), offsets and temperatures (0 included), with filtered (-inf) tokens, an
    all-filtered row, and rows longer than one work item."""
    from kernels.reference.sampling import draw_ref

    rows = 48
    g = torch.Generator().manual_seed(vocab)
    logits = spread * torch.randn(rows, vocab, generator=g)
    logits[1, : vocab // 2] = float("-inf")  # a filter removed half
    logits[2] = float("-inf")  # all removed: the argmax's index 0, like the reference
    if vocab > 1:
        logits[3, 1:] = float("-inf")  # only one left
    temperature = torch.rand(rows, generator=g) * 2
    temperature[::7] = 0.0  # greedy rows among the sampled
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=g)
    offsets = torch.randint(0, 4096, (rows,), generator=g)
    got = cpu.gumbel_argmax(logits, temperature, seeds, offsets)
    assert got.tolist() == draw_ref(logits, temperature, seeds, offsets).tolist()
