"""The API's documentation works on a machine with no network: /docs (Swagger UI) and /redoc load
every file from this service (the installed ``fastapi-offline`` package's assets), and the
OpenAPI document gives every operation an example and declares GET /configs's dimensions, so
that "Try it out" can send a shape.

The browser tests drive Debian's Chromium with Playwright (``scripts/test.sh`` installs both;
where either is missing they are skipped and say so) against the app on a real socket, with
every request that is not to that socket blocked and recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api_support import GPU, register_devices, running_app, store
from tests.support_browser import new_page
from tuner.settings import Settings

EXAMPLE_SHAPE = {"M": 4096, "N": 4096, "K": 4096}


def _resolve(openapi: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref:
        return dict(openapi["components"]["schemas"][ref.rsplit("/", 1)[1]])
    return schema


def _media_example(openapi: dict[str, Any], content: dict[str, Any]) -> Any:
    """The example of a request or response body: the media type's, else its schema's."""
    media = content.get("application/json", {})
    if "example" in media:
        return media["example"]
    if media.get("examples"):
        return next(iter(media["examples"].values()))["value"]
    schema = _resolve(openapi, media.get("schema", {}))
    return (schema.get("examples") or [None])[0]


def _param_example(param: dict[str, Any]) -> Any:
    """A parameter's example (its own, which /docs fills in: ``example`` or the first of
    ``examples``)."""
    if "example" in param:
        return param["example"]
    return next(iter(param.get("examples", {}).values()), {}).get("value")


def _operations(openapi: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in openapi["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


@pytest.fixture
def openapi(api_client) -> dict[str, Any]:
    got = api_client.get("/openapi.json")
    assert got.status_code == 200
    return dict(got.json())


def test_every_operation_has_an_example_response_and_request_body(openapi):
    operations = list(_operations(openapi))
    assert len(operations) >= 14  # jobs (6), configs (3), misses, kernels, devices, health (2)
    for path, method, operation in operations:
        where = f"{method.upper()} {path}"
        ok = [code for code in operation["responses"] if code.startswith("2")]
        assert ok, where
        example = _media_example(openapi, operation["responses"][ok[0]].get("content", {}))
        assert isinstance(example, dict) and example, f"{where}: no response example"
        if "requestBody" in operation:
            body = _media_example(openapi, operation["requestBody"]["content"])
            assert isinstance(body, dict) and body, f"{where}: no request body example"


def test_the_examples_are_valid_instances_of_their_models(openapi):
    """An example that the API would reject (or could not produce) misleads: each model's
    example validates against the model itself. (The document drops an example's nulls, as
    FastAPI drops every null of it: the models' own examples are checked.)"""
    from pydantic import BaseModel

    from api import schemas

    checked = 0
    for name, schema in openapi["components"]["schemas"].items():
        model = getattr(schemas, name, None)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        examples = model.model_json_schema().get("examples", [])
        assert len(examples) == len(schema.get("examples", [])), name
        for example in examples:
            model.model_validate(example)
            checked += 1
    assert checked >= 12


def test_a_request_body_example_is_accepted_by_the_api(api_client, openapi):
    body = _media_example(openapi, openapi["paths"]["/api/v1/configs/query"]["post"]
                          ["requestBody"]["content"])
    got = api_client.post("/api/v1/configs/query", json=body)
    assert got.status_code == 200, got.text
    assert got.json()["data"][0]["match"] == "default" and got.json()["data"][0]["miss"]


def test_get_configs_declares_each_dimension_as_an_integer_query_parameter(openapi):
    operation = openapi["paths"]["/api/v1/configs"]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    for dim in ("M", "N", "K"):
        assert params[dim]["in"] == "query" and params[dim]["required"] is False
        assert params[dim]["schema"]["type"] == "integer"
        assert params[dim]["example"] == 4096
        assert "matmul" in params[dim]["description"]
    # moe_gemm's own dimensions are declared, but without an example: /docs fills examples
    # in, and E or TOPK would make the example matmul lookup a 422
    for dim in ("E", "TOPK"):
        assert params[dim]["in"] == "query" and "example" not in params[dim]
        assert "moe_gemm" in params[dim]["description"]
    assert params["E"]["schema"]["maximum"] == 256
    names = [p["name"] for p in operation["parameters"]]
    assert names[:6] == ["kernel", "dtype", "device", "kernel_version", "triton_version",
                         "timing"]
    assert names[6:9] == ["M", "N", "K"]
    assert "dimensions" not in params


def test_the_example_lookup_of_the_document_answers(api_client, api_db_url, openapi):
    """The query /docs sends from the examples (kernel, dtype, device, Triton, M, N, K) is a
    lookup the API answers: exact once that shape is tuned."""
    params = {p["name"]: example for p in openapi["paths"]["/api/v1/configs"]["get"]
              ["parameters"] if (example := _param_example(p)) is not None}
    assert params == {"kernel": "matmul", "dtype": "float16", "device": GPU,
                      "triton_version": "3.6.0", **EXAMPLE_SHAPE}
    assert api_client.get("/api/v1/configs", params=params).status_code == 404
    store(api_db_url, EXAMPLE_SHAPE, 0.2)
    got = api_client.get("/api/v1/configs", params=params)
    assert got.status_code == 200 and got.json()["match"] == "exact", got.text


def test_docs_and_redoc_reference_only_this_service(api_client):
    for page in ("/docs", "/redoc"):
        html = api_client.get(page)
        assert html.status_code == 200
        assert "http://" not in html.text and "https://" not in html.text, page
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js",
                  "favicon.png"):
        got = api_client.get(f"/docs-static/{asset}")
        assert got.status_code == 200 and len(got.content) > 1000, asset
    # ReDoc's script as shipped loads its sidebar logo from cdn.redoc.ly: not as served here
    redoc = api_client.get("/docs-static/redoc.standalone.js")
    assert "javascript" in redoc.headers["content-type"]
    assert "redocly logo" in redoc.text and REDOC_LOGO not in redoc.text


# -- in a browser with no network --------------------------------------------------------------

@pytest.fixture
def served(tmp_path) -> Iterator[dict[str, str]]:
    db = f"sqlite:///{tmp_path / 'docs.db'}"
    with running_app(Settings(database_url=db)) as base:
        yield {"base": base, "db": db}


@pytest.fixture
def offline_page(browser: Any, served: dict[str, str]) -> Iterator[Any]:
    """A page whose every request to anywhere but the service is aborted (and recorded in
    ``page.blocked``)."""
    context = browser.new_context(base_url=served["base"])
    blocked: list[str] = []

    def route(r: Any) -> None:
        if r.request.url.startswith(served["base"] + "/"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page, errors = new_page(context, console=False)
    page.blocked, page.page_errors = blocked, errors
    yield page
    context.close()


def test_docs_render_every_operation_with_no_network(offline_page, served):
    import httpx

    operations = list(_operations(httpx.get(f"{served['base']}/openapi.json").json()))
    offline_page.goto("/docs")
    offline_page.wait_for_selector(".opblock")
    blocks = offline_page.locator(".opblock")
    assert blocks.count() == len(operations)
    text = offline_page.locator(".swagger-ui").inner_text()
    for path, _, _ in operations:
        assert path in text
    assert "/api/v1/configs/stale" in text
    assert offline_page.blocked == [] and offline_page.page_errors == []


def test_try_it_out_sends_a_shape_to_get_configs(offline_page, served):
    store(served["db"], EXAMPLE_SHAPE, 0.2)
    # no deep link: its operation opens asynchronously, and a click racing it would close it
    offline_page.goto("/docs")
    block = offline_page.locator("#operations-configs-get_config_api_v1_configs_get")
    block.locator(".opblock-summary").first.click()
    block.locator(".try-out__btn").click()
    # every field is filled in from the document's examples: kernel, dtype, device, Triton
    # version and the example kernel's dimensions (no other kernel's)
    values = {name: block.locator(f'tr[data-param-name="{name}"] input').input_value()
              for name in ("kernel", "dtype", "device", "triton_version", "M", "N", "K", "E")}
    assert values == {"kernel": "matmul", "dtype": "float16", "device": GPU,
                      "triton_version": "3.6.0", "M": "4096", "N": "4096", "K": "4096", "E": ""}
    block.locator(".execute").click()
    url = block.locator(".request-url pre").inner_text()
    assert "M=4096" in url and "N=4096" in url and "K=4096" in url and "E=" not in url
    live = block.locator(".live-responses-table tbody .response-col_status").first
    assert live.inner_text().strip() == "200"
    assert '"match": "exact"' in block.locator(".live-responses-table").inner_text()
    assert offline_page.blocked == [] and offline_page.page_errors == []


def test_try_it_out_submits_the_example_job(offline_page, served):
    """POST /jobs's "Try it out" starts from the example body, which queues a job as is."""
    import httpx

    register_devices(served["db"], GPU)  # the example's device, as its worker registers it
    offline_page.goto("/docs")
    block = offline_page.locator("#operations-jobs-submit_job_api_v1_jobs_post")
    block.locator(".opblock-summary").first.click()
    block.locator(".try-out__btn").click()
    body = json.loads(block.locator("textarea.body-param__text").input_value())
    assert body["shapes"] == [EXAMPLE_SHAPE] and body["kernel"] == "matmul"
    block.locator(".execute").click()
    status = block.locator(".live-responses-table tbody .response-col_status").first
    assert status.inner_text().strip() == "202"
    [job] = httpx.get(f"{served['base']}/api/v1/jobs").json()["data"]
    assert (job["kernel"], job["device"], job["status"]) == ("matmul", GPU, "queued")
    assert [t["shape"] for t in job["tasks"]] == [EXAMPLE_SHAPE]
    assert offline_page.blocked == [] and offline_page.page_errors == []


#: the one request ReDoc's script as shipped makes elsewhere: the logo of its "API docs by
#: Redocly" link (the service serves the script without it)
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def test_redoc_renders_with_no_network(offline_page):
    offline_page.goto("/redoc")
    offline_page.get_by_text("Autotuning service for Triton kernels").first.wait_for()
    offline_page.get_by_text("/api/v1/configs/stale").first.wait_for(state="attached")
    # the logo is there, loaded without a request (before: it was removed once it failed)
    offline_page.wait_for_function(
        "() => document.querySelector('img[alt=\"redocly logo\"]')?.complete === true")
    assert offline_page.blocked == [] and offline_page.page_errors == []

