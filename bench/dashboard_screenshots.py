"""Screenshots of every dashboard page (docs/*.png), from a running service.

    python3 -m bench.dashboard_screenshots --base http://127.0.0.1:8900 --out docs

The committed ones were taken with the service on ``docs/dashboard_demo_h200.db``: the SQLite
file of a real ``tuner serve`` run on the H200 (``bench/dashboard_demo_data.sh``: five jobs,
seven matmul shapes and jobs of flash attention, softmax and conv2d), served on this CPU machine by
``TUNER_DATABASE_URL=sqlite:///docs/dashboard_demo_h200.db uvicorn api.app:app --port 8900``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8900")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    jobs = httpx.get(f"{args.base}/api/v1/jobs").json()["data"]
    pages = {"overview": "/", "jobs": "/jobs", "configs": "/configs",
             "kernel": "/kernels/matmul", "roofline": "/roofline", "stale": "/dashboard/stale",
             "compare": "/dashboard/compare?kernel=matmul&dtype=float16&shape=M=4096,N=4096,"
                        "K=4096"}
    if jobs:
        pages["job"] = f"/jobs/{jobs[-1]['id']}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        for name, path in pages.items():
            page.goto(args.base + path)
            page.wait_for_load_state("networkidle")
            page.wait_for_timeout(800)
            page.screenshot(path=str(out / f"dashboard_{name}.png"), full_page=name != "job")
            print(f"{name}: {path} -> {out / f'dashboard_{name}.png'}")
        browser.close()
    if errors:
        raise SystemExit(f"console errors: {errors}")


if __name__ == "__main__":
    main()
