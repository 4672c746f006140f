"""The validator: recomputes steps that sessions committed to, and records whether they match.

Each run's validator (started by the coordinator next to its checkpointer, whose state averager it
shares) downloads the collaboration's parameters from peers it picks at random whenever the swarm
enters a new epoch, holds an epoch's state once two distinct peers served the same parameters for it,
and keeps the last few (as many as the ingest accepts commitments for, runs/ingest/reports.py). For every
commitment of a held epoch (``runs.models.StepCommitment``, which arrives when a session has closed
the epoch) it compares the parameters each step says it was computed at with the held state's
(sketches: no recomputation), then draws ``verification.checks_per_epoch`` of the steps claimed at
the held state, each with a chance in proportion to its samples, with the operating system's
randomness and only now, after the commitment, so a peer cannot know in advance which steps will be
recomputed. It rebuilds their micro-batches from the run's data and the session's public seed
(``peer_agent.spotcheck.BatchReplay``), recomputes their gradients at the held parameters and
compares fingerprints; ``runs.credit.verification`` turns the figures into credit decisions. A step
computed at other parameters (a peer whose averaging round failed steps alone and leaves the swarm's
parameters for an epoch or more) cannot be checked, and its epoch earns nothing, drawn or not.
Commitments of epochs the validator did not hold are marked unchecked, and earn nothing either.
docs/trust.md says what this proves and what it does not.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import close_old_connections
from django.db.models import F, Min, Q
from django.utils import timezone
from hivemind.p2p import PeerID
from hivemind.utils.timed_storage import ValueWithExpiration

from peer_agent.averaging import UNREACHABLE
from peer_agent.metrics import dht_result
from peer_agent.protocol import RunConfig
from peer_agent.spotcheck import fingerprint_distance
from runs.credit import verification
from runs.ingest.reports import COMMITMENT_WINDOW_EPOCHS
from runs.models import ContributionEvent, Run, RunSample, SessionEpoch, StepCommitment, TrainingSession
from runs.swarm.checkpoints import Checkpointer, state_epoch_trusted
from runs.swarm.recompute import (
    STATE_AGREEMENT,
    STATE_EXACT,
    Recomputer,
    spot_check_task,
    state_name,
    state_sketch,
    state_write,
    states_prune,
)

if TYPE_CHECKING:
    from hivemind.dht import DHT

logger = logging.getLogger(__name__)

CHECK_PERIOD_S = 2.0  # how often the validator looks for new commitments
HOLD_PERIOD_S = 0.5  # how often it looks for a new state, to hold each epoch's state as the swarm enters it
# One download's bounds: a source silent this long is given up; a whole state may take as long as it needs at
# HOLD_MIN_RATE_BYTES_S, and this much more (Validator._download_timeout). A bound of 10 s for the whole state let
# nothing through at sahajBERT's size from volunteers' 10-20 Mbit/s uplinks: no state was held, and no commitment
# was checked (docs/benchmarks.md section 28).
HOLD_DOWNLOAD_TIMEOUT_S = 10.0
HOLD_MIN_RATE_BYTES_S = 1e6  # 8 Mbit/s; a source that sent no state within the bound is asked last (DIAL_MEMORY_S)
# Downloads in one look at most: the first peer's state tells whether the swarm moved on; the others
# confirm a new epoch's state. Every download is served by a training peer.
HOLD_SOURCES_PER_TRY = 3
# Dials in one look at most, answered or not. Any peer of the swarm may declare state sources in the DHT
# (hivemind's ``all_averagers`` entries are not signed): a liar's made-up peers (sybils) cannot be reached,
# and picked among them the honest peers were asked too seldom for two to agree on an epoch. A look asks
# the sources that served a state in the last DIAL_MEMORY_S first, and those that could not be reached or sent
# none in time last (a slow liar costs the holder one download bound per DIAL_MEMORY_S, not one per look), and
# dials on until HOLD_SOURCES_PER_TRY peers answered.
HOLD_DIALS_PER_TRY = 12
DIAL_MEMORY_S = 60.0
READING_LAG_EPOCHS = 3  # how far the swarm may be past the monitor's last reading when a state is served
# States of one epoch kept at most: the one the peers compute at, the previous epoch's served for a moment
# under the new epoch, one averaged in the background.
STATES_PER_EPOCH = 4
# Peers whose judged states wait for a session to be named theirs: a peer that never publishes a record
# is named by none, and its tallies are dropped oldest first.
TALLIES_UNSAVED_MAX = 1000
# Epochs whose parameters are kept: every epoch the ingest still takes commitments for, and two more for
# a monitor reading that lags the swarm. Each state is a copy of the parameters (72 MB at sahajBERT's size).
HELD_EPOCHS = COMMITMENT_WINDOW_EPOCHS + 2
# How far behind the epoch a lone peer serves the other declared sources must be for it to be the epoch's only
# peer (Validator._hold): one behind is every peer's moment of stepping into a new epoch after another; two
# behind is a peer still joining (it declares before it has loaded the swarm's state) or one that fell out.
ABSENT_BEHIND_EPOCHS = 2
HOLD_UNTICKED_S = 30.0  # six of the coordinator's heartbeats (5 s) missed: it no longer holds the duties

# Two downloads of one state: peers hold the same bytes after an all-reduce and an optimizer step on them,
# and the wire's fp16 rounds them alike. States further apart than this are kept apart even when within
# STATE_AGREEMENT: late in a run one step can move parameters by less than 1e-3, and a validator that
# kept only the first of two such states recomputed honest steps at the wrong one (a demo's two agents
# were suspended at epoch 567).
STATE_SAME = 1e-6
# How long a commitment whose steps claim a state only one peer served waits for a second volunteer's
# commitment to claim it too: commitments come when each session closes the epoch, seconds apart.
CORROBORATION_WAIT_EPOCHS = 3


def parameters_apart(first: list, second: list) -> float:
    """The distance between two copies of a model's parameters, relative to the second's size (0 for the same)."""
    difference = sum(float((a.double() - b.double()).pow(2).sum()) for a, b in zip(first, second, strict=True))
    size = sum(float(b.double().pow(2).sum()) for b in second)
    return (difference / max(size, 1e-24)) ** 0.5


class Validator:
    """Spot-checks one run's sessions; the coordinator calls :meth:`tick` on every heartbeat. The work
    happens in two threads of its own: one holds the swarm's state of each epoch as the swarm enters it
    (it looks every ``hold_period``), one checks the commitments of held epochs. Holding never
    waits behind checks: an epoch whose state is missed earns nothing for anyone (runs/credit/verification.py),
    and a demo's epochs last a few seconds.

    The held state is the swarm's, not one peer's: hivemind downloads from the peer that declares the
    highest priority, a number the peer sets, so a peer could have its own parameters held and the
    others checked against them. The validator asks peers of its own choosing, at random, by name,
    and holds an epoch's parameters only when two distinct peers served the same; a peer that serves
    parameters other than those held for its epoch is logged and counted in ``disagreements``, and on
    its session (``TrainingSession.states_disagreed``, of ``states_served``) for the run's organizers,
    once ``session_of_peer`` names it (the monitor's, from the peer id its signed records name)."""

    def __init__(self, *, run_pk: int, run_id: str, slug: str, dht: DHT, checkpointer: Checkpointer,
                 check_period: float = CHECK_PERIOD_S, hold_period: float = HOLD_PERIOD_S,
                 session_of_peer: Callable[[str], int | None] = lambda peer: None) -> None:
        self.run_pk, self.run_id, self.slug, self.dht = run_pk, run_id, slug, dht
        self.checkpointer, self.check_period, self.hold_period = checkpointer, check_period, hold_period
        self.session_of_peer = session_of_peer
        # epoch -> the states two distinct peers served alike in that epoch (most often one; see _hold)
        self.held: dict[int, list[list]] = {}
        self.disagreements: dict[str, int] = {}  # peer -> states it served unlike those held for their epoch
        # peer -> [states judged, of which disagreeing] not yet added to its session's row
        self._tallies_unsaved: dict[str, list[int]] = {}
        self._served: dict[int, dict[str, list]] = {}  # epoch not held yet -> peer -> the parameters it served
        # epoch -> the distinct states any one peer served under it: held once two volunteers' steps claim one
        self.served: dict[int, list[list]] = {}
        self._sketches: dict[tuple[int, int], tuple[list, str]] = {}  # (epoch, id of a state) -> it, its sketch
        self._asked: dict[tuple[int, str], None] = {}  # (epoch, sketch) of kept states asked for, oldest first
        self._sources: list[str] = []  # the peers that share the run's state, read from the DHT on each tick
        self._dialed: dict[str, tuple[float, bool]] = {}  # source -> when it was last dialed (monotonic), reached
        self._hold_spent = 0.0  # seconds the last try at holding a state took
        self._recomputer: Recomputer | None = None  # built at the first check made here
        self._names: dict[tuple[int, int], tuple[list, str]] = {}  # (epoch, id of a state) -> it, its stored name
        self._threads: dict[str, threading.Thread] = {}
        self._next_check = 0.0
        self._ticked = time.monotonic()
        self._closed = False

    def tick(self) -> None:
        if self._closed or not self.checkpointer.ready:
            return
        self._ticked = time.monotonic()
        self._sources_read()
        # The holder keeps its own pace, not the coordinator's heartbeat (5 s): a demo's epochs are shorter.
        holder = self._threads.get("hold")
        if holder is None or not holder.is_alive():
            self._threads["hold"] = threading.Thread(target=self._holding, daemon=True, name=f"validator hold {self.slug}")
            self._threads["hold"].start()
        checker = self._threads.get("check")
        if (checker is None or not checker.is_alive()) and time.monotonic() >= self._next_check:
            self._threads["check"] = threading.Thread(target=self._cycle, daemon=True, name=f"validator {self.slug}")
            self._threads["check"].start()

    def shutdown(self, timeout: float = 5.0) -> None:
        # A check in progress ends within a step's recomputation; a download in progress is left to
        # its daemon thread, so the coordinator still stops within seconds (docs/deploy.md).
        self._closed = True
        for thread in self._threads.values():
            thread.join(timeout)
        if settings.SPOT_CHECK_WORKERS and self.held:
            try:
                # A run that ends leaves no one to prune its states (72 MB each at sahajBERT's size); a holder of
                # the duties after this one writes again what its checks need (_published).
                self._states_prune(oldest_held=sys.maxsize)
            except Exception:  # the database or the storage may be the reason for the stop
                logger.warning("run %s: could not delete the states kept for validator workers", self.slug, exc_info=True)

    def _cycle(self) -> None:
        try:
            close_old_connections()
            self.check_once()
        except Exception:  # the coordinator keeps serving the run; the next cycle may succeed
            logger.exception("run %s: spot checks failed this cycle", self.slug)
        finally:
            close_old_connections()
            self._next_check = time.monotonic() + self.check_period

    def _holding(self) -> None:
        # Holding goes on while the coordinator ticks: a backbone peer that handed the duties over, or
        # one whose process lost its heartbeat, downloads nothing more; the next tick starts it again.
        while not self._closed and time.monotonic() - self._ticked < HOLD_UNTICKED_S:
            try:
                close_old_connections()
                self.hold_once()
                self.claimed_fetch()
                self.tallies_save()
            except Run.DoesNotExist:
                logger.info("run %s: the run is gone; spot checks stop holding its state", self.slug)
                return
            except Exception:  # the next try may succeed
                logger.exception("run %s: spot checks could not hold the swarm's state this time", self.slug)
            finally:
                close_old_connections()
            # As long as the last try took: a large model's state takes seconds to download, and every
            # download is served by a training peer.
            time.sleep(max(self.hold_period, self._hold_spent))

    def _spot_checks_on(self) -> tuple[Run, RunConfig] | None:
        run = Run.objects.get(pk=self.run_pk)
        config = run.configuration
        return (run, config) if config.verification.spot_checks else None

    def _download_timeout(self) -> float:
        """The bound on one source's parameters (fp32, as peer_agent.averaging.EpochStateServing sends the current
        and the kept ones): 72 MB at sahajBERT's size."""
        return HOLD_DOWNLOAD_TIMEOUT_S + self.checkpointer.parameter_count * 4 / HOLD_MIN_RATE_BYTES_S

    def _sources_read(self) -> None:
        """The peers that share the run's state: those declared under hivemind's ``{prefix}.all_averagers``
        in the DHT, whatever priority they declare. Read on the coordinator's thread, which makes every
        DHT call of the coordinator: hivemind's DHT takes calls through one pipe."""
        try:
            found = dht_result(self.dht, self.dht.get(f"{self.run_id}_state_averager.all_averagers", latest=True,
                                                      return_future=True))
        except Exception:  # the holder keeps the last list; the next tick reads again
            logger.warning("run %s: spot checks could not read which peers share the state", self.slug, exc_info=True)
            return
        declared = found.value if found is not None and isinstance(found.value, dict) else {}
        self._sources = [PeerID(peer).to_base58() for peer, entry in declared.items()
                         if isinstance(entry, ValueWithExpiration) and isinstance(entry.value, (int, float))]

    def hold_once(self) -> None:
        """Look at the states the swarm serves and hold a new epoch's once two distinct peers agree on it.
        Peers step into an epoch at their own moments and the monitor's reading is up to a heartbeat old,
        so the holder does not wait for a reading to move: it looks every ``hold_period`` (longer for a
        large state), and an epoch whose state is missed earns nothing."""
        if self._spot_checks_on() is None:
            return
        swarm_epoch = self._swarm_reading()
        if swarm_epoch is None:
            return
        started = time.monotonic()
        # The reading may be a few heartbeats behind the peers on a loaded host (three epochs were seen).
        self._hold(swarm_epoch + READING_LAG_EPOCHS, reading=swarm_epoch)
        self._hold_spent = time.monotonic() - started

    def check_once(self) -> int:
        """Check the commitments of epochs the swarm has left, against the states held for them; returns
        how many were checked. A commitment whose steps claim a state that one peer served and no second
        volunteer's commitment claims yet waits a little (``CORROBORATION_WAIT_EPOCHS``)."""
        spot_checks = self._spot_checks_on()
        if spot_checks is None:
            return 0
        run, config = spot_checks
        verification.flags_settle(run=run)
        held, served = dict(self.held), dict(self.served)  # the holder adds and drops states meanwhile
        seen = set(held) | set(served)
        if not seen:
            return 0
        # An epoch's steps are checked against its neighbours' states too (below): the window reaches one further.
        verification.commitments_uncheckable(run=run, before_epoch=min(seen) - 1)
        if settings.SPOT_CHECK_WORKERS:
            self._states_prune(min(seen))
        newest, checked = max(seen), 0
        for commitment in verification.commitments_to_check(run=run, epochs=epochs_checkable(seen)):
            if self._closed:
                break
            # The states of the epoch and of its neighbours: peers serve the previous epoch's parameters
            # under a new epoch for a moment, so a holder that looks at that moment holds an epoch's
            # parameters under the next one. A step that recomputes at any state the swarm served was
            # computed, and at the swarm's parameters.
            epoch, near = commitment.epoch, (commitment.epoch - 1, commitment.epoch, commitment.epoch + 1)
            states, waiting, unsettled = self._references(
                run, commitment, held=[state for each in near for state in held.get(each, [])],
                served=[state for each in near for state in served.get(each, [])])
            if not states or (waiting and (epoch >= newest - CORROBORATION_WAIT_EPOCHS or unsettled)):
                continue  # unchecked once the epoch leaves the window, if no state is ever held for it
            self._check(run, config, commitment, states)
            checked += 1
        return checked

    def _references(self, run: Run, commitment: StepCommitment, *, held: list[list],
                    served: list[list]) -> tuple[list[list], bool, bool]:
        """The states ``commitment``'s steps are checked against: those two distinct peers served alike
        (``held``), and those one peer served (under the epoch, or a neighbour: under the next before its optimizer
        step) that the steps of two distinct volunteers' commitments for the epoch claim to be computed
        at. Those volunteers ran their steps there, so it is the swarm's state, not one peer's: a peer
        that serves parameters of its own, or whose averaging round failed, is the only one to claim
        them. A volunteer alone in the epoch is the swarm: its claim alone corroborates (:meth:`_alone_in`).
        Returns the states; whether a step of ``commitment`` claims a state that is neither (a second
        volunteer's commitment may still come, or the holder may still fetch it from a peer that kept it:
        :meth:`claimed_fetch`); and whether the volunteer is alone in an epoch the swarm is not past yet."""
        epoch = commitment.epoch
        def alike(sketch: str, others: list[str]) -> bool:
            return any(fingerprint_distance(sketch, other) <= STATE_AGREEMENT for other in others)

        held_sketches = [self._sketch(epoch, state) for state in held]
        candidates: list[tuple[list, str]] = []  # served states other than the held ones and each other
        for state in served:
            sketch = self._sketch(epoch, state)
            if not any(fingerprint_distance(sketch, other) <= STATE_SAME
                       for other in held_sketches + [other for _, other in candidates]):
                candidates.append((state, sketch))
        claims: dict[int, set[str]] = {}  # volunteer -> the parameters their steps of the epoch claim
        for user, steps in StepCommitment.objects.filter(session__run=run, epoch=epoch).values_list(
                "session__user_id", "steps"):
            claims.setdefault(user, set()).update(step[3] for step in steps if len(step) > 3)

        # A volunteer alone in the epoch is its own second witness once the swarm is past it (_alone_in); till
        # then it waits, however old the epoch, while the window holds it.
        alone = len(claims) == 1 and self._alone_in(epoch, next(iter(claims)))
        settled = alone and self._swarm_past(epoch)
        witnesses = 1 if settled else 2
        corroborated = [(state, sketch) for state, sketch in candidates
                        if sum(alike(sketch, list(user_claims)) for user_claims in claims.values()) >= witnesses]
        sketches = held_sketches + [sketch for _, sketch in corroborated]
        own = {step[3] for step in commitment.steps if len(step) > 3}
        waiting = any(not alike(claim, sketches) for claim in own)
        return held + [state for state, _ in corroborated], waiting, alone and not settled

    def _sketch(self, epoch: int, state: list) -> str:
        """The parameters' sketch of ``state`` for ``epoch``'s cells, computed once per state. It reads the
        state alone, not the validator's model: the holder's thread asks too (:meth:`claimed_fetch`)."""
        key = (epoch, id(state))
        cached = self._sketches.get(key)
        if cached is None or cached[0] is not state:  # an id is reused once its state is dropped
            cached = self._sketches[key] = (state, state_sketch(self.run_id, epoch, state))
            while len(self._sketches) > 2 * HELD_EPOCHS * STATES_PER_EPOCH:
                self._sketches.pop(next(iter(self._sketches)), None)
        return cached[1]

    def _hold(self, swarm_epoch: int, reading: int | None = None) -> None:
        """Download from peers picked at random (``HOLD_SOURCES_PER_TRY`` at most) and hold each state of
        the newest epoch that two distinct peers serve alike, each peer's latest download counting. One
        download is not enough, nor two from one peer: a peer whose averaging round failed holds
        parameters of its own, and a peer may serve whatever it likes. And an epoch may have more than one
        such state: a peer counts its new epoch while its gradient round still runs, before its optimizer
        step, so for a second or so every peer serves the old parameters under the new epoch; and the
        parameters averaged in the background reach the served state before the model computes at them.
        The checker then compares each step with every state held for its epoch (the parameters each
        step claims say which), once a later epoch is held. Held, a wrong state would fail every honest
        check of its epoch; not held, the epoch's commitments are unchecked (docs/trust.md). A swarm of
        one peer has no second to agree with: its states are held as it serves them. So is the swarm of one
        that a killed peer leaves behind: hivemind keeps the killed peer declared as a source for its declare
        period (30 s), but no stream to it can be opened, while a live peer, however slow or hostile, is
        reached (``UNREACHABLE``). Its survivor's state is held once a look asked every declared source and
        every other was unreachable; without that, a survivor's epochs in those 30 s earned nothing (issue 29:
        an honest agent lost an epoch while its partner restarted, on a loaded machine). Likewise a peer that
        is joining declares itself before it has the swarm's state and serves an epoch far behind: the peer
        training alone until it arrives is that epoch's only peer (CI33: the first agent's epoch 3 earned
        nothing while the second joined, beside a demo), if the monitor's ``reading`` has reached the epoch:
        a liar serving epochs ahead of the honest peers is alone in none. A lone state held this way that is
        not the swarm's costs only its epoch's checks (a step that claims other parameters is not failed for
        it), as a missed state does; one peer a step behind the other, every epoch's moment, keeps the rule
        of two."""
        now = time.monotonic()
        self._dialed = {peer: (at, reached) for peer, (at, reached) in self._dialed.items()
                        if now - at < DIAL_MEMORY_S and peer in self._sources}
        order = {peer: 1 - reached for peer, (_, reached) in self._dialed.items()}  # reached 0, not dialed 0.5, not 1
        sources = sorted(random.sample(self._sources, len(self._sources)), key=lambda peer: order.get(peer, 0.5))
        newest = max(self.held, default=-1)
        # answers: the states of the newest epochs; served: each peer's epoch, -1 for one that cannot be reached
        asked, answers, served_epochs = [], [], {}
        for peer in sources:
            if len(asked) == HOLD_DIALS_PER_TRY or sum(epoch != -1 for epoch in served_epochs.values()) == HOLD_SOURCES_PER_TRY:
                break
            asked.append(peer)
            served = self.checkpointer.state_download_from(peer, timeout=self._download_timeout(),
                                                           silence=HOLD_DOWNLOAD_TIMEOUT_S)
            self._dialed[peer] = (time.monotonic(), isinstance(served, tuple))
            if served == UNREACHABLE:
                served_epochs[peer] = -1
                continue
            if served is None or self._closed:
                served_epochs[peer] = None  # reached, silent: it counts as asked
                continue
            epoch, parameters = served
            first = all(epoch in (-1, None) for epoch in served_epochs.values())
            served_epochs[peer] = epoch
            if epoch < newest:
                if first:
                    return  # the first peer that answered lags the swarm; the next look asks another
                continue
            if not state_epoch_trusted(state_epoch=epoch, swarm_epoch=swarm_epoch):
                logger.warning("run %s: peer %s served a state of epoch %d, past the swarm's %d", self.slug, peer,
                               epoch, swarm_epoch)
                continue
            answers.append((peer, epoch, parameters))
            self._served_keep(epoch, parameters)
            served_now = self._served.setdefault(epoch, {})
            served_now[peer] = parameters  # a peer's later state replaces its earlier: it may have stepped since
            for unheld in sorted(self._served)[:-HELD_EPOCHS]:  # epochs no two peers agreed on, long gone
                del self._served[unheld]
            for agreed in state_agreed(served_now) if len(sources) > 1 else [parameters]:
                self._hold_state(epoch, agreed)
            if first and state_among(parameters, self.held.get(epoch, []), within=STATE_SAME):
                return  # a state already held: nothing new
        if len(sources) > 1 and len(asked) == len(sources) and answers:
            peer, epoch, parameters = max(answers, key=lambda answer: answer[1])
            others = [served_epochs.get(other) for other in sources if other != peer]
            gone = all(served == -1 for served in others)
            # Others far behind leave the peer alone only in an epoch the monitor's reading has reached: a liar
            # serving epochs ahead of the honest peers' records would otherwise be alone in each. The reading is
            # the highest epoch a full peer's record claims, as hivemind reads it, so a liar whose own record runs
            # ahead too is not stopped here (docs/trust.md, "Not defended yet"). The median would not do: a killed
            # peer's record lingers for a minute and would hold it back while its partner trains on alone.
            behind = reading is not None and epoch <= reading + 1 and all(
                served is not None and served <= epoch - ABSENT_BEHIND_EPOCHS for served in others)
            if gone or behind:
                if not state_among(parameters, self.held.get(epoch, []), within=STATE_SAME):
                    logger.info("run %s: holding the state of epoch %d that peer %s alone served: the other declared "
                                "sources could not be reached or serve epochs %s", self.slug, epoch, peer, others)
                self._hold_state(epoch, parameters)

    def claimed_fetch(self) -> int:
        """Ask peers for the states that two distinct volunteers' pending commitments claim their steps were
        computed at and that the validator has no copy of: each peer keeps the states of its last few
        epochs (peer_agent.averaging.EpochStates). The holder looks at the moments peers serve their
        current state, and on a loaded machine it missed an epoch's state now and then: every step of the
        epoch then earned nothing, for every volunteer. A fetched state counts as one peer's (:meth:`_references`
        holds it because two volunteers claim it); one whose sketch is not the one asked for is a
        disagreement of the peer that served it. Each state is asked for once, from at most
        ``HOLD_SOURCES_PER_TRY`` peers picked at random. Returns how many states were fetched."""
        seen = set(self.held) | set(self.served)
        if not seen or self._spot_checks_on() is None:
            return 0
        claims: dict[int, dict[str, set[int]]] = {}  # epoch -> a claimed sketch -> the volunteers claiming it
        for epoch, user, steps in StepCommitment.objects.filter(
                session__run_id=self.run_pk, outcome=StepCommitment.Outcome.PENDING,
                epoch__gt=max(seen) - HELD_EPOCHS).values_list("epoch", "session__user_id", "steps"):
            for step in steps:
                if len(step) > 3 and isinstance(step[3], str):
                    claims.setdefault(epoch, {}).setdefault(step[3], set()).add(user)
        fetched = 0
        for epoch, sketches in sorted(claims.items()):
            known = [self._sketch(epoch, state) for near in (epoch - 1, epoch, epoch + 1)
                     for state in self.held.get(near, []) + self.served.get(near, [])]
            claimants = set().union(*sketches.values())
            # A volunteer alone in its epoch is its own second witness (_alone_in); a few states per epoch at
            # most, so that a liar's commitments naming many states cannot keep the holder dialing.
            alone = (len(claimants) == 1 and len(sketches) <= STATES_PER_EPOCH
                     and self._alone_in(epoch, next(iter(claimants))))
            for sketch in sketches:
                alike = [other for other in sketches if fingerprint_distance(sketch, other) <= STATE_AGREEMENT]
                if (any(fingerprint_distance(sketch, other) <= STATE_AGREEMENT for other in known)
                        or (len(set().union(*(sketches[other] for other in alike))) < 2 and not alone)
                        or any((epoch, other) in self._asked for other in alike)):
                    continue
                self._asked[(epoch, sketch)] = None
                while len(self._asked) > 4 * HELD_EPOCHS * STATES_PER_EPOCH:
                    del self._asked[next(iter(self._asked))]
                state = self._kept_fetch(epoch, sketch)
                if state is not None:
                    known.append(self._sketch(epoch, state))
                    fetched += 1
        return fetched

    def _alone_in(self, epoch: int, volunteer: int) -> bool:
        """Whether ``volunteer`` is the only one the portal holds any evidence of at ``epoch``: no other
        volunteer's session reported samples for it, committed to steps of it, or had its peer's record of it
        read. Then its sessions were the swarm in that epoch, their state was the swarm's, and the volunteer's
        claim is the second witness the rule of two asks for, once the swarm is past the epoch
        (:meth:`_swarm_past`). The holder misses a lone peer's epoch when a look is held up (CI: a second
        agent, still joining, kept a look waiting 15 s while the first trained through three epochs, and its
        epoch 3 earned nothing)."""
        others = Q(session__run_id=self.run_pk) & ~Q(session__user_id=volunteer)
        # The cheapest first: a run with many volunteers has other commitments for nearly every epoch.
        return not (StepCommitment.objects.filter(others, epoch=epoch).exists()
                    or SessionEpoch.objects.filter(others, epoch=epoch).exists()
                    or ContributionEvent.objects.filter(others, local_epoch=epoch).exists())

    def _swarm_past(self, epoch: int) -> bool:
        """Whether the monitor's reading is ``CORROBORATION_WAIT_EPOCHS`` past ``epoch``: another volunteer
        that trained in it has reported it by then (an honest agent reports every few seconds), and a liar
        alone in an epoch ahead of the swarm is not alone in it once the swarm gets there."""
        swarm_epoch = self._swarm_reading()
        return swarm_epoch is not None and swarm_epoch >= epoch + CORROBORATION_WAIT_EPOCHS

    def _swarm_reading(self) -> int | None:
        """The swarm's epoch in the monitor's latest reading of the run, None before the first."""
        reading = RunSample.objects.filter(run_id=self.run_pk).order_by("-at").values_list("global_epoch", flat=True)
        return reading.first()

    def _kept_fetch(self, epoch: int, sketch: str) -> list | None:
        """The state a peer kept for ``epoch`` and ``sketch``, from the first of a few peers picked at random
        that serves it (kept as that peer's, :meth:`_served_keep`), or None."""
        for peer in random.sample(self._sources, len(self._sources))[:HOLD_SOURCES_PER_TRY]:
            served = self.checkpointer.state_download_from(peer, timeout=self._download_timeout(),
                                                           silence=HOLD_DOWNLOAD_TIMEOUT_S, kept=(epoch, sketch))
            if not isinstance(served, tuple) or self._closed:  # none kept, or the peer is gone (UNREACHABLE)
                continue
            apart = fingerprint_distance(sketch, self._sketch(epoch, served[1]))
            self._state_judged(peer, disagrees=apart > STATE_EXACT)
            if apart > STATE_EXACT:
                logger.info("run %s: peer %s served a kept state of epoch %d %.4f away from the sketch asked for",
                            self.slug, peer, epoch, apart)
                continue
            logger.info("run %s: fetched the state of epoch %d that volunteers' steps claim, kept by peer %s",
                        self.slug, epoch, peer)
            self._served_keep(epoch, served[1])
            return served[1]
        return None

    def _served_keep(self, epoch: int, parameters: list) -> None:
        """Keep a state a peer served under ``epoch``, unless one like it is kept already: the checker holds
        it once two volunteers' steps claim it (:meth:`_references`)."""
        states = self.served.setdefault(epoch, [])
        if not state_among(parameters, states, within=STATE_SAME):
            states.append(parameters)
            del states[:-STATES_PER_EPOCH]
        for old in sorted(self.served)[:-HELD_EPOCHS]:
            del self.served[old]

    def _hold_state(self, epoch: int, parameters: list) -> None:
        states = self.held.setdefault(epoch, [])
        if state_among(parameters, states, within=STATE_SAME):
            return
        logger.debug("run %s: spot checks hold a state of epoch %d (%d so far)", self.slug, epoch, len(states) + 1)
        states.append(parameters)
        del states[:-STATES_PER_EPOCH]
        for old in sorted(self.held)[:-HELD_EPOCHS]:
            self.held.pop(old, None)
        for left in [left for left in self._served if left < epoch]:  # the swarm has left it
            self._disagreements_note(left, self._served.pop(left))

    def _disagreements_note(self, epoch: int, served: dict[str, list]) -> None:
        """Count the peers whose last state of ``epoch`` was none held for it nor for the previous epoch
        (which every peer serves for a moment as it enters an epoch)."""
        if epoch not in self.held:
            return
        for peer, parameters in served.items():
            disagrees = not state_among(parameters, self.held[epoch] + self.held.get(epoch - 1, []))
            self._state_judged(peer, disagrees=disagrees)
            if disagrees:
                logger.info("run %s: peer %s served a state of epoch %d unlike any two peers agreed on", self.slug,
                            peer, epoch)

    def _state_judged(self, peer: str, *, disagrees: bool) -> None:
        if disagrees:
            self.disagreements[peer] = self.disagreements.get(peer, 0) + 1
        tally = self._tallies_unsaved.setdefault(peer, [0, 0])
        tally[0], tally[1] = tally[0] + 1, tally[1] + disagrees
        while len(self._tallies_unsaved) > TALLIES_UNSAVED_MAX:  # peers no session ever named
            del self._tallies_unsaved[next(iter(self._tallies_unsaved))]

    def tallies_save(self) -> None:
        """Add each peer's judged states to its session's row, once a session is known to be that peer's."""
        for peer in list(self._tallies_unsaved):
            session = self.session_of_peer(peer)
            if session is None:
                continue
            served, disagreed = self._tallies_unsaved.pop(peer)
            TrainingSession.objects.filter(pk=session).update(states_served=F("states_served") + served,
                                                              states_disagreed=F("states_disagreed") + disagreed)

    def _check(self, run: Run, config: RunConfig, commitment: StepCommitment, states: list[list]) -> None:
        """Check ``commitment`` against ``states``: here, or queued for a validator worker (runs/swarm/recompute.py)."""
        sketches = [self._sketch(commitment.epoch, state) for state in states]
        if not settings.SPOT_CHECK_WORKERS:
            if self._recomputer is None:
                self._recomputer = Recomputer(run_id=self.run_id, slug=self.slug, tokenizer=self.checkpointer.tokenizer)
            self._recomputer.check(run, config, commitment, states, sketches)
            return
        names = [self._published(commitment.epoch, state) for state in states]
        spot_check_task.apply_async((commitment.pk, names, sketches))
        # Marked after sending: a worker that recorded the outcome first leaves a decided row marked, which
        # nothing reads; one marked first and never sent would wait SPOT_CHECK_REQUEUE_SECONDS.
        StepCommitment.objects.filter(pk=commitment.pk).update(queued_at=timezone.now())

    def _published(self, epoch: int, state: list) -> str:
        """The name under which ``state`` is kept in the media storage for the checks of ``epoch``, written once."""
        key = (epoch, id(state))
        cached = self._names.get(key)
        if cached is None or cached[0] is not state:  # an id is reused once its state is dropped
            cached = self._names[key] = (state, state_name(run_pk=self.run_pk, epoch=epoch, state=state))
            while len(self._names) > 2 * HELD_EPOCHS * STATES_PER_EPOCH:
                self._names.pop(next(iter(self._names)), None)
        state_write(cached[1], state)  # written once; again if a stopping holder of the duties deleted it
        return cached[1]

    def _states_prune(self, oldest_held: int) -> None:
        """Delete the kept states that neither a queued check nor the window of held epochs needs."""
        queued = StepCommitment.objects.filter(session__run_id=self.run_pk, outcome=StepCommitment.Outcome.PENDING,
                                               queued_at__isnull=False).aggregate(oldest=Min("epoch"))["oldest"]
        states_prune(run_pk=self.run_pk, before_epoch=min(oldest_held, queued if queued is not None else oldest_held) - 1)

def epochs_checkable(seen: set[int]) -> set[int]:
    """The epochs whose commitments may be checked, given those a state was seen for: each beside such an
    epoch (its steps are compared with its neighbours' states too) and before the newest one, which may
    still gain a state (see ``Validator._hold``)."""
    newest = max(seen)
    return {near for epoch in seen for near in (epoch - 1, epoch, epoch + 1) if near < newest}


def state_among(parameters: list, states: list[list], within: float = STATE_AGREEMENT) -> bool:
    """Whether ``parameters`` are one of ``states``: as far as travelling in fp16 allows, or ``within``."""
    return any(parameters_apart(parameters, state) <= within for state in states)


def state_agreed(served: dict[str, list]) -> list[list]:
    """The parameters of ``served`` (peer -> parameters) that another peer's agree with: each is held."""
    peers = list(served)
    return [served[peer] for peer in peers
            if any(parameters_apart(served[peer], served[other]) <= STATE_AGREEMENT for other in peers if other != peer)]

