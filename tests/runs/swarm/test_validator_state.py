"""The validator holds an epoch's parameters only when two distinct peers serve the same for it
(runs/swarm/spotcheck.py): a state caught between a peer's new epoch and its optimizer step, a peer
that stepped on its own gradients, or a peer serving its own parameters on purpose would fail every
honest check of the epoch (docs/trust.md)."""

import pytest
import torch

from peer_agent.averaging import UNREACHABLE
from peer_agent.model import model_build
from peer_agent.protocol import RunConfig
from runs.swarm.spotcheck import (
    HELD_EPOCHS,
    HOLD_DIALS_PER_TRY,
    HOLD_DOWNLOAD_TIMEOUT_S,
    READING_LAG_EPOCHS,
    STATE_AGREEMENT,
    STATE_SAME,
    Validator,
    epochs_checkable,
    parameters_apart,
    state_among,
)


class Peers:
    """The checkpointer's ``state_download_from`` answering for each named peer with the state given
    for it (a list: one state per download, the last repeated). A real swarm cannot be made to serve
    a state in the moment between a peer's epoch count and its optimizer step on cue;
    tests/e2e/test_spot_checks_with_agents.py and tests/security/test_liar_agents.py run the
    validator on real downloads."""

    tokenizer = "the run's tokenizer"
    parameter_count = 64 * 32 + 32  # model_parameters'

    def __init__(self, **states) -> None:
        self.states = {peer: served if isinstance(served, list) else [served] for peer, served in states.items()}
        self.asked: list[str] = []
        self.kept: dict[str, dict[tuple[int, str], list]] = {}  # peer -> (epoch, sketch) -> the state it kept
        self.asked_kept: list[tuple[str, int]] = []
        self.silences: list[float] = []

    def state_download_from(self, peer: str, *, timeout: float, silence: float, kept: tuple[int, str] | None = None):
        self.silences.append(silence)
        if kept is not None:
            self.asked_kept.append((peer, kept[0]))
            if self.states.get(peer) == [UNREACHABLE]:
                return UNREACHABLE
            state = self.kept.get(peer, {}).get(kept)
            return None if state is None else (kept[0], [parameter.clone() for parameter in state])
        self.asked.append(peer)
        served = self.states[peer]
        state = served.pop(0) if len(served) > 1 else served[0]
        if state is None:  # a peer reached that sends nothing in time (slow, or hostile)
            return None
        if state == UNREACHABLE:  # a peer whose process is gone: no stream to it opens
            return UNREACHABLE
        epoch, parameters = state
        return epoch, [parameter.clone() for parameter in parameters]


def model_parameters(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 32, generator=generator), torch.randn(32, generator=generator)]


def one_lamb_step(parameters: list[torch.Tensor], rate: float) -> list[torch.Tensor]:
    """Each tensor moved by ``rate`` times its norm, in a random direction: LAMB's step."""
    generator = torch.Generator().manual_seed(99)
    moved = []
    for parameter in parameters:
        direction = torch.randn(parameter.shape, generator=generator)
        moved.append(parameter + rate * parameter.norm() * direction / direction.norm())
    return moved


def validator(**states) -> Validator:
    checks = Validator(run_pk=1, run_id="run", slug="run", dht=None, checkpointer=Peers(**states))
    checks._sources = list(states)
    return checks


def looks(checks: Validator, times: int, swarm_epoch: int = 7) -> None:
    """``times`` looks of the holder, the monitor's reading at ``swarm_epoch`` (hold_once's arguments)."""
    for _ in range(times):
        checks._hold(swarm_epoch + READING_LAG_EPOCHS, reading=swarm_epoch)


def test_two_peers_that_serve_the_same_parameters_have_them_held_by_their_epoch():
    parameters = model_parameters(0)
    through_fp16 = [parameter.half().float() for parameter in parameters]  # how states travel
    checks = validator(amina=(7, parameters), rahim=(7, through_fp16))
    looks(checks, 1)
    assert list(checks.held) == [7] and len(checks.held[7]) == 2, "each peer's, as close as fp16 allows"
    assert all(torch.allclose(held, sent, atol=1e-3) for state in checks.held[7]
               for held, sent in zip(state, parameters, strict=True))
    assert checks.disagreements == {}


def test_two_states_closer_than_a_sketch_can_tell_apart_are_both_held():
    """Late in a run one optimizer step moves the parameters by less than STATE_AGREEMENT: the previous
    epoch's state, served under the new epoch for a moment, and the new one both agree with the
    parameters the agents claim. Keeping only the first held, the validator recomputed the agents'
    steps at the wrong one and suspended both agents of a demo (epoch 567)."""
    stepped = one_lamb_step(OLD, rate=0.0004)
    assert 0.0003 < parameters_apart(stepped, OLD) < STATE_AGREEMENT
    checks = validator(amina=[(8, OLD), (8, stepped)], rahim=[(8, OLD), (8, stepped)])
    looks(checks, 10, swarm_epoch=8)
    assert len(checks.held[8]) == 2 and state_among(stepped, checks.held[8], within=STATE_SAME)
    assert state_among(OLD, checks.held[8], within=STATE_SAME)


OLD = model_parameters(0)
NEW = one_lamb_step(OLD, rate=0.00176)


def test_one_peer_asked_twice_is_not_two_peers():
    checks = validator(amina=(7, OLD), rahim=None)  # rahim is reached but silent: only amina answers
    looks(checks, 10)
    assert checks.held == {}
    assert checks.checkpointer.asked.count("rahim") >= 1, "both peers were asked"


def test_the_survivor_of_a_killed_peer_has_its_state_held_while_the_killed_one_is_still_declared():
    """hivemind keeps a killed peer declared as a state source for 30 s; no stream to it opens. Issue 29:
    the survivor's epochs in that time earned nothing (tests/e2e/test_honest_credit.py, on a loaded machine)."""
    checks = validator(amina=(7, OLD), rahim=UNREACHABLE)
    looks(checks, 1)
    assert list(checks.held) == [7] and state_among(OLD, checks.held[7], within=STATE_SAME)


def test_a_peer_alone_in_its_epoch_while_another_joins_has_its_state_held():
    """A joining agent declares itself before it has loaded the swarm's state, and serves an epoch far behind
    (CI33, beside a demo: the first agent's epoch 3 earned nothing while the second joined)."""
    checks = validator(amina=(7, OLD), rahim=(2, NEW))
    looks(checks, 10)
    assert list(checks.held) == [7] and state_among(OLD, checks.held[7], within=STATE_SAME)


@pytest.mark.parametrize("peers, reading", [
    (dict(liar=(9, [parameter * 1.05 for parameter in OLD]), amina=(7, OLD)), 7),  # ahead of the reading
    (dict(amina=(8, NEW), rahim=(7, OLD)), 8),  # one behind: stepping into the epoch after the other
    (dict(amina=(7, OLD), rahim=(2, NEW)), None),  # no reading yet
], ids=["a-liar-ahead-of-the-swarm", "one-epoch-behind", "no-reading"])
def test_a_peer_ahead_of_the_others_is_not_alone_in_its_epoch(peers, reading):
    """A liar serving epochs ahead of the honest peers would be alone in each, and have its own parameters held:
    the lone peer's epoch must be one the monitor's reading has reached."""
    checks = validator(**peers)
    for _ in range(10):
        checks._hold((reading or 0) + READING_LAG_EPOCHS, reading=reading)
    assert checks.held == {}


@pytest.mark.parametrize("peers", [
    dict(liar=(7, [parameter * 1.05 for parameter in OLD]), sybil=UNREACHABLE, amina=(7, OLD)),  # two answers
    dict(liar=(7, OLD), amina=UNREACHABLE, rahim=None),  # one of the others was reached: it may be slow
    dict(liar=(7, OLD), **{f"gone{n}": UNREACHABLE for n in range(HOLD_DIALS_PER_TRY)}),  # more than a look dials
], ids=["a-second-answer", "one-silent", "more-than-one-look-dials"])
def test_a_lone_answer_is_held_only_when_every_other_declared_source_is_unreachable(peers):
    """A liar's own unreachable peers (sybils) do not make it the swarm of one while an honest peer answers, and a
    peer that was reached but is slow may be an honest one at the swarm's state."""
    checks = validator(**peers)
    looks(checks, 10)
    assert checks.held == {}


def test_made_up_sources_do_not_keep_the_holder_from_two_honest_peers():
    """A liar may declare peers of its own invention as state sources (hivemind's declarations are not
    signed). Picked among a dozen of them, the two honest peers were seldom both asked in one look, and
    their epochs went unheld and unchecked; now a look asks the peers that answered before first and those
    found unreachable last."""
    sybils = {f"sybil{n}": UNREACHABLE for n in range(2 * HOLD_DIALS_PER_TRY)}
    checks = validator(amina=(7, OLD), rahim=(7, OLD), **sybils)
    looks(checks, 3)  # each look dials HOLD_DIALS_PER_TRY at most and puts those found unreachable last
    assert list(checks.held) == [7]
    checks.checkpointer.asked.clear()
    checks.checkpointer.states.update(amina=[(8, NEW)], rahim=[(8, NEW)])
    looks(checks, 1, swarm_epoch=8)
    assert sorted(checks.held) == [7, 8]
    assert sorted(checks.checkpointer.asked[:2]) == ["amina", "rahim"], "the peers that answered before are asked first"
    assert len(checks.checkpointer.asked) <= HOLD_DIALS_PER_TRY



def test_a_source_that_sent_no_state_in_time_is_asked_last():
    """A peer that answers slowly on purpose holds a download up for its whole bound, minutes at sahajBERT's size
    (the next test): asked first in every look, a liar would keep the holder from the honest peers' states."""
    checks = validator(slow=None, amina=(7, OLD), rahim=(7, OLD))
    looks(checks, 1)  # nothing known yet: every source is asked
    assert sorted(checks.checkpointer.asked) == ["amina", "rahim", "slow"] and list(checks.held) == [7]
    checks.checkpointer.asked.clear()
    looks(checks, 10)
    assert checks.checkpointer.asked and "slow" not in checks.checkpointer.asked


def test_a_state_of_sahajberts_size_from_a_home_uplink_fits_the_holders_bound_and_silence_does_not():
    """The large preset's state from a volunteer at 10 Mbit/s (sahajBERT's volunteers trained from home and
    from notebooks) arrives within the bound; a source silent for HOLD_DOWNLOAD_TIMEOUT_S is given up."""
    config = RunConfig()
    assert config.model.preset == "large"
    checks = validator(amina=(7, OLD))
    checks.checkpointer.parameter_count = sum(
        parameter.numel() for parameter in model_build(config, 32000, pad_token_id=0).parameters())
    assert 17e6 < checks.checkpointer.parameter_count < 19e6, "sahajBERT's ~18M"
    parameter_bytes = checks.checkpointer.parameter_count * 4  # the holder asks for the parameters only, in fp32
    assert checks._download_timeout() > parameter_bytes / (10e6 / 8) + HOLD_DOWNLOAD_TIMEOUT_S
    looks(checks, 1)
    assert checks.checkpointer.silences == [HOLD_DOWNLOAD_TIMEOUT_S]


@pytest.mark.parametrize("states", [
    dict(amina=(7, OLD), rahim=(7, one_lamb_step(OLD, rate=0.06))),  # two peers that stepped apart (a failed round)
    dict(amina=(12, OLD), rahim=(12, OLD)),  # past the swarm's epoch 7 (+3 of lag, +1: state_epoch_trusted)
], ids=["stepped-apart", "past-the-swarm"])
def test_a_state_the_peers_disagree_on_or_past_the_swarm_is_not_held(states):
    checks = validator(**states)
    looks(checks, 10)
    assert checks.held == {}


def test_an_epoch_holds_every_state_two_peers_served_alike_and_its_checks_wait_for_the_next():
    """Both peers serve epoch 8 with epoch 7's parameters while their gradient round runs, then step:
    the checker compares each step with both (the parameters a step claims say which it was computed at)."""
    checks = validator(amina=[(7, OLD), (8, OLD), (8, NEW)], rahim=[(7, OLD), (8, OLD), (8, OLD), (8, NEW)])
    looks(checks, 10, swarm_epoch=8)
    assert len(checks.held[8]) == 2 and state_among(OLD, checks.held[8]) and state_among(NEW, checks.held[8])
    assert len(checks.held[7]) == 1, "one state served twice is held once"
    assert checks.disagreements == {}, "serving the previous epoch's state for a moment is no disagreement"
    assert epochs_checkable(set(checks.held)) == {6, 7}, "epoch 8 may gain a state yet: its checks wait"


def test_a_peer_that_serves_its_own_parameters_is_outvoted_and_counted_whatever_priority_it_declares():
    """The liar of tests/security/liar_agent.py ("capture") declares a high state-sharing priority, so
    hivemind's own download would always ask it first; the validator picks peers at random."""
    own = [parameter * 1.05 for parameter in NEW]
    checks = validator(liar=(7, own), amina=(7, NEW), rahim=(7, NEW))
    looks(checks, 10)
    assert len(checks.held[7]) == 1 and state_among(NEW, checks.held[7])
    assert checks.disagreements == {}, "counted once the swarm has left the epoch"
    checks.checkpointer.states = {"liar": [(8, own)], "amina": [(8, OLD)], "rahim": [(8, OLD)]}
    looks(checks, 10, swarm_epoch=8)
    assert len(checks.held[8]) == 1 and state_among(OLD, checks.held[8])
    assert checks.disagreements == {"liar": 1}, "the liar's last state of epoch 7, once"


@pytest.mark.django_db
def test_the_states_a_peer_served_unlike_the_swarms_are_counted_on_its_session_for_the_organizers():
    """The flagged-credit page lists them (runs.credit.verification.disagreeing_sessions): an honest peer that
    missed a round serves such a state now and then, the capturer nearly every time. A tally waits until
    the monitor names the peer's session (from the peer id its signed records name), and is added once."""
    from runs.credit.verification import disagreeing_sessions
    from runs.models import TrainingSession
    from tests.factories import RunFactory
    from tests.runs.epochs import session_for

    run = RunFactory()
    sessions = {name: session_for(run, username=name) for name in ("mallory", "amina", "rahim")}
    own = [parameter * 1.05 for parameter in NEW]
    checks = validator(mallory=(7, own), amina=(7, NEW), rahim=(7, NEW))
    named: dict[str, int] = {}
    checks.session_of_peer = named.get
    looks(checks, 10)
    checks.checkpointer.states = {"mallory": [(8, own)], "amina": [(8, OLD)], "rahim": [(8, OLD)]}
    looks(checks, 10, swarm_epoch=8)
    checks.tallies_save()
    assert disagreeing_sessions(run=run) == [], "no session named the peers yet"

    unsaved = dict(checks._tallies_unsaved)
    assert unsaved["mallory"] == [1, 1], "its last state of epoch 7, judged once the swarm left it"
    named.update(mallory=sessions["mallory"].pk, amina=sessions["amina"].pk)
    checks.tallies_save()
    checks.tallies_save()
    tallies = {name: (served, disagreed) for name, served, disagreed in TrainingSession.objects.values_list(
        "user__username", "states_served", "states_disagreed")}
    assert tallies["mallory"] == (1, 1), "added once"
    assert tallies["amina"] == (unsaved.get("amina", [0, 0])[0], 0)
    assert tallies["rahim"] == (0, 0) and checks._tallies_unsaved.get("rahim") == unsaved.get("rahim"), \
        "rahim's tally waits for a session named his"
    assert [session.user.username for session in disagreeing_sessions(run=run)] == ["mallory"]


def test_a_new_epoch_is_held_when_the_peers_step_into_it_one_after_the_other():
    checks = validator(amina=[(7, OLD), (8, NEW)], rahim=[(7, OLD), (7, OLD), (8, NEW)])
    looks(checks, 10, swarm_epoch=8)
    assert sorted(checks.held) == [7, 8]
    assert [parameters_apart(state, NEW) for state in checks.held[8]] == [0.0]
    assert epochs_checkable(set(checks.held)) == {6, 7}


def test_a_lone_peer_has_its_state_held():
    checks = validator(amina=(7, OLD))
    looks(checks, 1)
    assert list(checks.held) == [7] and len(checks.held[7]) == 1


def test_parameters_apart_measures_the_relative_distance():
    parameters = model_parameters(1)
    assert parameters_apart(parameters, parameters) == 0.0
    assert parameters_apart([parameter.half().float() for parameter in parameters], parameters) < STATE_AGREEMENT / 2
    assert 0.0015 < parameters_apart(one_lamb_step(parameters, rate=0.00176), parameters) < 0.002


def test_what_peers_served_in_epochs_no_two_agreed_on_is_not_kept_for_ever():
    checks = validator(amina=[(epoch, OLD) for epoch in range(40)], rahim=None)
    looks(checks, 80, swarm_epoch=40)
    assert checks.held == {}
    assert len(checks._served) <= HELD_EPOCHS


class Parameters(torch.nn.Module):
    """A model with ``model_parameters``' shapes, standing in for the run's ALBERT in the sketches."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(value) for value in model_parameters(0)])


def sketch_of(parameters: list[torch.Tensor], epoch: int) -> str:
    from peer_agent.spotcheck import parameters_fingerprint

    model = Parameters()
    with torch.no_grad():
        for param, value in zip(model.parameters(), parameters, strict=True):
            param.copy_(value)
    return parameters_fingerprint(model, "run", epoch)


@pytest.fixture
def corroboration(db, monkeypatch):
    """A validator of a real run whose holder saw one download of epoch 7 from each of ``served``'s
    states, with its check recorded instead of recomputed, and the commitments of the run's sessions."""
    from runs.models import StepCommitment
    from tests.factories import RunFactory
    from tests.runs.epochs import session_for

    run = RunFactory()
    checks = Validator(run_pk=run.pk, run_id="run", slug="run", dht=None, checkpointer=Peers())
    checked = []
    monkeypatch.setattr(checks, "_check", lambda run, config, commitment, states: checked.append(
        (commitment.session.user.username, [parameters_apart(state, NEW) == 0.0 for state in states])))
    sessions = {name: session_for(run, name) for name in ("amina", "rahim", "liar")}

    def commit(name: str, parameters: list[torch.Tensor], epoch: int = 7) -> None:
        StepCommitment.objects.create(session=sessions[name], epoch=epoch, micro_batch_size=8, shuffle_buffer=1000,
                                      samples=8, steps=[[0, 8, "AA==", sketch_of(parameters, epoch)]])

    return checks, commit, checked


OWN = [parameter * 1.05 for parameter in NEW]


def test_a_state_one_peer_served_is_held_once_two_volunteers_claim_their_steps_at_it(corroboration):
    """On a loaded host the holder often gets one peer's state of an epoch before the swarm moves on
    (bench/liar.py lost most honest epochs as "no state held"): the steps two volunteers committed
    to are the second witness that it is the swarm's state."""
    checks, commit, checked = corroboration
    checks._served_keep(7, NEW)
    checks._served_keep(8, OWN)  # a newer epoch seen: epoch 7's checks may go
    commit("amina", NEW)
    assert checks.check_once() == 0 and checked == [], "amina's alone is one witness: it waits for a second"
    commit("rahim", NEW)
    assert checks.check_once() == 2
    assert sorted(checked) == [("amina", [True]), ("rahim", [True])]


def test_a_peer_that_serves_and_claims_its_own_parameters_is_never_held(corroboration):
    """The capture liar of tests/security/liar_agent.py serves its own parameters; the volunteers
    compute at the swarm's. One volunteer's claims are no witness, however many sessions it opens."""
    from runs.models import StepCommitment

    checks, commit, checked = corroboration
    checks._served_keep(7, OWN)
    checks._served_keep(7, NEW)
    checks._served_keep(8, NEW)
    commit("liar", OWN)
    commit("amina", NEW)
    commit("rahim", NEW)
    checks.check_once()
    assert sorted(checked) == [("amina", [True]), ("rahim", [True])], "the liar's own state is no reference"
    liar = StepCommitment.objects.get(session__user__username="liar")
    assert liar.outcome == "pending", "it waits for a second witness while the epoch is recent"
    for newer in range(9, 12):
        checks._served_keep(newer, NEW)
    checked.clear()
    checks.check_once()  # amina's and rahim's again too: the test's check records nothing
    assert ("liar", [True]) in checked, "then it is checked against the swarm's state alone (and diverges)"


def test_an_epochs_steps_are_checked_against_its_state_held_under_the_next_epoch(corroboration):
    """Peers serve an epoch's parameters under the next epoch until their optimizer step: a holder that
    looked only at those moments holds epoch 7's parameters under epoch 8 alone."""
    checks, commit, checked = corroboration
    checks.held = {8: [NEW], 9: [OWN]}
    commit("amina", NEW)
    assert checks.check_once() == 1
    assert checked == [("amina", [True])]


def session_of(username: str):
    from runs.models import TrainingSession

    return TrainingSession.objects.get(user__username=username)


def rahim_reports(epoch: int) -> None:
    """A report of rahim's session for ``epoch``: it trained there too."""
    from tests.runs.epochs import report

    report(session_of("rahim"), 8, epoch, checked=False)


def test_a_state_the_holder_missed_is_fetched_from_a_peer_that_kept_it_once_two_volunteers_claim_it(corroboration):
    """On a loaded machine the holder looked before both peers stepped into epoch 7 and again after they
    had left it: it never saw the state epoch 7's steps were computed at, and both volunteers' steps
    earned nothing (a demo beside CI lost 3.4% of its epochs so). Each agent keeps the states of its last
    steps; once two volunteers claim the same, the holder asks a peer for it by its sketch."""
    checks, commit, checked = corroboration
    peers = checks.checkpointer
    checks._sources = ["amina", "rahim"]
    peers.kept = {peer: {(7, sketch_of(NEW, 7)): NEW} for peer in checks._sources}
    checks._served_keep(6, OLD)
    checks._served_keep(8, OWN)  # the holder saw epochs 6 and 8, not 7
    rahim_reports(7)
    commit("amina", NEW)
    assert checks.claimed_fetch() == 0 and peers.asked_kept == [], "one of two volunteers' claims is no reason to ask"
    assert checks.check_once() == 0, "amina's steps claim a state no peer served yet: they wait"
    commit("rahim", NEW)
    assert checks.claimed_fetch() == 1 and len(peers.asked_kept) == 1, "asked once, from one of the peers"
    assert checks.claimed_fetch() == 0 and len(peers.asked_kept) == 1, "and not again"
    assert checks.check_once() == 2
    assert sorted(checked) == [("amina", [True]), ("rahim", [True])]


def test_a_kept_state_is_not_asked_of_a_peer_that_is_gone(corroboration):
    """A killed agent stays declared as a state source for a while; its answer is not a state (the rehearsal at
    sahajBERT's size crashed the fetch on it, docs/benchmarks.md section 28)."""
    checks, _, _ = corroboration
    checks._sources = ["gone"]
    checks.checkpointer.states["gone"] = [UNREACHABLE]
    assert checks._kept_fetch(7, sketch_of(NEW, 7)) is None
    assert checks.checkpointer.asked_kept == [("gone", 7)]


def test_a_peer_serving_a_kept_state_unlike_the_sketch_asked_for_is_counted_and_not_believed(corroboration):
    checks, commit, checked = corroboration
    peers = checks.checkpointer
    checks._sources = ["liar"]
    peers.kept = {"liar": {(7, sketch_of(NEW, 7)): OWN}}
    checks._served_keep(8, OLD)
    commit("amina", NEW)
    commit("rahim", NEW)
    assert checks.claimed_fetch() == 0
    assert checks.disagreements == {"liar": 1}
    assert checks.served.get(7) is None
    assert checks.check_once() == 0, "still waiting, within its epochs"


def swarm_reading(epoch: int) -> None:
    """The monitor's reading of the corroboration run's swarm at ``epoch``."""
    from runs.models import Run, RunSample

    RunSample.objects.create(run=Run.objects.get(), global_epoch=epoch, samples_per_second=10.0, alive_peers=1,
                             client_peers=0, samples_accumulated=0)


def test_a_volunteer_alone_in_an_epoch_the_holder_missed_has_it_fetched_and_checked_once_the_swarm_is_past(
        corroboration):
    """CI: a second agent, still joining, held a look up for 15 s while the first trained through three
    epochs alone; no two volunteers claimed its epoch 3 and it earned nothing. With no other volunteer's
    report, commitment or record of the epoch, the one volunteer's sessions were the swarm."""
    checks, commit, checked = corroboration
    peers = checks.checkpointer
    checks._sources = ["amina", "rahim"]
    peers.kept = {"amina": {(7, sketch_of(NEW, 7)): NEW}}
    checks._served_keep(6, OLD)
    checks._served_keep(11, OWN)  # the holder saw epochs 6 and 11, not 7
    commit("amina", NEW)
    swarm_reading(8)
    assert checks.claimed_fetch() == 1 and ("amina", 7) in peers.asked_kept, "asked at once: peers keep a few epochs"
    assert checks.check_once() == 0 and checked == [], "it waits until the swarm is past the epoch"
    swarm_reading(10)
    assert checks.check_once() == 1 and checked == [("amina", [True])]


def test_a_volunteer_is_not_alone_in_an_epoch_another_reported(corroboration):
    """A liar's own parameters, claimed by its steps alone, are no reference while another volunteer
    trained in the epoch: its report is evidence enough, whether or not it committed yet."""
    checks, commit, checked = corroboration
    peers = checks.checkpointer
    checks._sources = ["liar", "rahim"]
    peers.kept = {"liar": {(7, sketch_of(OWN, 7)): OWN}}
    checks._served_keep(7, OWN)
    checks._served_keep(11, NEW)
    rahim_reports(7)
    commit("liar", OWN)
    swarm_reading(12)
    assert checks.claimed_fetch() == 0 and peers.asked_kept == []
    checks.check_once()
    assert checked == [], "no state held or corroborated for its epoch: nothing to check it against"


def test_a_volunteer_claiming_many_states_in_one_epoch_is_not_fetched_for(corroboration):
    """A liar alone whose steps each name another state would keep the holder dialing, and the holder
    would miss the honest peers' epochs."""
    from runs.models import StepCommitment

    checks, commit, checked = corroboration
    checks._sources = ["liar"]
    checks._served_keep(6, OLD)
    checks._served_keep(11, OWN)
    made_up = [[index * 8, 8, "AA==", sketch_of([parameter * (1 + index / 10) for parameter in NEW], 7)]
               for index in range(6)]
    StepCommitment.objects.create(session=session_of("liar"), epoch=7, micro_batch_size=8,
                                  shuffle_buffer=1000, samples=48, steps=made_up)
    assert checks.claimed_fetch() == 0 and checks.checkpointer.asked_kept == []
