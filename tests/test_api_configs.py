"""Serving configs over HTTP: exact key, nearest tuned shape, the kernel's default; one lookup
or many."""

from __future__ import annotations

import pytest

from search_spaces import get_kernel
from tests.api_support import CONFIG, GPU, config_params, store

SMALL = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
         "num_stages": 2}


def test_the_exact_shape_is_served_with_its_timing(api_client, api_db_url):
    store(api_db_url, {"M": 4096, "N": 4096, "K": 4096}, 0.2)
    got = api_client.get("/api/v1/configs", params=config_params({"M": 4096, "N": 4096,
                                                                  "K": 4096}, GPU))
    assert got.status_code == 200
    body = got.json()
    assert body["match"] == "exact" and body["config"] == CONFIG and body["ms"] == 0.2
    assert body["device"] == GPU and body["kernel_version"] == get_kernel("matmul").version


def test_nearest_tuned_shape_is_served_with_its_distance(api_client, api_db_url):
    store(api_db_url, {"M": 4096, "N": 4096, "K": 4096}, 0.2)
    store(api_db_url, {"M": 64, "N": 64, "K": 64}, 0.01, config=SMALL)
    got = api_client.get("/api/v1/configs", params=config_params({"M": 4000, "N": 4096,
                                                                  "K": 4096})).json()
    assert got["match"] == "nearest" and got["tuned_shape"] == {"M": 4096, "N": 4096, "K": 4096}
    assert got["config"] == CONFIG and 0 < got["distance"] < 0.1
    small = api_client.get("/api/v1/configs", params=config_params({"M": 60, "N": 64,
                                                                    "K": 64})).json()
    assert small["match"] == "nearest" and small["config"] == SMALL


def test_another_dtype_or_device_is_never_served_as_a_match(api_client, api_db_url):
    store(api_db_url, {"M": 64, "N": 64, "K": 64}, 0.01)
    other_dtype = api_client.get("/api/v1/configs", params=config_params(
        {"M": 64, "N": 64, "K": 64}, dtype="float32"))
    other_gpu = api_client.get("/api/v1/configs", params=config_params(
        {"M": 64, "N": 64, "K": 64}, device="cuda:NVIDIA H100 80GB HBM3:sm90"))
    assert other_dtype.status_code == 404 and other_gpu.status_code == 404


def test_nothing_tuned_answers_404_with_the_default(api_client):
    shape = {"M": 8, "N": 8, "K": 8}
    got = api_client.get("/api/v1/configs", params=config_params(shape))
    assert got.status_code == 404
    expected = get_kernel("matmul").default_config(shape, "float16").to_dict()
    assert got.json()["match"] == "default" and got.json()["config"] == expected


def test_bulk_query_answers_every_item_in_order(api_client, api_db_url):
    store(api_db_url, {"M": 64, "N": 64, "K": 64}, 0.01)
    items = [{"kernel": "matmul", "dtype": "float16", "shape": {"M": 64, "N": 64, "K": 64}},
             {"kernel": "matmul", "dtype": "float16", "shape": {"M": 70, "N": 64, "K": 64}},
             {"kernel": "matmul", "dtype": "float32", "shape": {"M": 64, "N": 64, "K": 64}},
             {"kernel": "matmul", "dtype": "float16", "shape": {"M": 64, "N": 64, "K": 64},
              "device": GPU}]
    got = api_client.post("/api/v1/configs/query", json={"items": items})
    assert got.status_code == 200 and got.json()["count"] == 4
    assert [d["match"] for d in got.json()["data"]] == ["exact", "nearest", "default", "exact"]


def test_bulk_query_names_the_bad_item(api_client):
    items = [{"kernel": "matmul", "dtype": "float16", "shape": {"M": 64, "N": 64, "K": 64}},
             {"kernel": "matmul", "dtype": "float16", "shape": {"M": 64, "N": 64}}]
    got = api_client.post("/api/v1/configs/query", json={"items": items})
    assert got.status_code == 422
    assert got.json()["detail"][0]["loc"] == ["body", "items", 1, "shape", "K"]


@pytest.mark.parametrize(("params", "loc"), [
    ({"kernel": "nope", "dtype": "float16", "M": 1, "N": 1, "K": 1}, ["query", "kernel"]),
    ({"kernel": "matmul", "dtype": "int3", "M": 1, "N": 1, "K": 1}, ["query", "dtype"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 1, "N": 1}, ["query", "K"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 0, "N": 1, "K": 1}, ["query", "M"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 1, "N": 10**7, "K": 1}, ["query", "N"]),
    ({"kernel": "matmul", "dtype": "float16", "M": "x", "N": 1, "K": 1}, ["query", "M"]),
    ({"kernel": "matmul", "dtype": "float16", "M": 1, "N": 1, "K": 1, "Q": 2}, ["query", "Q"]),
    ({"dtype": "float16", "M": 1, "N": 1, "K": 1}, ["query", "kernel"]),
])
def test_bad_lookups_get_422_naming_the_parameter(api_client, params, loc):
    got = api_client.get("/api/v1/configs", params=params)
    assert got.status_code == 422
    assert got.json()["detail"][0]["loc"] == loc, got.json()
