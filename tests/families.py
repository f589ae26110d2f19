"""Tiny checkpoints shaped like the model families users bring (built, never downloaded).

Each family gets what a user's checkpoint of that family has, at toy size: the transformers
architecture (random init with a fixed seed, then a few dozen training steps on the demo
conversations so the model ends its turns with the family's end-of-turn token), a byte-level
BPE tokenizer trained with ``tokenizers`` on the demo data with the family's special tokens,
the family's BOS/EOS conventions (BOS added on encode where the family's tokenizer adds it; a
``generation_config.eos_token_id`` list that differs from the tokenizer's eos where the family
has one) and a chat template modelled on the family's published one:

=========  ====================  =========================================================
family     architecture          what it exercises
=========  ====================  =========================================================
llama3     LlamaForCausalLM      template writes BOS, tokenizer adds BOS on encode too;
                                 stops on ``<|eot_id|>``, not the tokenizer's eos
qwen2.5    Qwen2ForCausalLM      ChatML, default system prompt; stops on ``<|im_end|>``
                                 while the tokenizer's eos is ``<|endoftext|>``
mistral    MistralForCausalLM    v1 template: strict user/assistant alternation, no system
                                 role; sliding-window attention (window < conversation)
gemma      Gemma2ForCausalLM     rejects a system role; hybrid sliding/global cache;
                                 stops on ``<end_of_turn>``
phi        Phi3ForCausalLM       fused ``qkv_proj``; stops on ``<|end|>``; the template
                                 appends eos after a finished conversation
gpt2       GPT2LMHeadModel       fused Conv1D ``c_attn`` (LoRA ``fan_in_fan_out``); one
                                 ``<|endoftext|>`` for bos, eos and unk; a user-written template
=========  ====================  =========================================================

The checkpoints are committed under ``tests/family_checkpoints/`` (about 200 KB each, so the
test suite does not spend a minute of CPU rebuilding them); this module rebuilds them, with
the same seed, in about 7 CPU seconds per family::

    python -m tests.families                    # all, into tests/family_checkpoints
    python -m tests.families --out DIR llama3   # some, elsewhere
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "demo"
CHECKPOINTS = Path(__file__).resolve().parent / "family_checkpoints"

# --------------------------------------------------------------------------- chat templates
# Modelled on each family's published template (the tool-calling parts left out).

#: Meta-Llama-3-8B-Instruct: BOS written by the template, once, before the first message.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

#: Qwen2.5-Instruct (ChatML), with its default system prompt when there is none.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    '{%- if (message.role == "user") or (message.role == "system" and not loop.first)'
    ' or (message.role == "assistant") %}'
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

#: Qwen3-*-Thinking-2507: earlier assistant turns lose their ``<think>`` block in history,
#: the last one keeps it, and the generation prompt opens a ``<think>`` block. So the prompt
#: of an earlier turn (ending in ``<think>\n``) is not a prefix of the conversation (where
#: that turn is rendered without it): the prefix property breaks for multi-turn scenarios.
QWEN_THINKING_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}"
    "{%- set ns = namespace(last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if message.role == 'user' and ns.last_query_index == messages|length - 1 %}"
    "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning_content = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\n')"
    ".split('<think>')[-1].lstrip('\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{{- '<|im_start|>assistant\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n'"
    " + content.lstrip('\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n<think>\n' }}{%- endif %}"
)

#: Mistral-7B-Instruct-v0.1: strict user/assistant alternation, no system role.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)

#: gemma-2-2b-it: no system role, strict alternation, assistant is "model".
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

#: Phi-3-mini-4k-instruct: a finished conversation ends with the tokenizer's eos.
PHI3_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

#: GPT-2 has no chat template; this is the plain one a user writes for a fine-tune.
GPT2_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + '\n' + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """One family's shape: architecture, special tokens, template, BOS/EOS conventions."""

    name: str
    model_type: str
    template: str
    specials: tuple[str, ...]
    bos: str | None
    eos: str  # the tokenizer's eos_token
    pad: str
    #: generation_config.eos_token_id, as tokens (a list where the family ships one)
    stop: tuple[str, ...]
    bos_on_encode: bool = False  # the tokenizer's post-processor adds BOS (add_special_tokens)
    system: bool = True  # the template accepts a system message
    config: dict[str, Any] = field(default_factory=dict)
    unk: str | None = None
    #: LoRA target modules (and modules_to_save) of the family's adapter in the tests
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    modules_to_save: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "llama3",
            "llama",
            LLAMA3_TEMPLATE,
            (
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            ),
            bos="<|begin_of_text|>",
            eos="<|end_of_text|>",
            pad="<|end_of_text|>",
            stop=("<|end_of_text|>", "<|eot_id|>"),
            bos_on_encode=True,
            modules_to_save=("embed_tokens",),
        ),
        Family(
            "qwen2.5",
            "qwen2",
            QWEN25_TEMPLATE,
            ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            bos=None,
            eos="<|endoftext|>",
            pad="<|endoftext|>",
            stop=("<|im_end|>", "<|endoftext|>"),
            modules_to_save=("lm_head",),
        ),
        Family(
            "mistral",
            "mistral",
            MISTRAL_TEMPLATE,
            ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
            bos="<s>",
            eos="</s>",
            pad="</s>",
            stop=("</s>",),
            bos_on_encode=True,
            system=False,
            config={"sliding_window": 48},
            unk="<unk>",
        ),
        Family(
            "gemma",
            "gemma2",
            GEMMA_TEMPLATE,
            ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
            bos="<bos>",
            eos="<eos>",
            pad="<pad>",
            stop=("<eos>", "<end_of_turn>"),
            bos_on_encode=True,
            system=False,
            config={"sliding_window": 48, "head_dim": 8, "query_pre_attn_scalar": 8},
            unk="<unk>",
        ),
        Family(
            "phi",
            "phi3",
            PHI3_TEMPLATE,
            ("<unk>", "<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
            bos="<s>",
            eos="<|endoftext|>",
            pad="<|endoftext|>",
            stop=("<|endoftext|>", "<|assistant|>", "<|end|>"),
            unk="<unk>",
            lora_targets=("qkv_proj",),
        ),
        Family(
            "gpt2",
            "gpt2",
            GPT2_TEMPLATE,
            ("<|endoftext|>",),
            bos="<|endoftext|>",
            eos="<|endoftext|>",
            pad="<|endoftext|>",
            stop=("<|endoftext|>",),
            unk="<|endoftext|>",
            lora_targets=("c_attn",),
        ),
    ]
}

VOCAB_SIZE = 512
LORA_B_SCALE = 0.1
MODULES_TO_SAVE_NOISE = 0.05
TRAIN_RECORDS = 96
TRAIN_STEPS = 150
#: Training windows are cut to this many tokens: the format (answer, end-of-turn token) is
#: learnt as well from the first turns of a conversation, at a fraction of the cost.
TRAIN_TOKENS = 160
SEED = 0


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def without_system(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its system message folded into the first user message (what users of
    templates without a system role do)."""
    msgs = record["messages"]
    if not msgs or msgs[0]["role"] != "system":
        return record
    first = {"role": "user", "content": msgs[0]["content"] + "\n\n" + msgs[1]["content"]}
    return {**record, "messages": [first, *msgs[2:]]}


def family_records(family: Family, variant: str, split: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` demo records of a split, shaped for the family's template."""
    records = read_jsonl(DEMO / "data" / variant / f"{split}.jsonl")[:n]
    return records if family.system else [without_system(r) for r in records]


def _texts() -> list[str]:
    out = []
    for split in ("train", "val"):
        for r in read_jsonl(DEMO / "data" / "baseline" / f"{split}.jsonl"):
            out.extend(m["content"] for m in r["messages"])
    return out


def build_tokenizer(family: Family, out: Path, texts: Sequence[str]) -> Any:
    """A byte-level BPE tokenizer trained on ``texts`` with the family's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(family.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    if family.bos_on_encode:
        assert family.bos is not None
        bos_id = backend.token_to_id(family.bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A",
            pair=f"{family.bos} $A {family.bos} $B",
            special_tokens=[(family.bos, bos_id)],
        )
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    named = {family.bos, family.eos, family.pad, family.unk}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=family.pad,
        unk_token=family.unk,
        additional_special_tokens=[s for s in family.specials if s not in named],
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    tok.chat_template = family.template
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text("utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n", "utf-8")
    return tok


def _config(family: Family, tok: Any) -> Any:
    from transformers import AutoConfig

    ids = {
        "bos_token_id": tok.convert_tokens_to_ids(family.bos) if family.bos else None,
        "eos_token_id": tok.convert_tokens_to_ids(family.eos),
        "pad_token_id": tok.convert_tokens_to_ids(family.pad),
    }
    if family.model_type == "gpt2":
        kwargs: dict[str, Any] = {
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 2048,
            "n_inner": 64,
        }
    else:
        kwargs = {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 2048,
            "tie_word_embeddings": False,
        }
    return AutoConfig.for_model(
        family.model_type, vocab_size=len(tok), **ids, **kwargs, **family.config
    )


def _train(model: Any, tok: Any, records: Sequence[dict[str, Any]]) -> None:
    """A few dozen AdamW steps on whole conversations (teacher forcing), so that the model
    has learnt the format: answers of a few tokens, then the end-of-turn token."""
    import torch

    examples = []
    for r in records:
        text = tok.apply_chat_template(r["messages"], tokenize=False)
        examples.append(tok(text, add_special_tokens=False)["input_ids"][:TRAIN_TOKENS])
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    pad = tok.pad_token_id
    for _ in range(TRAIN_STEPS):
        pick = torch.randint(len(examples), (8,), generator=gen).tolist()
        width = max(len(examples[i]) for i in pick)
        ids = torch.full((len(pick), width), pad, dtype=torch.long)
        labels = torch.full((len(pick), width), -100, dtype=torch.long)
        mask = torch.zeros((len(pick), width), dtype=torch.long)
        for row, i in enumerate(pick):
            ex = torch.tensor(examples[i], dtype=torch.long)
            ids[row, : len(ex)] = ex
            labels[row, : len(ex)] = ex
            mask[row, : len(ex)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


def build_family(name: str, root: Path) -> Path:
    """Build the family's checkpoint directory under ``root``; returns its path."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    family = FAMILIES[name]
    out = root / name
    tok = build_tokenizer(family, out, _texts())
    torch.manual_seed(SEED)
    config = _config(family, tok)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    _train(model, tok, family_records(family, "baseline", "train", TRAIN_RECORDS))
    stop = [tok.convert_tokens_to_ids(s) for s in family.stop]
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=stop if len(stop) > 1 else stop[0],
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(str(out))
    return out


def build_adapter(
    model_dir: Path,
    out: Path,
    targets: Sequence[str],
    modules_to_save: Sequence[str] = (),
    *,
    fan_in_fan_out: bool = False,
    scale: float = LORA_B_SCALE,
) -> Path:
    """A LoRA adapter for ``model_dir`` with random (non-zero) weights, and, for
    ``modules_to_save``, full copies of those modules that differ from the base. ``scale``
    multiplies peft's random ``lora_B``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED + 1)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=list(targets),
        modules_to_save=list(modules_to_save) or None,
        init_lora_weights=False,  # random B: the adapter changes predictions
        fan_in_fan_out=fan_in_fan_out,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for pname, param in peft_model.named_parameters():
            # Large enough to change some predictions, small enough to keep the format (the
            # model still ends its turns).
            if "lora_B" in pname:
                param.mul_(scale)
            elif "modules_to_save" in pname:
                param.add_(torch.randn_like(param) * MODULES_TO_SAVE_NOISE)
    peft_model.save_pretrained(str(out))
    return out


def copy_family(src: Path, dst: Path, *, template: str | None = None) -> Path:
    """A copy of a family directory, optionally with another chat template."""
    shutil.copytree(src, dst)
    if template is not None:
        (dst / "chat_template.jinja").write_text(template, "utf-8")
    return dst


def edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text("utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data, indent=2) + "\n", "utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    """Rebuild family checkpoints (default: all of them, into :data:`CHECKPOINTS`)."""
    import argparse

    import torch

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, default=CHECKPOINTS)
    parser.add_argument("names", nargs="*", help=f"families (default: all of {list(FAMILIES)})")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(FAMILIES)
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}")
    torch.set_num_threads(1)
    for name in args.names or FAMILIES:
        target = args.out / name
        if target.exists():
            shutil.rmtree(target)
        print(build_family(name, args.out), flush=True)


if __name__ == "__main__":
    main()
