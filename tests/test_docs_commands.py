"""Every command the README and docs/ tell people to type is exercised, so the docs cannot rot.

The commands are read from the docs themselves: the lines of ``sh``/``console`` code blocks, the
``$ `` lines of transcripts, and inline code that starts with a program people run. Each must match
a row of EXERCISED, which names the test (or CI script) that runs it; the test checks that the
named test exists. On top of that the flags a command shows must exist in its program's own
parser (``peer-agent``, ``manage.py``, ``bench``), the ``make`` targets in the Makefile, and every
setting of the deployment example must be one ``portal/settings.py`` reads.
"""

import argparse
import ast
import re
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = r"(make |python manage\.py |peer-agent|pip install |\.venv/bin/python |docker compose )"
DEMO_TEST = ("tests/test_demo.py::"
             "test_the_demo_trains_two_volunteers_live_checkpoints_stops_on_ctrl_c_and_runs_again_from_its_checkpoint")
CLI_TESTS = "tests/peer_agent/test_cli.py::"
BACKUP_TEST = "tests/test_backup_restore.py::test_the_documented_backup_and_restore_bring_back_the_database_files_and_identities"
WHEEL_TEST = "tests/runs/api/test_agent_wheel.py::test_the_wheel_is_built_served_and_named_on_the_join_page"

# (pattern of a documented command, where it is exercised: "tests/…py::test_name" or a CI script)
EXERCISED = [
    (r"make demo", DEMO_TEST),
    (r"make test", ".ci/run"),
    (r"make lint", ".ci/run"),
    (r"make messages", "tests/portal/test_translations.py::test_every_marked_string_has_a_bengali_translation"),
    (r"LANGUAGE=bn peer-agent status", CLI_TESTS + "test_status_speaks_bengali_when_the_environment_asks_for_it"),
    (r"python manage\.py migrate", DEMO_TEST),
    # The demo starts its validator worker so (runs/management/commands/demo.py, validator_command).
    (r"celery -A portal worker -Q validations --include runs\.swarm\.recompute --pool solo --loglevel INFO", DEMO_TEST),
    (r"(time )?(\S+=\S+ )*\.venv/bin/python manage\.py migrate( \w+)?", DEMO_TEST),
    (r"python manage\.py collectstatic --noinput", "tests/test_docs_commands.py::test_collectstatic_gathers_the_pages_assets"),
    (r"python manage\.py agent_wheel", WHEEL_TEST),
    (r"python manage\.py createsuperuser", "tests/test_docs_commands.py::test_createsuperuser_makes_an_admin"),
    (r"python manage\.py run_coordinator( --run \S+)?",
     "tests/runs/swarm/test_coordinator.py::test_active_runs_get_a_backbone_peer_whose_addresses_agents_bootstrap_from"),
    (r"(COORDINATOR_\w+=\S+ )+python manage\.py run_coordinator --run \S+",
     "tests/runs/swarm/test_coordinator.py::test_a_second_backbone_peer_joins_the_first_and_takes_the_duties_over_when_the_first_dies"),
    (r"python manage\.py credit_check",
     "tests/runs/credit/test_credit_rebuild.py::test_credit_check_names_each_drifted_figure_and_exits_with_status_1"),
    (r"python manage\.py credit_check --run \S+ --history",
     "tests/runs/credit/test_credit_rebuild.py::test_only_history_mode_sees_what_a_lagging_rollup_gave_a_volunteers_new_team"),
    (r"python manage\.py credit_rebuild( -v 2)?",
     "tests/runs/credit/test_credit_rebuild.py::test_credit_rebuild_repairs_the_drift_and_says_what_it_changed"),
    (r"python manage\.py credit_rebuild --run \S+",
     "tests/runs/credit/test_credit_rebuild.py::test_a_run_is_rebuilt_alone_with_its_people_totals_across_runs"),
    (r"(\.venv/bin/)?python manage\.py evaluate_checkpoint \S+ \S+( --save)?( --threads \d+)?",
     "tests/runs/evaluation/test_evaluation.py::test_the_command_prints_the_table_and_refuses_unknown_epochs"),
    (r"python manage\.py publish_checkpoint \S+ \d+ --to \S+",
     "tests/runs/swarm/test_model_card_and_publish.py::test_publish_writes_a_directory_from_pretrained_loads_with_the_card"),
    (r"HF_TOKEN=\S+ python manage\.py publish_checkpoint \S+ \d+ --to \S+ --hub \S+",
     "tests/runs/swarm/test_model_card_and_publish.py::test_publish_to_the_hub_uploads_the_directory_with_the_configured_token"),
    (r"python manage\.py check --deploy",
     "tests/portal/test_settings.py::test_production_settings_pass_check_deploy_with_no_issues"),
    (r"pip install https://<portal>/agent/peer_agent-<version>-py3-none-any\.whl", WHEEL_TEST),
    (r'(pg_dump|pg_restore|tar) .*', BACKUP_TEST),
    (r"(PEER_AGENT_TOKEN=\S+ )?peer-agent join --portal \S+ \S+",
     "tests/browser/test_full_story.py::test_a_run_from_setup_to_pause_and_resume_with_real_agents"),
    (r"(PEER_AGENT_TOKEN=\S+ )?peer-agent aggregate( --portal \S+ \S+( --bandwidth-mbps \S+)?)?",
     "tests/e2e/test_aggregator_with_portal.py::test_an_organizers_aggregator_helps_a_trainer_average_and_claims_nothing"),
    (r"peer-agent join --config agent\.toml",
     CLI_TESTS + "test_a_flag_beats_the_environment_which_beats_the_config_file_which_beats_the_login"),
    (r"peer-agent join --log-format json",
     CLI_TESTS + "test_log_format_json_writes_each_log_record_as_a_json_line_naming_the_run_and_session"),
    (r"peer-agent join --stop-with-parent PID",  # the notebook's agent runs with it (peer_agent/notebook.py)
     "tests/e2e/test_join_notebook.py::"
     "test_the_join_notebook_installs_the_agent_joins_with_a_typed_token_and_earns_confirmed_credit"),
    (r"peer-agent join --help", CLI_TESTS + "test_python_m_peer_agent_shows_help_for_every_command"),
    (r"peer-agent login --portal \S+", CLI_TESTS + "test_login_checks_the_token_and_stores_it_readable_only_by_you"),
    (r"peer-agent check( --portal \S+ \S+)?",
     CLI_TESTS + "test_check_describes_device_precision_measured_bandwidth_and_client_mode"),
    (r"peer-agent check --portal \S+ \S+ --backbone \S+",
     CLI_TESTS + "test_check_with_a_backbone_reports_that_it_dialed_this_machine_back"),
    (r"peer-agent status", CLI_TESTS + "test_status_shows_sessions_samples_acknowledged_and_pending"),
    (r"peer-agent( login\|join\|aggregate\|check\|status)?", CLI_TESTS + "test_python_m_peer_agent_shows_help_for_every_command"),
    (r"promtool (check|test) rules deploy/prometheus/alerts(\.test)?\.yml",
     "tests/deploy/test_prometheus_files.py::test_the_alerting_rules_pass_promtool_and_fire_on_the_trouble_they_name"),
    (r"\.venv/bin/python -m bench\.spotcheck( --presets tiny)?",
     "tests/bench/test_spotcheck_bench.py::test_the_smallest_run_prints_costs_and_distances_the_tolerance_separates"),
    # The rehearsal's real size runs by hand (half an hour, the whole machine); its CI form runs the same code.
    (r"(\S+=\S+ )*(sudo )?\.venv/bin/python -m bench\.rehearsal( --[a-z-]+( [\w.,]+)*)*",
     "tests/bench/test_rehearsal_bench.py::"
     "test_a_short_rehearsal_trains_checks_and_credits_in_the_lab_and_leaves_nothing_behind"),
    # Benchmarks are run by hand (minutes each); here their documented flags are checked.
    (r"(\S+=\S+ )*\.venv/bin/python -m bench\.\w+.*", "tests/test_docs_commands.py::test_documented_flags_exist"),
]


def documented_commands() -> list[tuple[str, str]]:
    """(doc file, command) for every command the docs show."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for language, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
            for line in body.replace("\\\n", " ").splitlines():  # continuation lines join
                line = line.strip()
                if language in {"sh", "console", "bash"} and not line.startswith("#"):
                    command = line
                elif line.startswith("$ "):
                    command = line[2:]
                else:
                    continue
                command = " ".join(re.sub(r"\s+#.*$", "", command).split())
                setting = re.match(r"[A-Z][A-Z0-9_]*=", command) and not re.search(PROGRAMS, command)
                if command and not command.startswith("uptime") and not setting:  # settings: see below
                    found.append((doc.name, command))
        for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
            if re.match(PROGRAMS, span):
                found.append((doc.name, span.strip()))
    return found


def documented_settings() -> list[str]:
    """The variables of the deployment guide's example environment."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    names = []
    for body in re.findall(r"```sh\n(.*?)```", text, re.S):
        names += re.findall(r"^([A-Z][A-Z0-9_]*)=", body, re.M)
    return names


def exercised_by(command: str) -> str | None:
    return next((where for pattern, where in EXERCISED if re.fullmatch(pattern, command)), None)


def test_the_docs_show_commands():
    commands = {command for _, command in documented_commands()}
    assert {"make demo", "make test", "python manage.py migrate"} <= commands


@pytest.mark.parametrize(("doc", "command"), documented_commands())
def test_every_documented_command_is_exercised(doc, command):
    where = exercised_by(command)
    assert where, f"{doc}: `{command}` is exercised by no test: run it in one and add a row to EXERCISED"
    path, _, test = where.partition("::")
    assert (ROOT / path).exists(), where
    if test:
        tree = ast.parse((ROOT / path).read_text())
        assert test in {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}, f"no test {where}"
    else:
        assert command in (ROOT / path).read_text(), f"{path} does not run `{command}`"


def _flags(command: str) -> list[str]:
    return re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", command)


def _peer_agent_flags(command: str) -> set[str]:
    """The options of one ``peer-agent`` subcommand, read from the CLI's own parser in this process."""
    from peer_agent.cli import build_parser

    subcommands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    return set(subcommands.choices[command]._option_string_actions)


def _bench_flags(module: str) -> set[str]:
    """The options a bench declares (``add_argument("--…")`` in its module), read from its source: importing
    a bench, or starting one per documented command, costs seconds of torch each (issue 28: on a loaded
    machine the serial ``--help`` runs passed the test's timeout)."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    return {arg.value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
            for arg in node.args if isinstance(arg, ast.Constant) and str(arg.value).startswith("--")} | {"--help"}


def test_documented_flags_exist():
    """Each flag a documented command shows is one its program accepts."""
    for doc, command in documented_commands():
        flags = _flags(command)
        if not flags:
            continue
        if manage := re.search(r"manage\.py (\w+)", command):
            name = manage.group(1)
            parser = load_command_class(get_commands()[name], name).create_parser("manage.py", name)
            accepted = set(parser._option_string_actions)
        elif agent := re.search(r"peer-agent (\w+)", command):
            accepted = _peer_agent_flags(agent.group(1))
        elif bench := re.search(r"-m (bench\.\w+)", command):
            accepted = _bench_flags(bench.group(1))
        else:
            continue
        for flag in flags:
            assert flag in accepted, f"{doc}: `{command}` shows {flag}, which the program does not accept"


def test_the_flags_check_tells_a_missing_flag():
    """The two ways flags are read see a flag that exists and miss one that does not."""
    assert "--presets" in _bench_flags("bench.spotcheck") and "--no-such-flag" not in _bench_flags("bench.spotcheck")
    assert "--per-device-batch-size" in _peer_agent_flags("join") and "--token" not in _peer_agent_flags("status")


def test_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for doc, command in documented_commands():
        if target := re.fullmatch(r"make (\w+)", command):
            assert re.search(rf"^{target.group(1)}:", makefile, re.M), f"{doc}: no make target {target.group(1)}"


def test_every_deployment_setting_is_read_by_the_settings():
    settings_source = (ROOT / "portal" / "settings.py").read_text()
    names = documented_settings()
    assert "DATABASE_URL" in names
    for name in names:
        base = name.removesuffix("_FILE")  # any X can be read from X_FILE (portal/env.py)
        assert f'"{base}"' in settings_source, f"docs/deploy.md sets {name}, which portal/settings.py never reads"


def test_collectstatic_gathers_the_pages_assets(settings, tmp_path):
    from django.core.management import call_command

    settings.STATIC_ROOT = tmp_path / "static"
    call_command("collectstatic", "--noinput", verbosity=0)
    assert (tmp_path / "static" / "js" / "live.js").exists()
    assert (tmp_path / "static" / "vendor" / "uplot" / "uPlot.iife.min.js").exists()


def test_createsuperuser_makes_an_admin(db, monkeypatch):
    from django.core.management import call_command

    from accounts.models import User

    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a-long-admin-password")
    call_command("createsuperuser", "--noinput", "--username", "admin", "--email", "admin@example.org", verbosity=0)
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff and admin.check_password("a-long-admin-password")
