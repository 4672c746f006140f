"""The rehearsal's reading of an agent's log (bench/rehearsal_figures.py)."""

import json

from bench.rehearsal_figures import agent_log


def test_an_agents_log_gives_its_state_downloads_and_its_catch_up_after_each(tmp_path):
    lines = [
        ("2026-12-07T18:00:00+00:00", dict(message="Loading the collaboration's state from peers (if any)")),
        ("2026-12-07T18:00:40+00:00", dict(message="", download=dict(done=10, total=100))),
        ("2026-12-07T18:04:10+00:00", dict(message="", download=dict(done=100, total=100))),
        ("2026-12-07T18:05:05+00:00", dict(message="The swarm moved to epoch 6 while this peer downloaded its state: "
                                                   "loaded that epoch's parameters")),
        ("2026-12-07T18:06:00+00:00", dict(message="Transitioning to epoch 7")),
    ]
    path = tmp_path / "agent.log"
    path.write_text("\n".join(["not json"] + [json.dumps(dict(timestamp=at, **record)) for at, record in lines]))
    log = agent_log(path)
    assert log.state_downloads == [(250.0, 100)]
    assert log.catch_ups == [55.0]
    assert list(log.epochs_entered) == [7]
