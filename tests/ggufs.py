"""A small GGUF file written here, so GGUF loading is tested without any download.

:func:`write_tiny_gguf` turns the committed tiny Llama checkpoint
(``tests/family_checkpoints/llama3``: 2 layers, 4 heads / 2 KV heads, byte-level BPE, the
Llama-3 chat template) into a GGUF file as llama.cpp's ``convert_hf_to_gguf.py`` does: the
llama key names, the q/k rows permuted into llama.cpp's rotary layout, the vocabulary and
merges as tokenizer metadata, the 2-D weights quantized to Q8_0 (the norms stay F32). It
returns the weights a faithful reader must give back: the quantized ones dequantized by the
``gguf`` package itself, in the checkpoint's own (Hugging Face) layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .families import CHECKPOINTS

TINY_LLAMA = CHECKPOINTS / "llama3"

#: HF tensor name (per layer: ``{i}``) -> llama.cpp tensor name
_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}


def _permute(weights: Any, n_head: int) -> Any:
    """llama.cpp's rotary layout of q/k rows (convert_hf_to_gguf.py, ``LlamaModel.permute``)."""
    rows = weights.shape[0]
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _gguf_name(hf_name: str) -> tuple[str, str]:
    """The llama.cpp name of an HF tensor, and which projection it is (for the permute)."""
    parts = hf_name.split(".")
    if hf_name.startswith("model.layers."):
        i = parts[2]
        pattern = hf_name.replace(f".{i}.", ".{i}.", 1)
        return _NAMES[pattern].format(i=i), parts[-2]
    return _NAMES[hf_name], ""


def write_tiny_gguf(out: Path, *, model_dir: Path = TINY_LLAMA) -> dict[str, Any]:
    """Write ``out`` (a GGUF file of ``model_dir``); return HF name -> the float32 numpy
    weights a reader must give back (``lm_head`` included: the checkpoint's is untied)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text("utf-8"))
    tok = json.loads((model_dir / "tokenizer.json").read_text("utf-8"))
    template = (model_dir / "chat_template.jinja").read_text("utf-8")
    tensors = load_file(str(model_dir / "model.safetensors"))
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("tiny-llama-for-tests")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

    # Tokenizer: the byte-level vocabulary in id order, special tokens marked CONTROL.
    vocab = dict(tok["model"]["vocab"])
    for added in tok["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<|begin_of_text|>"])
    # The turn ends on <|eot_id|>: a GGUF file names one eos, and generate stops on it.
    writer.add_eos_token_id(vocab["<|eot_id|>"])
    writer.add_pad_token_id(vocab["<|end_of_text|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(template)

    expected: dict[str, Any] = {}
    for hf_name, weights in tensors.items():
        name, projection = _gguf_name(hf_name)
        data = weights.astype(np.float32)
        if projection == "q_proj":
            data = _permute(data, n_head)
        elif projection == "k_proj":
            data = _permute(data, n_kv)
        if data.ndim == 2:
            quantized = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            # Q8_0 quantizes blocks along a row: dequantizing commutes with the row permute.
            expected[hf_name] = gguf.quants.dequantize(
                gguf.quants.quantize(weights.astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
                gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            writer.add_tensor(name, data)
            expected[hf_name] = data
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected
