"""Downstream probes: what one probe's fine-tune costs per checkpoint, against the held-out evaluation (issue #16).

Measured (runs/evaluation/probing.py is what is measured, with the fixed budget ``BUDGET``, on the
demo's generated labelled sets, runs/setup/labelled.py): each probe's fine-tune and scoring for the
``tiny`` and ``large`` presets at their real vocabularies, fp32 on the CPU, from freshly initialized
weights (a checkpoint costs the same), CPU seconds (``time.process_time``, all threads) and wall
seconds with the portal's bounded thread count (``--threads``, EVALUATION_THREADS). The baseline of
the ratio is the held-out evaluation of the same model (runs/evaluation/runner.py) on the demo's
held-out documents: the probes' cost in units of what every checkpoint costs already. ``large``
fine-tunes on ``--large-train`` examples only (it is slow on small hosts); its cost scales linearly
with the examples, so the full budget's figure is printed scaled beside it. Each probe is measured
with every seed count of ``--seeds`` (a score is the mean of that many fine-tunes, issue 30): the
last column is the cost against the first count's.

Run ``python -m bench.probes --help`` from the repository root; it prints a SUMMARY line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
import zlib

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

import torch  # noqa: E402

from peer_agent.model import model_build  # noqa: E402
from peer_agent.tokenizer import tokenizer_as_transformers  # noqa: E402
from runs.evaluation.probing import BUDGET, probe_finetune  # noqa: E402
from runs.evaluation.runner import heldout_batches, heldout_metrics  # noqa: E402
from runs.setup.corpus import corpus_lines  # noqa: E402
from runs.setup.forms import preset_config  # noqa: E402
from runs.setup.heldout import heldout_split  # noqa: E402
from runs.setup.labelled import entity_sets, kind_sets  # noqa: E402
from runs.setup.probes import labelled_set_read  # noqa: E402
from runs.setup.tokenization import tokenizer_train  # noqa: E402


def probe_sets() -> dict:
    sets = {}
    for name, task, (train, test) in (("names-and-places", "tokens", entity_sets()), ("person-place-thing", "text", kind_sets())):
        train_set = labelled_set_read(task=task, content=train.encode(), part="train")
        test_set = labelled_set_read(task=task, content=test.encode(), part="test")
        sets[name] = (task, train_set, test_set)
    return sets


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20000, help="corpus lines, as the demo's")
    parser.add_argument("--heldout", type=int, default=200, help="held-out size (documents), the portal's default")
    parser.add_argument("--threads", type=int, default=1, help="the bounded thread count (EVALUATION_THREADS)")
    parser.add_argument("--large-train", type=int, default=64, help="train examples the large preset fine-tunes on")
    parser.add_argument("--presets", default="tiny,large")
    parser.add_argument("--seeds", default=f"1,{BUDGET.seeds}", help="fine-tunes per score to measure, comma-separated")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    split = heldout_split("\n".join(corpus_lines(n_lines=args.lines)), wanted=args.heldout)
    tokenizer = tokenizer_as_transformers(tokenizer_train(lines=split.training_text.splitlines(), vocab_size=4000))
    sets = probe_sets()
    print(f"budget: {BUDGET}; threads: {args.threads}")
    seed_counts = [int(count) for count in args.seeds.split(",")]
    print(f"{'preset':<7} {'what':<18} {'seeds':>5} {'train':>6} {'CPU s':>8} {'wall s':>8} {'wall, full budget':>17} "
          f"{'× held-out':>10} {'× first':>7} {'score':>13}")
    summary = {}
    for preset in args.presets.split(","):
        config = preset_config(preset)
        model = model_build(config, config.tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                            init_seed=zlib.crc32(b"bench"))
        documents = split.documents if preset == "tiny" else split.documents[:8]
        cpu, wall = time.process_time(), time.perf_counter()
        examples = heldout_metrics(model, heldout_batches(tokenizer, config, documents))["examples"]
        heldout_cpu, heldout_wall = time.process_time() - cpu, time.perf_counter() - wall
        print(f"{preset:<7} {'held-out':<18} {'':>5} {examples:>6} {heldout_cpu:>8.2f} {heldout_wall:>8.2f} {'':>17} "
              f"{1:>10.2f}")
        budget = BUDGET if preset == "tiny" else dataclasses.replace(BUDGET, max_train_examples=args.large_train)
        for name, (task, train, test) in sets.items():
            used = min(len(train.examples), budget.max_train_examples)
            first = None
            for seeds in seed_counts:
                result = probe_finetune(task=task, train=train, test=test, labels=sorted(train.labels),
                                        tokenizer=tokenizer, encoder=model, budget=dataclasses.replace(budget, seeds=seeds))
                full = result.wall_seconds * min(len(train.examples), BUDGET.max_train_examples) / used
                ratio, first = full / heldout_wall, first or result.cpu_seconds
                summary[f"{preset}_{task}_{seeds}seeds_wall_vs_heldout"] = ratio
                summary[f"{preset}_{task}_{seeds}seeds_cpu_vs_first"] = result.cpu_seconds / first
                spread = "" if result.std is None else f" ± {result.std:.3f}"
                print(f"{preset:<7} {name:<18} {seeds:>5} {used:>6} {result.cpu_seconds:>8.2f} {result.wall_seconds:>8.2f} "
                      f"{full:>17.2f} {ratio:>10.2f} {result.cpu_seconds / first:>7.2f} {result.score:>6.3f}{spread:<7}")
    print("SUMMARY " + " ".join(f"{key}={value:.3f}" for key, value in summary.items()))
    return summary


if __name__ == "__main__":
    main()
