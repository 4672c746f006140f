"""Held-out evaluation of a checkpoint: what one costs, and what it takes from a training peer (issue #16).

Measured (runs/evaluation/runner.py is what is measured, with the demo's generated corpus and its
held-out split as runs/setup/heldout.py keeps it apart):

1. **Cost** of one held-out evaluation (masked-LM accuracy, perplexity, sentence-order accuracy)
   for the ``tiny`` and ``large`` presets at their real vocabularies (4,000 and 32,000 tokens) and
   sequence lengths (128 and 512), fp32 on the CPU, from freshly initialized weights (a trained
   checkpoint costs the same): CPU seconds (``time.process_time``, all threads) and wall seconds,
   with the bounded thread count the portal uses (``--threads``, EVALUATION_THREADS) and, as the
   baseline of the same run, with every CPU. ``large`` evaluates ``--large-documents`` held-out
   documents only (it is slow on small hosts); its per-example figures scale linearly.
2. **What a training peer keeps**: a tiny-model training loop (1 thread, normal priority, as a
   backbone peer or a local agent) counts its steps for ``--seconds`` alone, then while the
   evaluation runs beside it at the portal's priority (nice ``--nice``) and thread bound. The ratio
   is the share of its speed it keeps.

Run ``python -m bench.evaluation --help`` from the repository root; it prints a SUMMARY line.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
import zlib

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

import torch  # noqa: E402

from peer_agent.model import model_build  # noqa: E402
from peer_agent.tokenizer import tokenizer_as_transformers  # noqa: E402
from runs.evaluation.runner import heldout_batches, heldout_metrics  # noqa: E402
from runs.setup.corpus import corpus_lines  # noqa: E402
from runs.setup.forms import preset_config  # noqa: E402
from runs.setup.heldout import heldout_split  # noqa: E402
from runs.setup.tokenization import tokenizer_train  # noqa: E402


def corpus(lines: int, heldout: int) -> tuple[str, list[str]]:
    """The demo's corpus (runs/management/commands/demo.py) and the held-out documents the portal keeps."""
    split = heldout_split("\n".join(corpus_lines(n_lines=lines)), wanted=heldout)
    return split.training_text, split.documents


def evaluation_cost(preset: str, tokenizer, documents: list[str], threads: int) -> dict:
    config = preset_config(preset)
    model = model_build(config, config.tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                        init_seed=zlib.crc32(b"bench"))
    torch.set_num_threads(threads)
    cpu, wall = time.process_time(), time.perf_counter()
    batches = heldout_batches(tokenizer, config, documents)
    metrics = heldout_metrics(model, batches)
    return dict(preset=preset, threads=threads, cpu=time.process_time() - cpu, wall=time.perf_counter() - wall,
                examples=metrics["examples"], seq=config.data.max_seq_length)


def _training_loop(seconds: float, tokenizer_json: str, documents: list[str], result) -> None:
    from tokenizers import Tokenizer

    torch.set_num_threads(1)
    tokenizer = tokenizer_as_transformers(Tokenizer.from_str(tokenizer_json))
    config = preset_config("tiny")
    config.data.max_seq_length = 64
    model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = heldout_batches(tokenizer, config, documents)[:4]
    steps, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        model(**batches[steps % len(batches)]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    result.put(steps / seconds)


def _evaluation_loop(seconds: float, nice: int, threads: int, tokenizer_json: str, documents: list[str]) -> None:
    from tokenizers import Tokenizer

    os.nice(nice)
    tokenizer = tokenizer_as_transformers(Tokenizer.from_str(tokenizer_json))
    deadline = time.perf_counter() + seconds + 5
    while time.perf_counter() < deadline:
        evaluation_cost("tiny", tokenizer, documents, threads)


def peer_share(seconds: float, nice: int, threads: int, tokenizer_json: str, documents: list[str]) -> tuple[float, float]:
    """A training loop's steps/s alone and beside a running evaluation."""
    context = multiprocessing.get_context("spawn")
    rates = []
    for with_evaluation in (False, True):
        result = context.Queue()
        evaluator = None
        if with_evaluation:
            evaluator = context.Process(target=_evaluation_loop, args=(seconds, nice, threads, tokenizer_json, documents))
            evaluator.start()
            time.sleep(3)  # let it get past its imports
        trainer = context.Process(target=_training_loop, args=(seconds, tokenizer_json, documents, result))
        trainer.start()
        rates.append(result.get())
        trainer.join()
        if evaluator is not None:
            evaluator.terminate()
            evaluator.join()
    return rates[0], rates[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20000, help="corpus lines, as the demo's")
    parser.add_argument("--heldout", type=int, default=200, help="held-out size (documents), the portal's default")
    parser.add_argument("--large-documents", type=int, default=8, help="held-out documents the large preset evaluates")
    parser.add_argument("--threads", type=int, default=1, help="the bounded thread count (EVALUATION_THREADS)")
    parser.add_argument("--nice", type=int, default=10, help="the evaluation's priority increment (EVALUATION_NICE)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each training-loop measurement")
    parser.add_argument("--presets", default="tiny,large")
    args = parser.parse_args(argv)

    training_text, documents = corpus(args.lines, args.heldout)
    tokenizer_model = tokenizer_train(lines=training_text.splitlines(), vocab_size=4000)
    tokenizer = tokenizer_as_transformers(tokenizer_model)
    every = os.cpu_count() or 1
    print(f"held-out documents: {len(documents)} of a {args.lines}-line corpus; CPUs: {every}")
    print(f"{'preset':<7} {'threads':>7} {'examples':>8} {'tokens':>6} {'CPU s':>8} {'wall s':>8} {'wall/example':>12}")
    costs = {}
    for preset in args.presets.split(","):
        chosen = documents if preset == "tiny" else documents[:args.large_documents]
        for threads in dict.fromkeys((args.threads, every)):
            cost = evaluation_cost(preset, tokenizer, chosen, threads)
            costs[preset, threads] = cost
            print(f"{preset:<7} {threads:>7} {cost['examples']:>8} {cost['seq']:>6} {cost['cpu']:>8.2f} {cost['wall']:>8.2f} "
                  f"{cost['wall'] / cost['examples']:>12.3f}")
    alone, beside = peer_share(args.seconds, args.nice, args.threads, tokenizer_model.to_str(), documents)
    print(f"training loop (tiny, 1 thread): {alone:.2f} steps/s alone, {beside:.2f} beside an evaluation "
          f"(nice {args.nice}, {args.threads} thread): keeps {beside / alone:.0%}")
    summary = {"tiny_cpu": costs["tiny", args.threads]["cpu"], "tiny_wall": costs["tiny", args.threads]["wall"],
               "peer_keeps": beside / alone}
    for preset in args.presets.split(","):
        bounded, full = costs[preset, args.threads], costs[preset, every]
        summary[f"{preset}_wall_ratio_bounded_vs_all"] = bounded["wall"] / full["wall"]
    print("SUMMARY " + " ".join(f"{key}={value:.3f}" for key, value in summary.items()))
    return summary


if __name__ == "__main__":
    main()
