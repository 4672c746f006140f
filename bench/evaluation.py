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

3. **Which baselines a run's checkpoints beat** (``--run SLUG``, issue 30): the run's stored
   evaluations (read from the database that ``DATABASE_URL`` names, its files from ``MEDIA_ROOT``)
   beside its baselines: random init as stored, and the word-frequency baselines
   (runs/evaluation/frequencies.py) as stored or, for a run evaluated before they existed, measured
   here on its training text and held-out split without storing them. It prints, per baseline, the
   epoch from which every evaluated checkpoint beats it. Point it at a copy of a running demo's
   database, migrated (docs/benchmarks.md section 14), never at the live one.

Run ``python -m bench.evaluation --help`` from the repository root; it prints a SUMMARY line.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
import zlib
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

import torch  # noqa: E402

from peer_agent.model import model_build  # noqa: E402
from peer_agent.tokenizer import tokenizer_as_transformers  # noqa: E402
from runs.evaluation.runner import frequencies_evaluate, heldout_batches, heldout_metrics, subject_load  # noqa: E402
from runs.evaluation.selectors import BASELINE_KINDS, evaluation_beats, evaluation_status, evaluations_of  # noqa: E402
from runs.models import Evaluation, Run  # noqa: E402
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


def run_baselines(run: Run) -> dict[str, Evaluation]:
    """The run's baselines: as stored, or (word frequencies, for a run evaluated before them) measured now."""
    stored = {e.kind: e for e in evaluations_of(run=run) if e.baseline and evaluation_status(e) == "done"}
    if all(kind in stored for kind in BASELINE_KINDS):
        return stored
    with tempfile.TemporaryDirectory() as workdir:
        scores = frequencies_evaluate(subject_load(run, None, Path(workdir), save=False))
    print(f"word-frequency baselines measured now (not stored): {scores[0].cpu_seconds:.2f} CPU s, "
          f"{scores[0].wall_seconds:.2f} wall s, {scores[0].examples} held-out pairs")
    for kind in (Evaluation.Kind.UNIGRAM, Evaluation.Kind.BIGRAM):
        own = {score.metric: score.value for score in scores if score.evaluator == kind}
        stored.setdefault(kind, Evaluation(run=run, kind=kind, mlm_accuracy=own["mlm_accuracy"],
                                           perplexity=own["perplexity"]))
    return stored


def run_beaten(slug: str) -> dict:
    """Per checkpoint of the run, whether it beats each baseline; per baseline, the epoch from which all do."""
    run = Run.objects.get(slug=slug)
    baselines = run_baselines(run)
    checkpoints = [e for e in evaluations_of(run=run) if not e.baseline and evaluation_status(e) == "done"]
    kinds = [kind for kind in BASELINE_KINDS if kind in baselines]
    print(f"{'baseline':<12} {'MLM accuracy':>12} {'perplexity':>10}")
    for kind in kinds:
        print(f"{kind:<12} {baselines[kind].mlm_accuracy:>12.2%} {baselines[kind].perplexity:>10.1f}")
    print(f"{'epoch':>6} {'MLM accuracy':>12} {'perplexity':>10} " + " ".join(f"{'beats ' + kind:>18}" for kind in kinds))
    beaten = {kind: [] for kind in kinds}
    for evaluation in checkpoints:
        row = [evaluation_beats(evaluation=evaluation, baseline=baselines[kind]) for kind in kinds]
        for kind, beats in zip(kinds, row, strict=True):
            beaten[kind].append((evaluation.epoch, beats))
        print(f"{evaluation.epoch:>6} {evaluation.mlm_accuracy:>12.2%} {evaluation.perplexity:>10.1f} "
              + " ".join(f"{'yes' if beats else 'no':>18}" for beats in row))
    summary = {}
    for kind, rows in beaten.items():
        since = None
        for epoch, beats in reversed(rows):
            if not beats:
                break
            since = epoch
        first = next((epoch for epoch, beats in rows if beats), None)
        print(f"{kind}: first beaten at epoch {first}; beaten by every checkpoint from epoch {since}")
        summary[f"{kind}_first"], summary[f"{kind}_since"] = first, since
        summary[f"{kind}_perplexity"], summary[f"{kind}_accuracy"] = baselines[kind].perplexity, baselines[kind].mlm_accuracy
    print("SUMMARY " + " ".join(f"{key}={value if isinstance(value, int | None) else f'{value:.4f}'}"
                                for key, value in summary.items()))
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20000, help="corpus lines, as the demo's")
    parser.add_argument("--heldout", type=int, default=200, help="held-out size (documents), the portal's default")
    parser.add_argument("--large-documents", type=int, default=8, help="held-out documents the large preset evaluates")
    parser.add_argument("--threads", type=int, default=1, help="the bounded thread count (EVALUATION_THREADS)")
    parser.add_argument("--nice", type=int, default=10, help="the evaluation's priority increment (EVALUATION_NICE)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each training-loop measurement")
    parser.add_argument("--presets", default="tiny,large")
    parser.add_argument("--run", help="instead: which baselines this run's stored evaluations beat (see above)")
    args = parser.parse_args(argv)
    if args.run:
        return run_beaten(args.run)

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
