"""The Trainer is made of parts (peer_agent/training.py): what a peer claims it computed is one part, the
computing another, so a liar swapping its claims (tests/security/liar_agent.py) leaves the work as it was."""

import pytest
import torch
from hivemind.utils.crypto import RSAPrivateKey

from peer_agent.commitments import Commitments
from peer_agent.training import Trainer, TrainerSetup

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600), pytest.mark.usefixtures("reap_children", "torch_threads")]

STEPS = 5
# A lone peer enters its next epoch once its progress tracker, refreshed in the background, has read the
# samples it accumulated: on a loaded machine (CI63, load 14) one run of two entered an epoch a step later,
# so its optimizer stepped on twice the gradients, and the runs' losses parted from the third step. Runs are
# compared when their steps closed the same epochs; each try is a new pair.
TRIES = 4


class PassingOffCommitments(Commitments):
    """Commits every step with the first fingerprint it was ever given, as a lazy peer would, and keeps
    what the step computer said each step computed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.given: list[list[str]] = []

    def step_commit(self, epoch: int, cursor: int, fingerprints: list[str], parameters: str) -> None:
        self.given.append(list(fingerprints))
        super().step_commit(epoch, cursor, [self.given[0][0]] * len(fingerprints), parameters)


def trained(tokenizer, corpus_file, tiny_config, **parts):
    """A lone tiny trainer's ``STEPS`` steps: their results, its commitments, its parameters and the trainer."""
    # Two micro-batches a step, and a step per epoch (a peer alone steps every epoch), so that every step
    # closes an epoch and signs its commitment.
    config = tiny_config(training=dict(target_batch_size=8, gradient_accumulation_steps=2))
    setup = TrainerSetup(config=config, run_id="test_parts_run", private_key=RSAPrivateKey(),
                         host_maddrs=["/ip4/127.0.0.1/tcp/0"], threads=1, seed=1, data_files=[str(corpus_file)])
    trainer = Trainer(setup, tokenizer, **parts)
    try:
        results, commitments = [], []
        for _ in range(STEPS):
            results.append(trainer.step())
            commitments += trainer.commitments_take()
        parameters = torch.cat([param.detach().flatten() for param in trainer.model.parameters()]).clone()
    finally:
        trainer.shutdown()
    return results, commitments, parameters, trainer


def test_a_trainer_whose_commitments_lie_trains_the_same_steps_and_commits_other_fingerprints(
        tokenizer, corpus_file, tiny_config):
    for _ in range(TRIES):
        honest, honest_commitments, honest_parameters, _ = trained(tokenizer, corpus_file, tiny_config)
        lying, lying_commitments, lying_parameters, liar = trained(tokenizer, corpus_file, tiny_config,
                                                                   commitments_factory=PassingOffCommitments)
        epochs = [[result.local_epoch for result in results] for results in (honest, lying)]
        if epochs[0] == epochs[1]:
            break
    assert epochs[0] == epochs[1], f"in {TRIES} tries the two runs never closed the same epochs: {epochs}"

    assert [result.loss for result in lying] == [result.loss for result in honest], "the same steps, the same losses"
    assert [result.samples for result in lying] == [result.samples for result in honest] == [8] * STEPS
    assert torch.equal(lying_parameters, honest_parameters)
    honest_fingerprints = [[step.fingerprint for step in commitment.steps] for commitment in honest_commitments]
    assert len(honest_commitments) == len(lying_commitments) >= STEPS - 1, "each closed epoch committed to"
    # The step computer measured the same work in both; only the claims differ.
    assert liar.commitments.given[:len(honest_fingerprints)] == honest_fingerprints
    lying_fingerprints = {step.fingerprint for commitment in lying_commitments for step in commitment.steps}
    assert lying_fingerprints == {honest_fingerprints[0][0]}
    assert len({fingerprint for steps in honest_fingerprints for fingerprint in steps}) == 2 * len(honest_commitments)
    # The rest of each commitment is the honest one's, signed all the same.
    assert [(c.epoch, [(s.cursor, s.parameters) for s in c.steps]) for c in lying_commitments] == [
        (c.epoch, [(s.cursor, s.parameters) for s in c.steps]) for c in honest_commitments]
    assert all(commitment.signature != "A" for commitment in lying_commitments)
