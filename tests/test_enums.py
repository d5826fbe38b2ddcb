"""The lifecycle, match and device-kind enums name the strings they replaced: stored rows, JSON,
the API's answers and its OpenAPI document keep those strings (``StrEnum`` members are them)."""

from __future__ import annotations

import json
from typing import Any, get_args

from sqlalchemy import text

from api.app import create_app
from api.schemas import JobStatus
from api.schemas import Match as MatchLiteral
from db import repo
from db.engine import init_db
from db.repo.bests import LADDER, MATCH_RANK
from db.repo.tasks import FINISH_STATUSES
from db.views import REPLAY_KIND
from tuner.device import interpreter_fingerprint, replay_fingerprint
from tuner.identity import DeviceKind, Match
from tuner.lifecycle import ACTIVE, STATUSES, TERMINAL, Handback, Status
from tuner.settings import Settings


def test_the_statuses_are_the_strings_they_replaced():
    assert ACTIVE == ("queued", "running")
    assert TERMINAL == ("succeeded", "failed", "cancelled")
    assert STATUSES == ("queued", "running", "succeeded", "failed", "cancelled")
    assert tuple(Status) == STATUSES
    assert [h.value for h in Handback] == ["lost", "requeued"]
    assert FINISH_STATUSES == ("succeeded", "failed", "cancelled", "lost")


def test_the_matches_and_device_kinds_are_the_strings_they_replaced():
    assert [m.value for m in Match] == ["exact", "nearest", "other-triton", "other-device",
                                       "default", "none"]
    assert [step.match for step in LADDER] == ["nearest", "other-triton", "other-device"]
    assert MATCH_RANK == {"exact": 0, "nearest": 1, "other-triton": 2, "other-device": 3}
    assert [k.value for k in DeviceKind] == ["cuda", "interpret", "replay"]
    assert REPLAY_KIND == "replay"


def test_the_api_schemas_name_the_same_values_as_the_enums():
    assert get_args(JobStatus) == tuple(s.value for s in Status)
    assert get_args(MatchLiteral) == tuple(m.value for m in Match)


def test_a_member_is_its_string_in_text_json_and_keys():
    for member in (Status.QUEUED, Handback.LOST, Match.OTHER_TRITON, DeviceKind.CUDA):
        value = member.value
        assert member == value and hash(member) == hash(value)
        assert str(member) == f"{member}" == format(member) == value
        assert json.dumps({member: member}) == json.dumps({value: value})
        assert {value: 1}[member] == 1 and {member: 1}[value] == 1


def test_fingerprints_keep_their_keys_and_kinds():
    fp = replay_fingerprint("NVIDIA H100", "3.6.0", None)
    assert fp.kind == "replay" and fp.key == "replay:NVIDIA H100" and not fp.is_gpu
    assert json.loads(json.dumps(fp.to_dict()))["kind"] == "replay"
    assert interpreter_fingerprint().key == "interpret:cpu"


def test_stored_statuses_are_the_plain_strings(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        job = repo.create_job(s, kernel="matmul", kernel_version="v1", dtype="float16",
                              shapes=[{"M": 64, "N": 64, "K": 64}], budget_trials=8,
                              budget_seconds=None, strategy="auto", force=False, seed=0,
                              backend="auto", device_key=None)
        s.commit()
        job_id = job.id
        repo.cancel_job(s, job_id)
        s.commit()
    with factory() as s:
        rows = s.execute(text("SELECT status FROM jobs UNION ALL SELECT status FROM tasks")).all()
        assert [r[0] for r in rows] == ["cancelled", "cancelled"]
        assert all(type(r[0]) is str for r in rows)
        assert repo.get_job(s, job_id).status == Status.CANCELLED


def _enums(document: Any) -> list[list[str]]:
    """Every ``enum`` list in an OpenAPI document, in order."""
    if isinstance(document, dict):
        found = [document["enum"]] if isinstance(document.get("enum"), list) else []
        return found + [e for v in document.values() for e in _enums(v)]
    if isinstance(document, list):
        return [e for v in document for e in _enums(v)]
    return []


def test_the_openapi_document_names_the_values_inline(tmp_path):
    """The schemas keep their ``Literal`` types: no enum component appears, and the job
    status and match lists are the ones the document had before the enums."""
    document = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}")).openapi()
    components = document["components"]["schemas"]
    assert not {"Status", "Handback", "Match", "DeviceKind"} & set(components)
    enums = _enums(document)
    assert ["queued", "running", "succeeded", "failed", "cancelled"] in enums
    assert ["exact", "nearest", "other-triton", "other-device", "default", "none"] in enums
    assert components["ConfigPublic"]["properties"]["match"] == {
        "enum": ["exact", "nearest", "other-triton", "other-device", "default", "none"],
        "title": "Match", "type": "string"}
