"""Serving configs over HTTP for the caller's identity (device, kernel version, Triton minor):
exact, nearest shape, another Triton minor, another GPU (labelled), the kernel's default; one
lookup or many."""

from __future__ import annotations

import pytest

from search_spaces import get_kernel
from tests.api_support import CONFIG, GPU, INTERPRETER, config_params, store

SMALL = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
         "num_stages": 2}
H100 = "cuda:NVIDIA H100 80GB HBM3:sm90"
A100 = "cuda:NVIDIA A100-SXM4-80GB:sm80"
BIG = {"M": 4096, "N": 4096, "K": 4096}
CUBE = {"M": 64, "N": 64, "K": 64}


def lookup(client, shape: dict[str, int], device: str | None = None, **identity: str):
    return client.get("/api/v1/configs", params=config_params(shape, device, **identity))


def test_the_exact_identity_is_served_with_its_timing(api_client, api_db_url):
    store(api_db_url, BIG, 0.2, triton_version="3.6.0")
    got = lookup(api_client, BIG, GPU, triton_version="3.6.1")  # a patch release: same minor
    assert got.status_code == 200
    body = got.json()
    assert body["match"] == "exact" and body["config"] == CONFIG and body["ms"] == 0.2
    assert body["device"] == GPU and body["kernel_version"] == get_kernel("matmul").version
    assert body["triton_version"] == "3.6.0" and body["distance"] is None
    without_triton = lookup(api_client, BIG, GPU).json()  # any Triton counts as the caller's
    assert without_triton["match"] == "exact"


def test_nearest_tuned_shape_on_the_callers_device_is_served_with_its_distance(api_client,
                                                                               api_db_url):
    store(api_db_url, BIG, 0.2)
    store(api_db_url, CUBE, 0.01, config=SMALL)
    got = lookup(api_client, {"M": 4000, "N": 4096, "K": 4096}, GPU).json()
    assert got["match"] == "nearest" and got["tuned_shape"] == BIG
    assert got["config"] == CONFIG and 0 < got["distance"] < 0.1
    small = lookup(api_client, {"M": 60, "N": 64, "K": 64}, GPU).json()
    assert small["match"] == "nearest" and small["config"] == SMALL


def test_another_gpus_config_is_only_a_labelled_other_device_fallback(api_client, api_db_url):
    store(api_db_url, CUBE, 0.01, device=GPU)
    for device in (None, H100):  # an unknown GPU, and a GPU with nothing tuned
        got = lookup(api_client, CUBE, device)
        assert got.status_code == 200, got.text
        assert got.json()["match"] == "other-device" and got.json()["device"] == GPU
        assert got.json()["distance"] == 0.0
    assert lookup(api_client, CUBE, GPU).json()["match"] == "exact"


def test_without_a_device_nothing_is_exact_or_nearest(api_client, api_db_url):
    store(api_db_url, CUBE, 0.01, device=GPU)
    store(api_db_url, CUBE, 0.02, device=H100, config=SMALL)
    answers = [lookup(api_client, shape).json() for shape in (CUBE, {"M": 60, "N": 64, "K": 64})]
    assert [a["match"] for a in answers] == ["other-device", "other-device"]
    assert {a["device"] for a in answers} <= {GPU, H100}


def test_other_device_prefers_the_same_shape_then_the_nearest(api_client, api_db_url):
    store(api_db_url, CUBE, 0.01, device=H100)
    store(api_db_url, {"M": 60, "N": 64, "K": 64}, 0.01, device=A100, config=SMALL)
    same = lookup(api_client, CUBE, GPU).json()
    assert (same["match"], same["device"], same["config"]) == ("other-device", H100, CONFIG)
    near = lookup(api_client, {"M": 61, "N": 64, "K": 64}, GPU).json()
    assert (near["match"], near["device"], near["tuned_shape"]) == (
        "other-device", A100, {"M": 60, "N": 64, "K": 64})


def test_the_callers_own_device_comes_before_another_gpus_exact_shape(api_client, api_db_url):
    store(api_db_url, CUBE, 0.01, device=H100)
    store(api_db_url, {"M": 128, "N": 64, "K": 64}, 0.02, device=GPU, config=SMALL)
    got = lookup(api_client, CUBE, GPU).json()
    assert (got["match"], got["device"], got["config"]) == ("nearest", GPU, SMALL)


def test_another_triton_minor_is_served_as_other_triton(api_client, api_db_url):
    store(api_db_url, CUBE, 0.01, triton_version="3.5.1")
    same_shape = lookup(api_client, CUBE, GPU, triton_version="3.6.0").json()
    assert (same_shape["match"], same_shape["triton_version"]) == ("other-triton", "3.5.1")
    near = lookup(api_client, {"M": 128, "N": 64, "K": 64}, GPU, triton_version="3.6.0").json()
    assert near["match"] == "other-triton" and near["tuned_shape"] == CUBE
    assert near["distance"] == 1.0
    # a nearest shape under the caller's minor beats the exact shape under another minor
    store(api_db_url, {"M": 32, "N": 64, "K": 64}, 0.01, triton_version="3.6.2", config=SMALL)
    again = lookup(api_client, CUBE, GPU, triton_version="3.6.0").json()
    assert (again["match"], again["config"]) == ("nearest", SMALL)


def test_the_callers_exact_triton_version_is_preferred_within_a_minor(api_client, api_db_url):
    store(api_db_url, CUBE, 0.02, triton_version="3.6.0")
    store(api_db_url, CUBE, 0.01, triton_version="3.6.1", config=SMALL)
    older = lookup(api_client, CUBE, GPU, triton_version="3.6.0").json()
    newer = lookup(api_client, CUBE, GPU, triton_version="3.6.1").json()
    assert (older["match"], older["config"]) == ("exact", CONFIG)
    assert (newer["match"], newer["config"]) == ("exact", SMALL)


def test_a_config_of_another_kernel_version_is_never_served(api_client, api_db_url):
    store(api_db_url, CUBE, 0.01, kernel_version="0ld5ource")
    for device in (GPU, H100, None):
        got = lookup(api_client, CUBE, device)
        assert got.status_code == 404 and got.json()["match"] == "default"
    store(api_db_url, CUBE, 0.02)  # the registered version
    stale_caller = lookup(api_client, CUBE, GPU, kernel_version="an0ther")
    assert stale_caller.status_code == 404 and stale_caller.json()["match"] == "default"
    old_caller = lookup(api_client, CUBE, GPU, kernel_version="0ld5ource").json()
    assert (old_caller["match"], old_caller["kernel_version"]) == ("exact", "0ld5ource")


@pytest.mark.parametrize(("device", "kind"), [(INTERPRETER, "interpret"),
                                              ("replay:NVIDIA H200", "replay")])
def test_interpreter_and_replay_results_are_never_served_for_another_device(
        api_client, api_db_url, device, kind):
    store(api_db_url, CUBE, 5.0, device=device, kind=kind)
    for caller in (GPU, None):
        got = lookup(api_client, CUBE, caller)
        assert got.status_code == 404 and got.json()["match"] == "default"
    own = lookup(api_client, CUBE, device).json()
    assert (own["match"], own["device"]) == ("exact", device)


def test_exact_for_the_interpreter_on_a_cpu_only_box(api_client, api_db_url):
    import triton

    store(api_db_url, CUBE, 5.0, device=INTERPRETER, kind="interpret",
          triton_version=triton.__version__)
    got = lookup(api_client, CUBE, INTERPRETER, triton_version=triton.__version__,
                 kernel_version=get_kernel("matmul").version)
    assert got.status_code == 200 and got.json()["match"] == "exact"


def test_nothing_tuned_answers_404_with_the_default(api_client):
    shape = {"M": 8, "N": 8, "K": 8}
    got = lookup(api_client, shape, GPU, triton_version="3.6.0")
    assert got.status_code == 404
    expected = get_kernel("matmul").default_config(shape, "float16").to_dict()
    assert got.json()["match"] == "default" and got.json()["config"] == expected
    assert got.json()["device"] == GPU and got.json()["miss"] is None


def test_bulk_query_answers_every_item_in_order(api_client, api_db_url):
    store(api_db_url, CUBE, 0.01, triton_version="3.6.0")
    store(api_db_url, {"M": 256, "N": 64, "K": 64}, 0.01, device=H100)

    def item(shape: dict[str, int], **identity: str) -> dict[str, object]:
        return {"kernel": "matmul", "dtype": "float16", "shape": shape, **identity}

    items = [item(CUBE, device=GPU, triton_version="3.6.0"),
             item({"M": 70, "N": 64, "K": 64}, device=GPU),
             item(CUBE, device=GPU, triton_version="3.7.0"),
             item(CUBE),
             item({"M": 256, "N": 64, "K": 64}, device=GPU, triton_version="3.7.0"),
             item(CUBE, device=GPU, kernel_version="an0ther"),
             {**item(CUBE, device=GPU), "dtype": "float32"}]
    got = api_client.post("/api/v1/configs/query", json={"items": items})
    assert got.status_code == 200 and got.json()["count"] == 7
    assert [d["match"] for d in got.json()["data"]] == [
        "exact", "nearest", "other-triton", "other-device", "other-triton", "default",
        "default"]
    assert all(d["miss"] is None for d in got.json()["data"])  # misses were not reported


def test_bulk_query_names_the_bad_item(api_client):
    items = [{"kernel": "matmul", "dtype": "float16", "shape": CUBE},
             {"kernel": "matmul", "dtype": "float16", "shape": {"M": 64, "N": 64}}]
    got = api_client.post("/api/v1/configs/query", json={"items": items})
    assert got.status_code == 422
    assert got.json()["detail"][0]["loc"] == ["body", "items", 1, "shape", "K"]


@pytest.mark.parametrize(("change", "loc"), [
    ({"triton_version": ""}, ["body", "items", 0, "triton_version"]),
    ({"kernel_version": "x" * 41}, ["body", "items", 0, "kernel_version"]),
    ({"tuned": True}, ["body", "items", 0, "tuned"]),
])
def test_bulk_query_rejects_bad_identity_fields_by_name(api_client, change, loc):
    item = {"kernel": "matmul", "dtype": "float16", "shape": CUBE, **change}
    got = api_client.post("/api/v1/configs/query", json={"items": [item]})
    assert got.status_code == 422 and got.json()["detail"][0]["loc"] == loc


@pytest.mark.parametrize(("params", "loc"), [
    ({"kernel": "nope", "dtype": "float16", "M": 1, "N": 1, "K": 1}, ["query", "kernel"]),
    ({"kernel": "matmul", "dtype": "int3", "M": 1, "N": 1, "K": 1}, ["query", "dtype"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 1, "N": 1}, ["query", "K"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 0, "N": 1, "K": 1}, ["query", "M"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 1, "N": 10**7, "K": 1}, ["query", "N"]),
    ({"kernel": "matmul", "dtype": "float16", "M": "x", "N": 1, "K": 1}, ["query", "M"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 1, "N": 1, "K": 1, "Q": 2}, ["query", "Q"]),
    ({"dtype": "float16", "M": 1, "N": 1, "K": 1}, ["query", "kernel"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 1, "N": 1, "K": 1,
      "kernel_version": "v" * 41}, ["query", "kernel_version"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 1, "N": 1, "K": 1,
      "triton_version": ""}, ["query", "triton_version"]),
])
def test_bad_lookups_get_422_naming_the_parameter(api_client, params, loc):
    got = api_client.get("/api/v1/configs", params=params)
    assert got.status_code == 422
    assert got.json()["detail"][0]["loc"] == loc, got.json()


def test_identity_parameters_are_not_taken_as_dimensions(api_client, api_db_url):
    store(api_db_url, CUBE, 0.01)
    got = lookup(api_client, CUBE, GPU, triton_version="3.6.0",
                 kernel_version=get_kernel("matmul").version)
    assert got.status_code == 200 and got.json()["shape"] == CUBE


def test_openapi_documents_the_dimension_parameters_with_an_example(api_client):
    operation = api_client.get("/openapi.json").json()["paths"]["/api/v1/configs"]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    assert {"kernel", "dtype", "device", "kernel_version", "triton_version"} <= params.keys()
    # one integer query parameter per dimension (tests/test_docs_offline.py says more)
    assert {d: params[d]["example"] for d in BIG} == BIG
    assert all(params[d]["in"] == "query" for d in BIG)
    assert "other-device" in operation["description"]


def test_a_bulk_query_of_more_than_4096_items_is_a_422_naming_items(api_client):
    item = {"kernel": "matmul", "dtype": "float16", "shape": CUBE}
    too_many = api_client.post("/api/v1/configs/query", json={"items": [item] * 4097})
    assert too_many.status_code == 422
    [error] = too_many.json()["detail"]
    assert error["loc"] == ["body", "items"] and "4096" in error["msg"]
    most = api_client.post("/api/v1/configs/query", json={"items": [item] * 4096})
    assert most.status_code == 200 and most.json()["count"] == 4096


def test_lookups_carry_their_server_time(api_client, api_db_url):
    store(api_db_url, CUBE, 0.01)
    got = lookup(api_client, CUBE, GPU)
    assert got.status_code == 200 and got.json()["match"] == "exact"
    name, _, duration = got.headers["server-timing"].partition(";dur=")
    assert name == "app" and float(duration) > 0
