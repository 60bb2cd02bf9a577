"""Load a Hugging Face Llama directory: config.json + model.safetensors (or a sharded index)."""

from __future__ import annotations

import json
import os

import torch

from services.generation.models.config import CheckpointError, LlamaConfig, check_state_dict
from services.generation.weights.checkpoint import Checkpoint
from services.generation.weights.vocabulary import vocabulary_from_tokenizer_json

_ARCHITECTURES = {"LlamaForCausalLM"}


def _read_config(directory: str) -> LlamaConfig:
    path = os.path.join(directory, "config.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read config ({e})") from e
    model_type = raw.get("model_type")
    archs = set(raw.get("architectures") or ["LlamaForCausalLM"])
    if model_type != "llama" or not archs <= _ARCHITECTURES:
        raise CheckpointError(f"{path}: model_type {model_type!r} / architectures {sorted(archs)} unsupported; need llama")
    for name, ok in [
        ("rope_scaling", raw.get("rope_scaling") is None),
        ("attention_bias", not raw.get("attention_bias", False)),
        ("mlp_bias", not raw.get("mlp_bias", False)),
        ("hidden_act", raw.get("hidden_act", "silu") == "silu"),
    ]:
        if not ok:
            raise CheckpointError(f"{path}: field {name}={raw.get(name)!r} is not supported")
    try:
        heads = int(raw["num_attention_heads"])
        eos = raw.get("eos_token_id")
        config = LlamaConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
        )
    except KeyError as e:
        raise CheckpointError(f"{path}: missing field {e.args[0]}") from e
    config.validate(path)
    return config


def _shard_files(directory: str) -> list[str]:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        return sorted({os.path.join(directory, shard) for shard in weight_map.values()})
    single = os.path.join(directory, "model.safetensors")
    if os.path.exists(single):
        return [single]
    raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def load_hf_dir(directory: str) -> Checkpoint:
    from safetensors.torch import load_file

    config = _read_config(directory)
    state_dict: dict[str, torch.Tensor] = {}
    for shard in _shard_files(directory):
        try:
            tensors = load_file(shard)
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"{shard}: cannot read safetensors ({e})") from e
        for name, tensor in tensors.items():
            if not tensor.is_floating_point():
                raise CheckpointError(f"{shard}: tensor {name} has non-float dtype {tensor.dtype}")
            state_dict[name] = tensor.float()
    if config.tie_word_embeddings:
        state_dict.pop("lm_head.weight", None)
    check_state_dict(config, state_dict, directory)
    name = os.path.basename(os.path.normpath(directory))
    return Checkpoint(name=name, source=directory, config=config, tensors=state_dict,
                      vocabulary=vocabulary_from_tokenizer_json(directory))
