"""A node of a multi-node job runs the leader's pre-flight (``services.worker.node_start``) on its
own settings: a follower whose ACCUM_DATA_ROOTS do not hold the job's data starts no rank and
says why on the job, in the owner's words; one whose roots hold it is ready as the leader is."""

from __future__ import annotations

from pathlib import Path

from job_specs import MINIMAL_SPEC

from services.jobdb import jobs
from services.jobdb.events import list_events
from services.jobdb.sessions import session_factory
from services.jobdb.tokens import create_owner_with_token
from services.settings import Settings
from services.spec import parse_spec
from services.worker.attempt import Outcome
from services.worker.gang import GangPlace
from services.worker.gang_node import Joined, follow
from services.worker.node_start import attempt_of, ready


def test_a_follower_whose_data_roots_refuse_the_job_starts_nothing_and_says_why(
    settings: Settings, tmp_path: Path
) -> None:
    sessions = session_factory(settings)
    data = tmp_path / "alice-data"
    (data / "text").mkdir(parents=True)
    (data / "text" / "train.txt").write_text("hello\n")
    dataset = {"name": "files", "data_root": str(data), "data_files": "text/train.txt", "tokenizer": "bytes"}
    with sessions.begin() as session:
        owner = create_owner_with_token(session, "alice")[0]
        spec = parse_spec(dict(MINIMAL_SPEC, nodes=2, model="hf:gpt2", dataset=dataset)).normalised()
        job = jobs.create_job(session, owner=owner, spec=spec)[0]
        attempt = attempt_of(session, job, "node-1/0001")
    assert attempt.owner == "alice" and attempt.attempt == job.attempts
    place = GangPlace(node_rank=1, nnodes=2, master_addr="127.0.0.1", master_port=9, master_secret="s" * 32)

    elsewhere = settings.model_copy(update={"data_roots": [tmp_path / "elsewhere"]})
    assert follow(elsewhere, Joined(attempt, place)) == Outcome.FOLLOWED  # before any rank: port 9 is never dialled

    with sessions() as session:
        refused = [event for event in list_events(session, job.id) if event.kind == "node_refused"]
    assert len(refused) == 1 and refused[0].data == {"node": 1}, refused
    message = refused[0].message
    assert message.startswith("node 1 did not start the job's ranks: ") and "outside the allowed data roots" in message
    assert str(tmp_path / "elsewhere") not in message  # the roots are told to admins only

    holding = settings.model_copy(update={"data_roots": [tmp_path]})
    ready_spec, ready_attempt = ready(holding, parse_spec(attempt.spec), attempt)
    assert ready_spec.dataset.data_root == str(data) and ready_attempt == attempt
