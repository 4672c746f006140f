"""The baselines a checkpoint is measured against (issue 30): word-frequency models scored by hand on
masked positions, which baselines the evaluation task still owes a run, the run page's "beats" columns,
and probe scores shown as a mean ± standard deviation over seeds."""

import math

import pytest
import torch
from django.urls import reverse

from runs.evaluation import services
from runs.evaluation.frequencies import FrequencyCounts, frequency_metrics
from runs.evaluation.selectors import evaluation_beats, evaluation_table
from runs.models import Checkpoint, Evaluation, Probe, ProbeScore
from tests.factories import RunFactory

A, B, C, MASK = 10, 11, 12, 4


def counts() -> FrequencyCounts:
    """A training text "A B A B A C" over a vocabulary of 5 answerable pieces."""
    found = FrequencyCounts(vocabulary=5)
    pieces = [A, B, A, B, A, C]
    found.unigram.update(pieces)
    for left, piece in zip(pieces, pieces[1:]):
        found.bigram[left][piece] += 1
    return found


def batch(input_ids: list[int], labels: list[int]) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor([input_ids]), "labels": torch.tensor([labels])}


def test_the_unigram_guesses_the_commonest_piece_and_scores_add_one_smoothed_frequencies():
    # [CLS] A [MASK] [MASK] [SEP]: the labels B and C are masked; -100 where nothing is asked.
    scored = frequency_metrics(counts=counts(), batches=[batch([2, A, MASK, MASK, 3], [-100, -100, B, C, -100])])
    unigram = scored["unigram"]
    # By hand: 6 pieces counted + 5 for add-one: p(B) = 3/11, p(C) = 2/11; the commonest piece is A.
    assert unigram["perplexity"] == pytest.approx(math.exp(-(math.log(3 / 11) + math.log(2 / 11)) / 2))
    assert unigram["mlm_accuracy"] == 0.0 and unigram["masked_tokens"] == 2 and unigram["examples"] == 1


def test_the_bigram_reads_the_left_neighbour_as_the_model_sees_it_and_backs_off_where_it_is_masked():
    scored = frequency_metrics(counts=counts(), batches=[batch([2, A, MASK, MASK, 3], [-100, -100, B, C, -100])])
    # B's neighbour is A, followed by B twice and C once (3 times, 2 kinds): Witten-Bell gives
    # (2 + 2 * 3/11) / (3 + 2) and guesses B. C's neighbour is [MASK]: no evidence, the unigram's 2/11, guess A.
    p_b = (2 + 2 * 3 / 11) / 5
    assert scored["bigram"]["perplexity"] == pytest.approx(math.exp(-(math.log(p_b) + math.log(2 / 11)) / 2))
    assert scored["bigram"]["mlm_accuracy"] == 0.5
    assert scored["bigram"]["perplexity"] < scored["unigram"]["perplexity"]


def test_an_empty_training_text_is_refused_rather_than_scored():
    with pytest.raises(ValueError, match="no words"):
        frequency_metrics(counts=FrequencyCounts(vocabulary=5), batches=[batch([2, MASK, 3], [-100, A, -100])])


@pytest.fixture
def run(db, organizer):
    run = RunFactory(organizers=[organizer], tokenizer_status="ready")
    Checkpoint.objects.create(run=run, epoch=53, samples=100, file="x/000001-epoch53.zip")
    return run


def test_a_run_that_has_only_its_random_init_baseline_is_owed_the_frequency_baselines(run):
    Evaluation.objects.create(run=run, epoch=None, kind="random_init", mlm_accuracy=0.0, perplexity=400.0)
    assert [checkpoint for due_run, checkpoint in services.evaluations_due() if due_run == run] == [None, run.checkpoints.get()]
    claim = services.evaluation_claim(run=run, checkpoint=None)
    assert (claim.epoch, claim.kind) == (None, "unigram"), "the claim takes the first baseline the run lacks"
    assert services.evaluation_claim(run=run, checkpoint=None).kind == "bigram"
    assert services.evaluation_claim(run=run, checkpoint=None) is None, "nothing is left to claim"
    assert None not in [checkpoint for _, checkpoint in services.evaluations_due()]


def baseline(run, kind: str, accuracy: float, perplexity: float) -> Evaluation:
    return Evaluation.objects.create(run=run, epoch=None, kind=kind, mlm_accuracy=accuracy, perplexity=perplexity)


def scored(run, epoch: int, accuracy: float, perplexity: float) -> Evaluation:
    return Evaluation.objects.create(run=run, epoch=epoch, mlm_accuracy=accuracy, perplexity=perplexity, sop_accuracy=0.5)


def test_a_checkpoint_beats_a_baseline_only_with_both_a_higher_accuracy_and_a_lower_perplexity(run):
    unigram = baseline(run, "unigram", 0.0635, 129.0)
    assert evaluation_beats(evaluation=scored(run, 53, 0.0700, 259.0), baseline=unigram) is False
    assert evaluation_beats(evaluation=scored(run, 78, 0.0635, 128.0), baseline=unigram) is False, "the same guess"
    assert evaluation_beats(evaluation=scored(run, 99, 0.0800, 120.0), baseline=unigram) is True
    assert evaluation_beats(evaluation=scored(run, 120, 0.0800, 120.0), baseline=None) is None
    claimed = Evaluation.objects.create(run=run, epoch=130)
    assert evaluation_beats(evaluation=claimed, baseline=unigram) is None


def test_the_run_page_says_apart_whether_each_checkpoint_beats_random_init_and_word_frequencies(client_for, run,
                                                                                              organizer):
    baseline(run, "random_init", 0.002, 405.0)
    baseline(run, "unigram", 0.0635, 129.0)
    baseline(run, "bigram", 0.09, 100.0)
    scored(run, 53, 0.05, 259.0)
    scored(run, 99, 0.08, 120.0)
    rows = {row["evaluation"].epoch: row["beats"] for row in evaluation_table(run=run) if not row["evaluation"].baseline}
    assert rows == {53: [True, False, False], 99: [True, True, False]}
    page = client_for(organizer).get(reverse("run-detail", args=[run.slug])).content.decode()
    assert "Beats random init" in page and "Beats word frequencies" in page
    assert "word frequencies</th>" in page and "word-pair frequencies</th>" in page, "each baseline's own row"
    row = page[page.index('data-epoch="53"'):]
    row = row[:row.index("</tr>")]
    assert [cell.split(">")[1] for cell in row.split('<td class="beats"')[1:]] == ["yes</td", "no</td", "no</td"]


def test_probe_scores_show_their_mean_and_spread_over_seeds(client_for, run, organizer):
    probe = Probe.objects.create(run=run, name="names", task="tokens", labels=["O", "B-PER"],
                                 train_file="x/train.txt", test_file="x/test.txt", train_examples=10, test_examples=5)
    ProbeScore.objects.create(probe=probe, baseline=True, score=0.381, score_std=0.021, seeds=3)
    ProbeScore.objects.create(probe=probe, epoch=53, samples=100, score=0.592, score_std=0.034, seeds=3)
    rows = client_for(organizer).get(f"/api/v1/runs/{run.slug}/probes").json()
    assert (rows[0]["baseline"], rows[0]["baseline_std"]) == (0.381, 0.021)
    assert (rows[0]["latest"]["std"], rows[0]["latest"]["seeds"]) == (0.034, 3)
    page = client_for(organizer).get(reverse("run-detail", args=[run.slug])).content.decode()
    assert "0.592 ± 0.034" in page and "0.381 ± 0.021" in page


def test_frequency_baselines_that_cannot_be_measured_fail_on_their_rows_and_let_the_other_evaluators_go_on(run):
    from peer_agent.protocol import RunConfig
    from runs.evaluation.runner import EvaluationError, frequencies_evaluate
    from runs.evaluation.subjects import Subject

    config = RunConfig.model_validate(run.config)
    config.data.source = "files"  # and the run has no files: nothing to count

    class Vocabulary:
        cls_token_id, sep_token_id, pad_token_id, mask_token_id = 2, 3, 0, MASK

        def __len__(self):
            return 20

    subject = Subject(run=run, checkpoint=None, config=config, model=None, tokenizer=Vocabulary(), save=True,
                      batches=[batch([2, A, MASK, 3], [-100, -100, B, -100])])
    assert frequencies_evaluate(subject) == []
    failed = {e.kind: e.error for e in run.evaluations.all()}
    assert set(failed) == {"unigram", "bigram"} and "no words" in failed["unigram"]
    assert services.evaluation_claim(run=run, checkpoint=None).kind == "random_init", "still owed"
    assert services.evaluation_claim(run=run, checkpoint=None) is None, "the failed ones are not retried"
    subject.save = False
    with pytest.raises(EvaluationError, match="could not be measured"):
        frequencies_evaluate(subject)
