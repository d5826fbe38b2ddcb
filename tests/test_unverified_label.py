"""A kernel without a reference says so wherever its results are met: the kernel list, the
config answers, the job, and the dashboard's job and kernel pages. ``bias_gelu`` (a real plugin,
``tests/plugins.py``) has no reference; the built-in ``vector_add`` has one."""

from __future__ import annotations

from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from db import repo
from db.engine import init_db
from search_spaces import get_kernel
from tests.api_support import GPU
from tests.plugins import EXAMPLES, registered
from tuner.settings import Settings
from tuner.user_kernel import UNVERIFIED

UNCHECKED, BUILTIN = "bias_gelu", "vector_add"
SHAPES = {UNCHECKED: {"M": 64, "N": 64}, BUILTIN: {"N": 4096}}
#: a verification text that is HTML: the pages must show it as text
HOSTILE = "unverified: <b onmouseover=alert(1)>no</b> reference"


@pytest.fixture
def plugins() -> Iterator[None]:
    with registered():
        yield


@pytest.fixture
def client(plugins: None, api_db_url: str) -> Iterator[TestClient]:
    """The app over real HTTP with the example plugins registered."""
    with TestClient(create_app(Settings(database_url=api_db_url))) as c:
        yield c


def _store(db_url: str, kernel: str) -> None:
    """A best of the kernel for its shape on ``GPU``, as a worker stores one."""
    k, shape = get_kernel(kernel), SHAPES[kernel]
    with init_db(db_url)() as session:
        repo.upsert_device(session, {"key": GPU, "kind": "cuda", "name": "NVIDIA H200"})
        repo.store_best(session, device_key=GPU, kernel=kernel, kernel_version=k.version,
                        dtype="float16", shape=shape, triton_version="3.6.0",
                        config=k.default_config(shape, "float16").to_dict(), p20_ms=0.01,
                        p50_ms=0.01, p80_ms=0.01, tflops=1.0, gbps=1.0, torch_version=None,
                        cuda_version=None, task_id=None)
        session.commit()


def _job(client: TestClient, kernel: str) -> str:
    body: dict[str, Any] = {"kernel": kernel, "dtype": "float16", "shapes": [SHAPES[kernel]],
                            "budget": {"trials": 3}}
    created = client.post("/api/v1/jobs", json=body)
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


def test_the_kernel_list_says_which_kernels_have_no_reference(client):
    kernels = {k["name"]: k for k in client.get("/api/v1/kernels").json()["data"]}
    assert kernels[UNCHECKED]["verification"] == UNVERIFIED == "unverified: no reference"
    assert kernels[BUILTIN]["verification"] == "reference"
    assert kernels["rmsnorm"]["verification"] == "reference"  # a plugin with a reference


def test_a_config_lookup_of_a_kernel_without_reference_says_unverified(client, api_db_url):
    _store(api_db_url, UNCHECKED)
    got = client.get("/api/v1/configs", params={"kernel": UNCHECKED, "dtype": "float16",
                                                "device": GPU, **SHAPES[UNCHECKED]})
    assert got.status_code == 200 and got.json()["match"] == "exact"
    assert got.json()["verification"] == UNVERIFIED


def test_a_default_answer_carries_the_verification_too(client):
    got = client.get("/api/v1/configs", params={"kernel": UNCHECKED, "dtype": "float16",
                                                **SHAPES[UNCHECKED]})
    assert got.status_code == 404 and got.json()["match"] == "default"
    assert got.json()["verification"] == UNVERIFIED


def test_a_bulk_query_labels_each_answer_with_its_kernels_verification(client, api_db_url):
    _store(api_db_url, UNCHECKED)
    _store(api_db_url, BUILTIN)
    items = [{"kernel": k, "dtype": "float16", "shape": SHAPES[k], "device": GPU}
             for k in (UNCHECKED, BUILTIN)]
    got = client.post("/api/v1/configs/query", json={"items": items})
    assert got.status_code == 200
    answers = got.json()["data"]
    assert [a["match"] for a in answers] == ["exact", "exact"]
    assert [a["verification"] for a in answers] == [UNVERIFIED, "reference"]


def test_a_job_of_a_kernel_without_reference_says_unverified(client):
    unchecked, builtin = _job(client, UNCHECKED), _job(client, BUILTIN)
    assert client.get(f"/api/v1/jobs/{unchecked}").json()["verification"] == UNVERIFIED
    assert client.get(f"/api/v1/jobs/{builtin}").json()["verification"] == "reference"
    listed = {j["id"]: j["verification"] for j in client.get("/api/v1/jobs").json()["data"]}
    assert listed == {unchecked: UNVERIFIED, builtin: "reference"}


def test_a_job_of_a_kernel_not_registered_here_has_no_verification(client, api_db_url):
    with init_db(api_db_url)() as session:
        job = repo.create_job(session, kernel="gone_kernel", kernel_version="0" * 12,
                              dtype="float16", shapes=[{"N": 64}], budget_trials=3,
                              budget_seconds=None, strategy="auto", force=False, seed=0,
                              backend="interpret", device_key=None)
        session.commit()
        job_id = job.id
    got = client.get(f"/api/v1/jobs/{job_id}")
    assert got.status_code == 200 and got.json()["verification"] is None
    assert "verified" not in client.get(f"/jobs/{job_id}").text


def test_the_job_page_shows_the_unverified_badge(client):
    job_id = _job(client, UNCHECKED)
    page = client.get(f"/jobs/{job_id}").text
    assert 'class="tag warn" data-field="verification"' in page
    assert "unverified: no reference" in page
    live = client.get(f"/jobs/{job_id}/live").json()  # the part a running job's page swaps in
    assert "unverified: no reference" in live["parts"]["job"]


def test_the_job_page_of_a_builtin_kernel_says_verified_against_a_reference(client):
    page = client.get(f"/jobs/{_job(client, BUILTIN)}").text
    assert "verified against a reference" in page and "unverified" not in page


def test_the_kernel_page_shows_the_unverified_badge(client):
    page = client.get(f"/kernels/{UNCHECKED}").text
    assert 'class="tag warn" data-field="verification"' in page
    assert "unverified: no reference" in page
    builtin = client.get(f"/kernels/{BUILTIN}").text
    assert "verified against a reference" in builtin and "unverified" not in builtin


@pytest.fixture
def hostile_plugin(tmp_path: Path, api_db_url: str) -> Iterator[TestClient]:
    """The app with a copy of ``bias_gelu`` registered as ``hostile_gelu`` whose verification
    text is HTML."""
    source = (EXAMPLES / "bias_gelu" / "bias_gelu.py").read_text()
    assert source.count('name="bias_gelu"') == 1
    (tmp_path / "hostile_gelu.py").write_text(
        source.replace('name="bias_gelu"', 'name="hostile_gelu"')
        + f"\nKERNEL.verification = {HOSTILE!r}\n")
    with registered(extra_refs="hostile_gelu:KERNEL", extra_path=tmp_path), \
            TestClient(create_app(Settings(database_url=api_db_url))) as c:
        yield c


def test_the_pages_escape_the_verification_text(hostile_plugin):
    client = hostile_plugin
    created = client.post("/api/v1/jobs", json={"kernel": "hostile_gelu", "dtype": "float16",
                                                "shapes": [{"M": 64, "N": 64}],
                                                "budget": {"trials": 3}})
    assert created.status_code == 202, created.text
    for url in ("/kernels/hostile_gelu", f"/jobs/{created.json()['id']}"):
        page = client.get(url).text
        assert HOSTILE not in page and "<b onmouseover" not in page
        assert escape(HOSTILE) in page
