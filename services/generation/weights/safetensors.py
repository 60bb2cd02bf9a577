"""Load a Hugging Face directory of any family in models/families.py: config.json + model.safetensors
(or a sharded index)."""

from __future__ import annotations

import json
import os

import torch

from services.common.pixel_normalization import PixelNormalization
from services.generation.models import families
from services.generation.models.config import CheckpointError, DecoderConfig, check_state_dict
from services.generation.models.vision import VisionConfig, vision_weight_names
from services.generation.weights.checkpoint import Checkpoint, VisionWeights
from services.generation.weights.vocabulary import vocabulary_from_tokenizer_json

_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope(raw: dict, path: str) -> tuple[float, tuple[tuple[str, float], ...] | None]:
    """(theta, llama3 scaling or None) from transformers 5's rope_parameters or the older
    rope_theta + rope_scaling; any other RoPE type is refused naming it."""
    params = {**(raw.get("rope_parameters") or {}), **(raw.get("rope_scaling") or {})}  # either, or both
    theta = float(params.get("rope_theta") or raw.get("rope_theta") or 10000.0)
    kind = params.get("type") or params.get("rope_type") or "default"  # "type": configs before transformers 4.45
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise CheckpointError(f"{path}: rope type {kind!r} is not supported (default and llama3 are)")
    try:
        return theta, tuple(sorted((k, int(params[k]) if k.startswith("original") else float(params[k]))
                                   for k in _LLAMA3_KEYS))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: llama3 rope scaling needs {', '.join(_LLAMA3_KEYS)} ({e})") from e


def _layer_ropes(raw: dict, path: str) -> tuple[float, tuple | None, float | None]:
    """(global theta, llama3 scaling, windowed layers' theta or None). Gemma 3 gives each layer kind
    its own RoPE: transformers 5 writes rope_parameters per layer type, older configs rope_theta
    (global) and rope_local_base_freq."""
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        theta, llama3 = _rope({"rope_parameters": params.get("full_attention") or {}}, path)
        local, local_scaling = _rope({"rope_parameters": params.get("sliding_attention") or {}}, path)
        if local_scaling is not None:
            raise CheckpointError(f"{path}: rope_parameters.sliding_attention must be the default RoPE")
        return theta, llama3, local
    theta, llama3 = _rope(raw, path)
    local = raw.get("rope_local_base_freq")
    return theta, llama3, float(local) if local is not None else None


def _windows(raw: dict) -> tuple[int | None, tuple[str, ...]]:
    """(sliding_window, layer_types): Mistral windows every layer; Qwen only with use_sliding_window,
    from layer max_window_layers on (transformers' rule); Gemma 3 every layer but each
    sliding_window_pattern-th; a config's own layer_types wins."""
    window = raw.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None, ()
    n = int(raw["num_hidden_layers"])
    if raw.get("model_type") == "gemma3_text" and not isinstance(raw.get("layer_types"), list):
        pattern = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6)
        return window, tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n))
    if raw.get("model_type") in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        return None, ()  # Qwen configs carry a window that only use_sliding_window switches on
    types = raw.get("layer_types")
    if isinstance(types, list):
        return window, tuple(str(t) for t in types)
    if raw.get("model_type") in ("qwen2", "qwen3"):
        first = int(raw.get("max_window_layers", 0))
        return window, tuple("sliding_attention" if i >= first else "full_attention" for i in range(n))
    return window, ()


def _family(raw: dict, path: str) -> families.Family:
    """The family config.json declares (architectures, else model_type); refused naming it otherwise."""
    archs = raw.get("architectures") or []
    model_type = raw.get("model_type")
    found = {families.by_hf_architecture(a) for a in archs} if archs else {families.by_model_type(model_type)}
    if None in found or len(found) != 1:
        declared = f"architectures {archs}" if archs else f"model_type {model_type!r}"
        raise CheckpointError(f"{path}: {declared} is not supported; mstar serves {families.served('hf')}")
    (fam,) = found
    if model_type is not None and model_type != fam.model_type:
        raise CheckpointError(f"{path}: model_type {model_type!r} does not match architectures {archs}")
    return fam


_VLM_ARCHITECTURES = ("Idefics3ForConditionalGeneration",)
_TEXT_PREFIX = "model.text_model."  # Idefics3's decoder weights; served as a text model's model.*


def _read_raw_config(directory: str) -> tuple[dict, str]:
    path = os.path.join(directory, "config.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read config ({e})") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return raw, path


def _is_vlm(raw: dict) -> bool:
    return raw.get("model_type") == "idefics3" or any(a in _VLM_ARCHITECTURES for a in raw.get("architectures") or [])


def _text_config(raw: dict, path: str) -> dict:
    """An Idefics3 config's decoder part, as a text model's config.json would say it (the outer
    config's tie_word_embeddings and token ids apply to the decoder)."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError(f"{path}: an Idefics3 config needs a text_config object")
    text = dict(text)
    text.pop("architectures", None)
    for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id"):
        if key in raw and key not in text:
            text[key] = raw[key]
    text.setdefault("model_type", "llama")
    return text


def _decoder_config(raw: dict, path: str) -> DecoderConfig:
    fam = _family(raw, path)
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
    for name, ok in [
        ("attention_bias", not raw.get("attention_bias", False) or fam.qkv_bias),
        ("mlp_bias", not raw.get("mlp_bias", False)),
        ("hidden_act", _ACTIVATIONS.get(activation) == fam.activation),
        ("final_logit_softcapping", raw.get("final_logit_softcapping") is None),  # Gemma 2's, not served
        ("attn_logit_softcapping", raw.get("attn_logit_softcapping") is None),
        ("use_bidirectional_attention", not raw.get("use_bidirectional_attention")),  # EmbeddingGemma
    ]:
        if not ok:
            raise CheckpointError(f"{path}: field {name}={raw.get(name)!r} is not supported")
    try:
        heads = int(raw["num_attention_heads"])
        eos = raw.get("eos_token_id")
        theta, llama3, local_theta = _layer_ropes(raw, path)
        window, layer_types = _windows(raw)
        config = DecoderConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
            family=fam.name,
            rope_llama3=llama3,
            sliding_window=window,
            layer_types=layer_types,
            rope_local_theta=local_theta,
            query_pre_attn_scalar=raw.get("query_pre_attn_scalar"),
        )
    except KeyError as e:
        raise CheckpointError(f"{path}: missing field {e.args[0]}") from e
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}") from e
    config.validate(path)
    return config


def _pixel_normalization(directory: str) -> PixelNormalization:
    """The image processor's rescale + normalize, from preprocessor_config.json (or
    processor_config.json's image_processor); SmolVLM's values when neither has them."""
    values: dict = {}
    for name in ("processor_config.json", "preprocessor_config.json"):  # the latter wins
        path = os.path.join(directory, name)
        if os.path.exists(path):
            try:
                with open(path) as f:
                    raw = json.load(f)
                values |= (raw.get("image_processor") or {}) if name.startswith("processor") else raw
            except (OSError, json.JSONDecodeError, AttributeError) as e:
                raise CheckpointError(f"{path}: cannot read ({e})") from e
    try:
        return PixelNormalization.from_config(values)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{directory}: image processor config: {e}") from e


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

    raw, path = _read_raw_config(directory)
    vlm = _is_vlm(raw)
    config = _decoder_config(_text_config(raw, path) if vlm else raw, path)
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
    vision = None
    if vlm:
        vision_config = VisionConfig.from_hf(raw, path)
        vision = VisionWeights(vision_config, {n: state_dict.pop(n) for n in vision_weight_names(vision_config)
                                               if n in state_dict}, int(raw.get("image_token_id", -1)),
                               _pixel_normalization(directory))
        if not 0 <= vision.image_token_id < config.vocab_size:
            raise CheckpointError(f"{path}: image_token_id {raw.get('image_token_id')!r} is not a token id")
        state_dict = {"model." + n[len(_TEXT_PREFIX):] if n.startswith(_TEXT_PREFIX) else n: t
                      for n, t in state_dict.items()}
    if config.tie_word_embeddings:
        state_dict.pop("lm_head.weight", None)
    offset = config.parts.norm_offset
    if offset:  # Gemma: stored w, applied as 1 + w (families.py); served as the multiplier
        state_dict = {n: t + offset if n.endswith("norm.weight") else t for n, t in state_dict.items()}
    check_state_dict(config, state_dict, directory)
    name = os.path.basename(os.path.normpath(directory))
    return Checkpoint(name=name, source=directory, config=config, tensors=state_dict,
                      vocabulary=vocabulary_from_tokenizer_json(directory), vision=vision)
