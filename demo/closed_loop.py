"""A checkpoint acting in TextWorld Express, outside pytest: episodes, their numbers, the time.

The closed loop's library layer end to end (docs/closed-loop.md): a profile-like ``env`` table,
the model as the policy (``decode/policy.ModelPolicy``: the reference call over the whole
conversation), ``run_episode`` per seed, ``core/episodes.episode_metrics`` over them::

    python demo/closed_loop.py --model demo/real/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --seeds 0-9 --max-steps 20 --max-new-tokens 16 --threads 1

``--adapter DIR`` adds a LoRA adapter; ``--out FILE`` writes the episodes and numbers as JSON.
``--compare`` runs the seeds twice in one process, the reference policy one episode at a time
and then ``decode/fast.FastPolicy`` with the episodes stepped together, and prints both times,
the ratio and whether every trajectory is identical (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pytest_memeval.core.cache import resolve_cache_dir
from pytest_memeval.core.episodes import episode_metrics
from pytest_memeval.decode.policy import ModelPolicy
from pytest_memeval.env import EnvSpec, EpisodeRunner, make_env, parse_env_spec, run_episode
from pytest_memeval.model.gguf import convert_gguf, is_gguf
from pytest_memeval.model.loading import LoadedModel, load_model
from pytest_memeval.tools.bench_episodes import compare_policies

TWC = "numLocations=1,numItemsToPutAway=2,includeDoors=0,limitInventorySize=0"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="model directory or .gguf")
    parser.add_argument("--adapter", type=Path, default=None)
    parser.add_argument("--game", default="twc")
    parser.add_argument("--params", default=TWC)
    parser.add_argument("--fold", default="test")
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--system", default=None, help="system text (default: the task)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--compare", action="store_true", help="reference vs fast, timed")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    spec = parse_env_spec(
        {
            "backend": "textworld_express",
            "game": args.game,
            "params": args.params,
            "fold": args.fold,
            "seeds": args.seeds,
            "max_steps": args.max_steps,
        }
    )
    started = time.perf_counter()
    model_dir = args.model
    if is_gguf(model_dir):
        model_dir = convert_gguf(model_dir, resolve_cache_dir(None), print).directory
    loaded = load_model(model_dir, args.adapter)
    policy = ModelPolicy(loaded, args.max_new_tokens)
    loaded_at = time.perf_counter()
    if args.compare:
        raise SystemExit(_compare(spec, loaded, policy, args))
    env = make_env(spec)
    try:
        episodes = []
        for seed in spec.seeds:
            episode = run_episode(
                env,
                seed,
                policy,
                spec.max_steps,
                system=args.system,
                step_timeout_s=spec.step_timeout_s,
            )
            print(episode.summary(), flush=True)
            episodes.append(episode)
    finally:
        env.close()
    done = time.perf_counter()
    metrics = episode_metrics(episodes)
    print(json.dumps(metrics, indent=1))
    print(
        f"load {loaded_at - started:.1f} s; {len(episodes)} episodes, "
        f"{metrics['steps']['total']} actions in {done - loaded_at:.1f} s"
    )
    if args.out is not None:
        plain = {
            "env": spec.as_plain(),
            "metrics": metrics,
            "episodes": [e.as_plain() for e in episodes],
        }
        args.out.write_text(json.dumps(plain, indent=1) + "\n", encoding="utf-8")


def _compare(
    spec: EnvSpec, loaded: LoadedModel, reference_policy: ModelPolicy, args: argparse.Namespace
) -> int:
    """The reference policy one episode at a time, then the fast policy with every episode
    stepped together, in the same environments: both times, the ratio, identical or not
    (``memeval bench`` on a closed-loop profile does the same, with the floor)."""
    with EpisodeRunner(spec, system=args.system) as runner:
        run = compare_policies(
            runner, loaded, reference_policy.max_new_tokens, together=len(spec.seeds)
        )
    print(f"reference: {run.reference_seconds:8.2f} s  (one episode at a time)")
    print(f"fast:      {run.fast_seconds:8.2f} s  ({len(run.fast)} episodes stepped together)")
    print(f"  {run.policy.stats.describe()}")
    seconds = run.policy.stats.seconds
    print("  seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items()))
    verdict = "no" if run.differ else "yes"
    print(f"fast/reference speedup: {run.ratio:.1f}x, trajectories identical: {verdict}")
    return 1 if run.differ else 0


if __name__ == "__main__":
    main()
