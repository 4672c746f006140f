"""`manage.py credit_rebuild` and `credit_check`: the credit aggregates recounted from the record
(runs/credit/recount.py), compared with what the rollup stored, and rewritten from it."""

import datetime
import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts.services import team_create, team_join
from peer_agent.protocol import RunConfig
from runs.credit.rebuild import credit_check, credit_drift
from runs.credit.recount import TABLES, stored_figures
from runs.credit.rollup import credit_rollup
from runs.credit.verification import epoch_flag, flag_accept
from runs.models import CreditHour, RunCredit, RunCreditTotal, SessionEpoch, TeamCredit, VolunteerCredit
from tests.factories import NOW, RunFactory, UserFactory, report, session_for

HOUR = datetime.timedelta(hours=1)


@pytest.fixture
def credited(db, team_changes_on_the_clock, organizer):
    """Two runs; amina and bo in Dhaka, bo moving to Lima halfway, and a volunteer with no team. Work
    over two days, confirmed as it is reported, one epoch flagged and then accepted; the rollup
    keeps up."""
    clock = team_changes_on_the_clock
    clock.now = NOW - 48 * HOUR
    small = RunFactory(slug="small")
    big = RunFactory(slug="big", config=RunConfig.model_validate({"model": {"preset": "base"}}).model_dump(mode="json"))
    amina, bo, loner = UserFactory(username="amina"), UserFactory(username="bo"), UserFactory(username="loner")
    dhaka, lima = team_create(founder=amina, name="Dhaka"), team_create(founder=UserFactory(), name="Lima")
    team_join(user=bo, team=dhaka)
    work = [(small, amina, 300, 1), (small, bo, 120, 1), (big, amina, 7, 1), (small, loner, 1000, 1), (small, bo, 60, 2)]
    sessions = {}
    for run, user, samples, epoch in work:
        clock.now += 6 * HOUR
        session = sessions.setdefault((run, user), session_for(run, user, machine=f"{user.username}-{run.slug}"))
        report(session, samples, at=clock.now, epoch=epoch, confirmed=user != loner)
        credit_rollup()
        if user == bo and epoch == 1:
            clock.now += HOUR
            team_join(user=bo, team=lima)
    clock.now += HOUR
    flagged = SessionEpoch.objects.create(session=sessions[(small, loner)], epoch=1)
    epoch_flag(row=flagged, reported=1000, announced=100, detail="announced less")
    credit_rollup()
    clock.now += HOUR
    flag_accept(row=flagged, by=organizer)
    credit_rollup()
    clock.now = NOW
    credit_rollup()
    return {"small": small, "big": big, "amina": amina, "bo": bo, "dhaka": dhaka, "lima": lima, "clock": clock}


def everything() -> dict:
    return {name: stored_figures(name) for name in TABLES}


def command(name: str, *args) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def test_a_rebuild_from_nothing_writes_what_the_rollup_kept(credited):
    kept = everything()
    assert kept["RunTeamCredit"] and kept["CreditHour"] and kept["TeamCreditHour"]
    for name, (model, _, _) in TABLES.items():
        if name != "SessionEpoch":
            model.objects.all().delete()
    SessionEpoch.objects.update(credited_samples=0)

    output = command("credit_rebuild")

    assert output.startswith("Rebuilt the credit of all runs:") and "RunTeamCredit: 3 rows" in output
    assert credit_drift(everything(), kept, now=NOW) == [], "every figure, RAC and the teams' shares included"
    assert command("credit_rebuild") == "Rebuilt the credit of all runs: nothing differed from the record.\n"


def test_credit_check_names_each_drifted_figure_and_exits_with_status_1(credited):
    RunCredit.objects.filter(run=credited["small"], user=credited["amina"]).update(samples=305)
    RunCreditTotal.objects.filter(run=credited["big"]).update(credit=1.0)
    CreditHour.objects.filter(user=credited["bo"], samples=60).delete()  # what bo had confirmed 17 h before NOW
    out = io.StringIO()

    with pytest.raises(CommandError, match="credit_rebuild") as failed:
        call_command("credit_check", stdout=out)

    assert failed.value.returncode == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == "Credit drift in all runs: 18 figures in 7 rows."
    assert "RunCredit run small, user amina: samples stored 305, recounted 300" in lines
    assert "RunCreditTotal run big: credit stored 1, recounted 2121.71" in lines
    assert "RunCredit run small, user bo: samples_24h stored 60, recounted 0" in lines, "the window holds a lost bucket"
    assert "RunTeamCredit run small, team lima: members_24h stored 1, recounted 0" in lines
    assert "RunCredit: 2 rows (samples 1, samples_24h 1, credit_24h 1, samples_7d 1, credit_7d 1)" in lines


def test_credit_rebuild_repairs_the_drift_and_says_what_it_changed(credited):
    VolunteerCredit.objects.filter(user=credited["amina"]).update(machines=9, credit=0.0)
    TeamCredit.objects.filter(team=credited["lima"]).delete()
    CreditHour.objects.filter(user=credited["bo"], samples=60).delete()

    output = command("credit_rebuild", "--verbosity", "2").splitlines()

    assert output[0] == "Rebuilt the credit of all runs: 15 figures in 3 rows changed."
    assert "VolunteerCredit user amina: machines stored 9, recounted 2" in output
    assert "CreditHour run small, user bo, hour 2026-11-28 19:00: samples stored —, recounted 60" in output
    assert "TeamCredit team lima: samples stored —, recounted 60" in output
    assert "TeamCredit: 1 rows (samples 1, compute_seconds 1, samples_verified 1, credit_verified 1, credit 1, " \
           "samples_24h 1, credit_24h 1, samples_7d 1, credit_7d 1, recent_average_credit 1, last_seen_at 1)" in output
    assert command("credit_check") == "No drift: the credit aggregates of all runs agree with the record.\n"
    assert credit_check(history=True) == []


def test_a_run_is_rebuilt_alone_with_its_people_totals_across_runs(credited):
    RunCredit.objects.filter(run=credited["small"], user=credited["amina"]).update(samples=1)
    RunCredit.objects.filter(run=credited["big"], user=credited["amina"]).update(samples=1)

    output = command("credit_rebuild", "--run", "small")

    assert output.splitlines()[1:] == ["RunCredit: 1 rows (samples 1)", "VolunteerCredit: 1 rows (samples 1)"]
    assert RunCredit.objects.get(run=credited["small"], user=credited["amina"]).samples == 300
    assert RunCredit.objects.get(run=credited["big"], user=credited["amina"]).samples == 1, "another run's row is left"
    assert VolunteerCredit.objects.get(user=credited["amina"]).samples == 300 + 1, "the all-runs total adds it as stored"
    assert {drift.table for drift in credit_check(run=credited["big"])} == {"RunCredit", "VolunteerCredit"}
    with pytest.raises(CommandError, match='no run "nowhere"'):
        command("credit_check", "--run", "nowhere")


def test_only_history_mode_sees_what_a_lagging_rollup_gave_a_volunteers_new_team(credited):
    clock, bo = credited["clock"], credited["bo"]
    report(session_for(credited["small"], bo, machine="bo-third"), 50, at=clock.now, epoch=3)
    clock.now += datetime.timedelta(minutes=1)
    team_join(user=bo, team=credited["dhaka"])  # before the rollup took the report in: Dhaka gets it, not Lima
    credit_rollup()

    assert command("credit_check", "--run", "small").startswith("No drift"), "it trusts the rollup's dates of changes"
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("credit_check", "--run", "small", "--history", stdout=out)
    assert "RunTeamCredit run small, team dhaka: samples stored 470, recounted 420" in out.getvalue()
    history = {(drift.table, drift.key, drift.field): drift for drift in credit_check(history=True)}
    dhaka, lima = ((credited["small"].pk, credited[team].pk) for team in ("dhaka", "lima"))
    assert (history[("RunTeamCredit", dhaka, "samples")].stored, history[("RunTeamCredit", dhaka, "samples")].recounted) \
        == (470, 420), "by the record bo was still in Lima when the report came"
    assert history[("RunTeamCredit", lima, "samples")].recounted == 110
    assert ("RunCredit", (credited["small"].pk, bo.pk), "recent_average_credit") in history, "granted a minute late"
