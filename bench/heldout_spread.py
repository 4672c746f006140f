"""Held-out scores over many initializations: the spread behind the evaluation test's thresholds (issue #28).

The world of ``tests/runs/evaluation/test_evaluation.py`` (harness/pretraining.py: its small ALBERT, the
generated corpus of 4,000 lines with 60 documents held out, a 400-piece tokenizer, 100 AdamW steps of 16
samples), with the run id, whose CRC-32 seeds the initial weights, drawn from ``--seeds`` ids
(``evaluation-seed-<n>``; the test's run is ``evaluation-seed-0``). For each: masked-LM accuracy and
perplexity of the random initialization and of the trained model on the held-out batches of
runs/evaluation/runner.py, and the baselines measured in the same run on the same masks: always guessing
the commonest piece of the training text, the unigram model (perplexity of the pieces' training
frequencies) and the bigram model, as the portal stores them (runs/evaluation/frequencies.py).
Everything else (data order, masks, held-out split) is seeded already. A CPU minute or so per seed.

Run ``python -m bench.heldout_spread --help`` from the repository root; it prints a SUMMARY line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

import torch  # noqa: E402

from harness.pretraining import model_pretrain, small_config  # noqa: E402
from peer_agent.protocol import RunConfig  # noqa: E402
from peer_agent.tokenizer import tokenizer_as_transformers  # noqa: E402
from runs.evaluation.frequencies import frequencies_count, frequency_metrics  # noqa: E402
from runs.evaluation.runner import heldout_batches, heldout_metrics  # noqa: E402
from runs.setup.corpus import corpus_lines  # noqa: E402
from runs.setup.heldout import heldout_split  # noqa: E402
from runs.setup.tokenization import tokenizer_train  # noqa: E402


def frequency_baselines(tokenizer, training_text: str, batches: list[dict]) -> dict:
    """The word-frequency baselines the portal stores (runs/evaluation/frequencies.py) on ``batches``:
    always answering the commonest training piece, the unigram's perplexity, and the bigram's."""
    counts = frequencies_count(tokenizer=tokenizer, documents=training_text.splitlines())
    measured = frequency_metrics(counts=counts, batches=batches)
    return dict(commonest_accuracy=measured["unigram"]["mlm_accuracy"], unigram_perplexity=measured["unigram"]["perplexity"],
                bigram_accuracy=measured["bigram"]["mlm_accuracy"], bigram_perplexity=measured["bigram"]["perplexity"])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="how many run ids (initializations) to train from")
    parser.add_argument("--steps", type=int, default=100, help="AdamW steps, as the test's")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the test runs on one)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    config = RunConfig.model_validate(small_config())
    split = heldout_split("\n".join(corpus_lines(n_lines=4000)), wanted=60)
    lines = [line.strip() for line in split.training_text.splitlines() if line.strip()]
    tokenizer = tokenizer_as_transformers(tokenizer_train(lines=lines[:config.tokenizer.sample_size],
                                                          vocab_size=config.tokenizer.vocab_size))
    batches = heldout_batches(tokenizer, config, split.documents)
    frequency = frequency_baselines(tokenizer, split.training_text, batches)
    print(f"always the commonest piece: accuracy {frequency['commonest_accuracy']:.4f}; "
          f"unigram perplexity {frequency['unigram_perplexity']:.1f}; bigram: accuracy {frequency['bigram_accuracy']:.4f}, "
          f"perplexity {frequency['bigram_perplexity']:.1f}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        training_file = Path(scratch) / "train.txt"
        training_file.write_text(split.training_text)
        print(f"{'run id':<20} {'random acc':>10} {'random ppl':>10} {'trained acc':>11} {'trained ppl':>11} {'s':>5}")
        for n in range(args.seeds):
            run_id, started = f"evaluation-seed-{n}", time.monotonic()
            init_seed = zlib.crc32(run_id.encode())
            model = model_pretrain(config, tokenizer, [str(training_file)], init_seed=init_seed, steps=0)
            random_init = heldout_metrics(model, batches)
            model = model_pretrain(config, tokenizer, [str(training_file)], init_seed=init_seed, steps=args.steps)
            trained = heldout_metrics(model, batches)
            rows.append((random_init, trained))
            print(f"{run_id:<20} {random_init['mlm_accuracy']:>10.4f} {random_init['perplexity']:>10.1f} "
                  f"{trained['mlm_accuracy']:>11.4f} {trained['perplexity']:>11.1f} {time.monotonic() - started:>5.0f}",
                  flush=True)
    summary = dict(frequency)
    for name, index in (("random", 0), ("trained", 1)):
        for metric in ("mlm_accuracy", "perplexity"):
            values = [row[index][metric] for row in rows]
            summary.update({f"{name}_{metric}_min": min(values), f"{name}_{metric}_max": max(values),
                            f"{name}_{metric}_mean": statistics.mean(values),
                            f"{name}_{metric}_std": statistics.stdev(values) if len(values) > 1 else 0.0})
    ratios = [trained["perplexity"] / random_init["perplexity"] for random_init, trained in rows]
    summary["perplexity_ratio_max"] = max(ratios)
    summary["accuracy_lead_min"] = min(trained["mlm_accuracy"] - random_init["mlm_accuracy"] for random_init, trained in rows)
    for name in ("random", "trained"):
        print(f"{name}: accuracy {summary[f'{name}_mlm_accuracy_mean']:.4f} ± {summary[f'{name}_mlm_accuracy_std']:.4f} "
              f"({summary[f'{name}_mlm_accuracy_min']:.4f} to {summary[f'{name}_mlm_accuracy_max']:.4f}); perplexity "
              f"{summary[f'{name}_perplexity_mean']:.1f} ({summary[f'{name}_perplexity_min']:.1f} to "
              f"{summary[f'{name}_perplexity_max']:.1f})")
    print(f"trained over random, worst of {len(rows)}: accuracy lead {summary['accuracy_lead_min']:+.4f}, perplexity "
          f"ratio {summary['perplexity_ratio_max']:.3f}")
    print("SUMMARY " + " ".join(f"{key}={value:.4f}" for key, value in summary.items()))
    return summary


if __name__ == "__main__":
    main()
