"""Seeded training of the demo checkpoint: tokenizer, tiny base model, two LoRA adapters.

Reads the training-format files written by ``demo/make_benchmark.py`` and writes::

    demo/checkpoint/base/                  tokenizer + GPT-NeoX-style causal LM (safetensors)
    demo/checkpoint/adapters/baseline/     LoRA adapter trained on baseline/train.jsonl
    demo/checkpoint/adapters/oracle/       LoRA adapter trained on oracle/train.jsonl

then measures, teacher-forced, final-answer (m1) and turn (m2) accuracy on the validation
files, and confirms a few scenarios with real greedy ``model.generate``.

Usage::

    python demo/train.py --seed 0                  # everything (a few minutes on 2 cores)
    python demo/train.py --stage eval              # only re-measure the saved checkpoint
    python demo/train.py --base smollm2 --help     # the real-base recipe (demo/train_real.py)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

import torch  # noqa: E402

SPECIALS = ["<|pad|>", "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>", "<|eot|>"]
PAD, UNK, SYSTEM, USER, ASSISTANT, EOT = SPECIALS
# Every message is "<|role|> content <|eot|>"; the generation prompt is "<|assistant|>", so a
# prompt's text (and, with a whitespace word-level tokenizer, its ids) is a prefix of the
# full conversation's.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|eot|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
LORA_TARGETS = ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]


def log(msg: str) -> None:
    """Progress line with a wall-clock stamp."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a JSONL file."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# --------------------------------------------------------------------------- tokenizer
def build_tokenizer(records: Sequence[dict[str, Any]], out: Path) -> Any:
    """A fast word-level tokenizer over the words of ``records``, with the chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_benchmark as gen

    # Every word the generator can emit, so --turns/--n benchmarks never hit <|unk|>.
    words: set[str] = set(gen.VOCABULARY)
    for r in records:
        for m in r["messages"]:
            words.update(m["content"].split())
        for s in r["memory_chain"]:
            words.update(s.split())
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(words))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNK,
        pad_token=PAD,
        eos_token=EOT,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tok.chat_template = CHAT_TEMPLATE
    save_tokenizer(tok, out)
    return tok


def save_tokenizer(tok: Any, out: Path) -> None:
    """Save ``tok`` under the generic fast-tokenizer class name."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    # The generic class name keeps the directory loadable by transformers 4.x as well.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def encode(tok: Any, messages: Sequence[dict[str, str]], gen_prompt: bool = False) -> list[int]:
    """Ids of ``messages`` rendered with the chat template (no extra special tokens)."""
    text = tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=gen_prompt)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def check_tokenizer(tok: Any, records: Sequence[dict[str, Any]]) -> None:
    """Assert the prefix, stop-token and decode round-trip properties on ``records``."""
    eot = tok.convert_tokens_to_ids(EOT)
    for r in records:
        msgs = r["messages"]
        full = encode(tok, msgs)
        assert tok.unk_token_id not in full, r["id"]
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            prompt = encode(tok, msgs[:k], gen_prompt=True)
            assert full[: len(prompt)] == prompt, (r["id"], k)
            content = tok(m["content"], add_special_tokens=False)["input_ids"]
            n = len(prompt)
            assert full[n : n + len(content) + 1] == [*content, eot], (r["id"], k)
            assert tok.decode(content, skip_special_tokens=True) == m["content"], (r["id"], k)


# --------------------------------------------------------------------------- data
def with_queries(record: dict[str, Any], task: Any, rng: random.Random, p: float) -> dict[str, Any]:
    """A baseline record with extra mid-chain ``where is X ?`` questions (base pretraining).

    Before each turn, with probability ``p``, a question about a random object not in hand is
    inserted, answered with its location after the canonical chain so far. The messages of the
    record itself (rendered by the builder) are kept unchanged; only whole question/answer
    pairs are added, re-using the benchmark's own query wording.
    """
    from pytest_memeval.core.builders import scene_memory

    msgs = record["messages"]
    chain = record["memory_chain"]
    objects = dict(task.objects)
    out = [msgs[0]]
    for i in range(len(chain) + 1):
        if rng.random() < p:
            where, _ = scene_memory.final_state(objects, {}, chain[:i])
            placed = [o for o in objects if where[o] != "held"]
            obj = rng.choice(placed)
            out.append({"role": "user", "content": f"where is {obj} ?"})
            out.append({"role": "assistant", "content": where[obj]})
        out.extend(msgs[1 + 2 * i : 3 + 2 * i])
    assert len(out) >= len(msgs)
    return {**record, "messages": out}


def to_example(tok: Any, record: dict[str, Any]) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)``: loss only on assistant content and its end-of-turn token."""
    ids = encode(tok, record["messages"])
    asst = tok.convert_tokens_to_ids(ASSISTANT)
    eot = tok.convert_tokens_to_ids(EOT)
    labels = [-100] * len(ids)
    inside = False
    for i, t in enumerate(ids):
        if inside:
            labels[i] = t
            if t == eot:
                inside = False
        elif t == asst:
            inside = True
    return ids, labels


def batches(
    examples: Sequence[tuple[list[int], list[int]]], batch_size: int, rng: random.Random, pad: int
) -> Any:
    """Endless length-bucketed padded batches."""
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        chunk = batch_size * 16
        groups = []
        for c in range(0, len(order), chunk):
            part = sorted(order[c : c + chunk], key=lambda i: len(examples[i][0]))
            groups += [part[b : b + batch_size] for b in range(0, len(part), batch_size)]
        rng.shuffle(groups)
        for g in groups:
            n = max(len(examples[i][0]) for i in g)
            ids = torch.full((len(g), n), pad, dtype=torch.long)
            lab = torch.full((len(g), n), -100, dtype=torch.long)
            att = torch.zeros((len(g), n), dtype=torch.long)
            for row, i in enumerate(g):
                x, y = examples[i]
                ids[row, : len(x)] = torch.tensor(x)
                lab[row, : len(y)] = torch.tensor(y)
                att[row, : len(x)] = 1
            yield ids, lab, att


def train_loop(
    model: Any,
    examples: Sequence[tuple[list[int], list[int]]],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    pad: int,
    name: str,
) -> float:
    """AdamW with warmup + cosine decay; returns wall seconds."""
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
    )
    model.train()
    t0 = time.time()
    run = 0.0
    it = batches(examples, batch_size, rng, pad)
    for step in range(1, steps + 1):
        ids, lab, att = next(it)
        out = model(input_ids=ids, attention_mask=att, labels=lab)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        run = 0.9 * run + 0.1 * out.loss.item() if step > 1 else out.loss.item()
        if step % 50 == 0 or step == steps:
            el = time.time() - t0
            log(f"{name} step {step}/{steps} loss {run:.4f} ({step / el:.2f} steps/s)")
    model.eval()
    return time.time() - t0


# --------------------------------------------------------------------------- eval
@torch.no_grad()
def evaluate(model: Any, tok: Any, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Teacher-forced greedy exactness per assistant message.

    Greedy decoding reproduces the truth iff the argmax at every answer position equals the
    truth token and then the end-of-turn token. m2 scores aligned scenarios' turns against
    ``memory_chain[i]``; where the turn content differs from it, the chain text is fed instead.
    """
    model.eval()
    eot = tok.convert_tokens_to_ids(EOT)
    m1 = turns_ok = turns_n = own_ok = own_n = unaligned = 0
    per_record = []
    for r in records:
        msgs = r["messages"]
        asst = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
        chain = r["memory_chain"]
        aligned = len(asst) - 1 == len(chain)
        unaligned += not aligned
        ids = encode(tok, msgs)
        logits = model(input_ids=torch.tensor([ids])).logits[0]
        pred = logits.argmax(-1).tolist()
        oks = []
        for k in asst:
            n = len(encode(tok, msgs[:k], gen_prompt=True))
            target = tok(msgs[k]["content"], add_special_tokens=False)["input_ids"] + [eot]
            oks.append(pred[n - 1 : n - 1 + len(target)] == target)
        m1 += oks[-1]
        own_ok += sum(oks[:-1])
        own_n += len(oks) - 1
        if aligned:
            for i, k in enumerate(asst[:-1]):
                turns_n += 1
                if msgs[k]["content"].strip().lower() == chain[i].strip().lower():
                    turns_ok += oks[i]
                else:
                    prompt = encode(tok, msgs[:k], gen_prompt=True)
                    target = tok(chain[i], add_special_tokens=False)["input_ids"] + [eot]
                    x = torch.tensor([prompt + target])
                    p = model(input_ids=x).logits[0].argmax(-1).tolist()
                    turns_ok += p[len(prompt) - 1 : len(prompt) - 1 + len(target)] == target
        per_record.append(oks)
    n = len(records)
    return {
        "n": n,
        "m1": m1 / n,
        "m1_count": m1,
        "m2": turns_ok / max(1, turns_n),
        "m2_count": f"{turns_ok}/{turns_n}",
        "turn_acc_own": own_ok / max(1, own_n),
        "turn_own_count": f"{own_ok}/{own_n}",
        "unaligned": unaligned,
        "per_record": per_record,
    }


@torch.no_grad()
def confirm_generate(
    model: Any, tok: Any, records: Sequence[dict[str, Any]], per_record: list[list[bool]], k: int
) -> str:
    """Real greedy ``generate`` on the messages of the first ``k`` records agrees with eval."""
    agree = total = 0
    for r, oks in zip(records[:k], per_record[:k], strict=True):
        msgs = r["messages"]
        asst = [j for j, m in enumerate(msgs) if m["role"] == "assistant"]
        for j, ok in zip(asst, oks, strict=True):
            prompt = encode(tok, msgs[:j], gen_prompt=True)
            out = model.generate(
                input_ids=torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=16,
                do_sample=False,
            )
            text = tok.decode(out[0, len(prompt) :], skip_special_tokens=True).strip()
            agree += (text == msgs[j]["content"]) == ok
            total += 1
    return f"{agree}/{total}"


# --------------------------------------------------------------------------- main
def make_base(tok: Any, args: argparse.Namespace) -> Any:
    """A fresh tiny GPT-NeoX-style causal LM."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=len(tok),
        hidden_size=args.width,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.width * 4,
        max_position_embeddings=2048,
        rope_parameters={
            "rope_theta": 10000.0,
            "partial_rotary_factor": args.rotary,
            "rope_type": "default",
        },
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids(EOT),
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
        use_cache=True,
    )
    return GPTNeoXForCausalLM(cfg)


def save_base(model: Any, tok: Any, out: Path) -> None:
    """Write the base model with a greedy generation config."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=16,
        eos_token_id=tok.convert_tokens_to_ids(EOT),
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    model.save_pretrained(str(out))
    save_tokenizer(tok, out)


def save_adapter(model: Any, out: Path) -> None:
    """Write a LoRA adapter (safetensors + config only)."""
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(str(out))
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = "demo/checkpoint/base"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    readme = out / "README.md"
    if readme.exists():
        readme.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; ``--base smollm2`` runs the real-base recipe of ``train_real.py``."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--base", choices=["tiny", "smollm2"], default="tiny")
    if pre.parse_known_args(argv)[0].base == "smollm2":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import train_real

        return train_real.main(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--base", choices=["tiny", "smollm2"], default="tiny",
        help="tiny: the bundled demo (this file); smollm2: LoRA on SmolLM2 (train_real.py)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=ROOT / "demo" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "demo" / "checkpoint")
    ap.add_argument("--stage", choices=["all", "base", "adapter", "eval"], default="all")
    ap.add_argument(
        "--variant", choices=["baseline", "oracle"], default=None, help="adapter/eval stage only"
    )
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--rotary", type=float, default=0.5, help="partial rotary factor")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--base-steps", type=int, default=800)
    ap.add_argument("--base-lr", type=float, default=3e-3)
    ap.add_argument("--query-rate", type=float, default=0.3, help="base pretraining only")
    ap.add_argument("--adapter-steps", type=int, default=800)
    ap.add_argument("--adapter-lr", type=float, default=3e-3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--confirm", type=int, default=4, help="scenarios checked with generate")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data: dict[str, list[dict[str, Any]]] = {}
    for variant in ("baseline", "oracle"):
        for split in ("train", "val"):
            data[f"{variant}/{split}"] = read_jsonl(args.data / variant / f"{split}.jsonl")
    base_dir = args.out / "base"
    adapter_dir = args.out / "adapters"
    timings: dict[str, float] = {}

    variants = [args.variant] if args.variant else ["baseline", "oracle"]
    if args.stage in ("all", "base"):
        random.seed(args.seed)
        torch.manual_seed(args.seed)
        if base_dir.exists():
            shutil.rmtree(base_dir)
        everything = [r for rs in data.values() for r in rs]
        tok = build_tokenizer(everything, base_dir)
        check_tokenizer(tok, data["baseline/val"] + data["oracle/val"])
        log(f"tokenizer: {len(tok)} tokens; prefix/stop/decode properties hold on val")
        sys.path.insert(0, str(ROOT))
        from pytest_memeval.core.builders import scene_memory

        tasks = scene_memory.load_tasks(args.data / "tasks_train.jsonl")
        qrng = random.Random(args.seed)
        ex = [
            to_example(tok, with_queries(r, t, qrng, args.query_rate))
            for r, t in zip(data["baseline/train"], tasks, strict=True)
            for _ in range(2)
        ]
        lens = [len(x) for x, _ in ex]
        log(f"train examples: mean {sum(lens) / len(lens):.0f} tokens, max {max(lens)}")
        model = make_base(tok, args)
        log(f"base: {sum(p.numel() for p in model.parameters())} parameters")
        timings["base"] = train_loop(
            model, ex, steps=args.base_steps, lr=args.base_lr,
            batch_size=args.batch, seed=args.seed, pad=tok.pad_token_id, name="base",
        )  # fmt: skip
        save_base(model, tok, base_dir)
    if args.stage in ("all", "adapter"):
        tok = AutoTokenizer.from_pretrained(str(base_dir))
        for variant in variants:
            random.seed(args.seed + 1)
            torch.manual_seed(args.seed + 1)
            ex = [to_example(tok, r) for r in data[f"{variant}/train"]]
            base = AutoModelForCausalLM.from_pretrained(str(base_dir), use_safetensors=True)
            lcfg = LoraConfig(
                r=args.rank, lora_alpha=args.rank, lora_dropout=0.0,
                target_modules=LORA_TARGETS, task_type="CAUSAL_LM",
            )  # fmt: skip
            peft_model = get_peft_model(base, lcfg)
            timings[variant] = train_loop(
                peft_model, ex, steps=args.adapter_steps, lr=args.adapter_lr,
                batch_size=args.batch, seed=args.seed + 2, pad=tok.pad_token_id, name=variant,
            )  # fmt: skip
            save_adapter(peft_model, adapter_dir / variant)
    if timings:
        log("timings (s): " + json.dumps({k: round(v, 1) for k, v in timings.items()}))
    if args.stage not in ("all", "eval"):
        return 0

    tok = AutoTokenizer.from_pretrained(str(base_dir))
    results: dict[str, Any] = {}
    base = AutoModelForCausalLM.from_pretrained(
        str(base_dir), use_safetensors=True, trust_remote_code=False
    )
    base.eval()
    for variant in variants if args.variant is None or args.variant == "oracle" else []:
        res = evaluate(base, tok, data[f"{variant}/val"])
        res.pop("per_record")
        results[f"base-only on {variant}/val"] = res
        log(f"base-only on {variant}/val: {json.dumps(res)}")
    for variant in variants:
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), use_safetensors=True)
        model = PeftModel.from_pretrained(base, str(adapter_dir / variant))
        model.eval()
        res = evaluate(model, tok, data[f"{variant}/val"])
        res["generate_agrees"] = confirm_generate(
            model, tok, data[f"{variant}/val"], res.pop("per_record"), args.confirm
        )
        res["train"] = evaluate(model, tok, data[f"{variant}/train"][:60])
        res["train"].pop("per_record")
        results[f"{variant} adapter on {variant}/val"] = res
        log(f"{variant} adapter on {variant}/val: {json.dumps(res)}")
    if timings:
        results["train_seconds"] = {k: round(v, 1) for k, v in timings.items()}
    suffix = f"-{args.variant}" if args.variant else ""
    (args.out / f"metrics{suffix}.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
