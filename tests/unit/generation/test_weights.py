import json
import os

import pytest
import torch

from services.generation.models.config import CheckpointError
from services.generation.weights.gguf import hf_name, unpermute_qk
from services.generation.weights.locate import default_model_path, load_checkpoint
from services.generation.weights.random_init import random_checkpoint, save_hf_dir
from services.generation.weights.safetensors import load_hf_dir


def test_gguf_names_map_to_hf():
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("rope_freqs.weight") is None


def test_unpermute_inverts_llama_cpp_permutation():
    heads, head_dim, cols = 3, 8, 5
    w = torch.randn(heads * head_dim, cols)
    # llama.cpp's convert script: reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2)
    permuted = w.view(heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(heads * head_dim, cols)
    assert torch.equal(unpermute_qk(permuted, heads), w)


def test_hf_dir_round_trip(tmp_path, tiny_checkpoint):
    loaded = load_checkpoint(save_hf_dir(tiny_checkpoint, str(tmp_path / "m")))
    assert loaded.config == tiny_checkpoint.config
    assert all(torch.equal(loaded.state_dict[k], v) for k, v in tiny_checkpoint.state_dict.items())


def test_sharded_index(tmp_path, tiny_checkpoint):
    from safetensors.torch import save_file

    d = tmp_path / "sharded"
    save_hf_dir(tiny_checkpoint, str(d))
    os.remove(d / "model.safetensors")
    names = sorted(tiny_checkpoint.state_dict)
    half = len(names) // 2
    weight_map = {}
    for shard, chunk in (("a.safetensors", names[:half]), ("b.safetensors", names[half:])):
        save_file({n: tiny_checkpoint.state_dict[n] for n in chunk}, str(d / shard))
        weight_map |= {n: shard for n in chunk}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert set(load_hf_dir(str(d)).state_dict) == set(names)


def test_missing_and_misshaped_tensors_are_named(tmp_path, tiny_checkpoint):
    from safetensors.torch import save_file

    d = save_hf_dir(tiny_checkpoint, str(tmp_path / "bad"))
    sd = dict(tiny_checkpoint.state_dict)
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, os.path.join(d, "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight"):
        load_hf_dir(d)
    sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(sd, os.path.join(d, "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"up_proj.weight has shape \[3, 3\]"):
        load_hf_dir(d)


def test_unsupported_architecture_is_named(tmp_path, tiny_checkpoint):
    d = save_hf_dir(random_checkpoint(), str(tmp_path / "arch"))
    raw = json.loads(open(os.path.join(d, "config.json")).read())
    for change, field in (({"model_type": "gpt2"}, "model_type"), ({"rope_scaling": {"type": "yarn"}}, "rope type 'yarn'")):
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(raw | change, f)
        with pytest.raises(CheckpointError, match=field):
            load_hf_dir(d)


def test_bad_model_argument():
    with pytest.raises(CheckpointError):
        load_checkpoint("/nonexistent/model.bin")


def test_default_gguf_is_found_and_loads_the_documented_architecture():
    assert default_model_path().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    from services.common.gguf_file import GGUFFile
    from services.generation.weights.gguf import _read_config

    config, family = _read_config(GGUFFile(default_model_path()), "default")
    assert config.family == family.name == "llama"
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (30, 576, 9, 3)
    assert config.tie_word_embeddings and config.eos_token_ids == (2,) and config.rope_theta == 100000.0
