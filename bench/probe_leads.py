"""Downstream probes: how far the demo's pretraining puts a checkpoint ahead of its random initialization (issue #16).

Measured in one process, with nothing downloaded and no swarm: the demo's model and training
(``demo_config("demo")`` of runs/management/commands/demo.py: LAMB, its learning-rate schedule,
batches of ``--batch`` samples as the demo's target batch) pretrained on the demo's generated corpus
from ``--seeds`` initializations, and at each of ``--steps`` (optimizer steps, what the demo calls
epochs) the demo's probes (runs/setup/labelled.py) fine-tuned with the fixed budget of
runs/evaluation/probing.py. Step 0 is the random-init baseline, measured in the same run; each
later score is printed with its lead over it. A few CPU minutes per seed.

Run ``python -m bench.probe_leads --help`` from the repository root; it prints a SUMMARY line.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

import torch  # noqa: E402

from bench.probes import probe_sets  # noqa: E402
from peer_agent.data import batches, dataset_stream  # noqa: E402
from peer_agent.model import model_build  # noqa: E402
from peer_agent.optim import parameter_groups  # noqa: E402
from peer_agent.tokenizer import tokenizer_as_transformers  # noqa: E402
from peer_agent.training import lamb_factory, schedule_factory  # noqa: E402
from runs.evaluation.probing import probe_finetune  # noqa: E402
from runs.management.commands.demo import demo_config  # noqa: E402
from runs.setup.corpus import corpus_lines  # noqa: E402
from runs.setup.heldout import heldout_split  # noqa: E402
from runs.setup.tokenization import tokenizer_train  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3", help="initializations (init_seed), comma-separated")
    parser.add_argument("--steps", default="40,75,100", help="optimizer steps at which the probes run, comma-separated")
    parser.add_argument("--batch", type=int, default=256, help="samples per step (the demo's target batch)")
    parser.add_argument("--lines", type=int, default=20000, help="corpus lines, as the demo's")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    steps = sorted(int(step) for step in args.steps.split(","))
    split = heldout_split("\n".join(corpus_lines(n_lines=args.lines)), wanted=200)
    tokenizer = tokenizer_as_transformers(tokenizer_train(lines=split.training_text.splitlines(), vocab_size=4000))
    config = demo_config("demo")
    sets = probe_sets()
    summary = {}
    with tempfile.TemporaryDirectory() as scratch:
        training_file = Path(scratch) / "train.txt"
        training_file.write_text(split.training_text)
        print(f"{'seed':>4} {'step':>5} {'probe':<20} {'score':>6} {'lead':>7} {'× baseline':>10} {'elapsed s':>9}")
        for seed in (int(seed) for seed in args.seeds.split(",")):
            model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id, init_seed=seed)
            optimizer = lamb_factory(config.training)(parameter_groups(model, config.training.weight_decay))
            scheduler = schedule_factory(config.training)(optimizer)
            stream = batches(tokenizer, config, dataset_stream(config, data_files=[str(training_file)], seed=1),
                             args.batch, seed=1)
            baseline, done, started = {}, 0, time.monotonic()
            for step in [0, *steps]:
                model.train()
                for _ in range(step - done):
                    model(**next(stream)).loss.backward()
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                done = step
                model.eval()
                for name, (task, train, test) in sets.items():
                    score = probe_finetune(task=task, train=train, test=test, labels=sorted(train.labels),
                                           tokenizer=tokenizer, encoder=model).score
                    baseline.setdefault(name, score)
                    lead = score - baseline[name]
                    if step:
                        summary[f"seed{seed}_step{step}_{name}_lead"] = lead
                    print(f"{seed:>4} {step:>5} {name:<20} {score:>6.3f} {lead:>+7.3f} {score / baseline[name]:>10.2f} "
                          f"{time.monotonic() - started:>9.0f}", flush=True)
    for step in steps:
        for name in sets:
            leads = [value for key, value in summary.items() if key.endswith(f"_step{step}_{name}_lead")]
            print(f"step {step} {name}: led in {sum(lead > 0 for lead in leads)} of {len(leads)}, "
                  f"leads {min(leads):+.3f} to {max(leads):+.3f}")
    print("SUMMARY " + " ".join(f"{key}={value:.3f}" for key, value in summary.items()))
    return summary


if __name__ == "__main__":
    main()
