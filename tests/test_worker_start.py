"""A worker's start (issue 33): one measuring child gives the fingerprint and, when the store
has no recent calibration of the device, calibrates; a recent one is reused, not re-measured,
and reusing it does not make it look newer. Real SQLite stores; the GPU backend is the one
thing faked (a CUDA child cannot start here): ``prestart`` returns it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import update

from db import repo
from db.engine import init_db
from db.models import Device, utcnow
from tuner.app.service import _register_device, _start_measuring, _stored_calibration
from tuner.device import DeviceFingerprint
from tuner.settings import Settings

FP = DeviceFingerprint(kind="cuda", name="NVIDIA H100 80GB HBM3", compute_capability="9.0",
                       sm_count=132, memory_bytes=80 << 30, triton_version="3.6.0")
CALIBRATION = {"copy_gbps": 3020.5, "matmul_tflops": 720.1, "copy_gbps_spread": 0.01,
               "matmul_tflops_spread": 0.02, "runs": 5}


class _Backend:
    fingerprint = FP
    start_seconds = {"child": 2.5, "pool_first": 3.0}

    def __init__(self) -> None:
        self.calibrations = 0

    def calibrate(self) -> dict[str, Any]:
        self.calibrations += 1
        return dict(CALIBRATION)


class _Worker:
    device_index = 0
    keeper = None  # the backend is not started ahead of _start_measuring here

    def __init__(self) -> None:
        self.backend = _Backend()

    def prestart(self) -> _Backend:
        return self.backend


def test_a_fresh_store_is_calibrated_in_the_workers_own_child_then_reused(tmp_path):
    factory = init_db(f"sqlite:///{tmp_path / 'start.db'}")
    settings = Settings(calibration_max_age_hours=24)
    first = _Worker()
    fp, calibration, steps = _start_measuring(factory, first, settings)
    assert fp is FP and first.backend.calibrations == 1
    assert calibration["copy_gbps"] == 3020.5 and not calibration.get("reused")
    assert set(steps) == {"child_and_pool", "child", "pool_first", "calibration"}
    _register_device(factory, fp, calibration)
    with factory() as session:
        calibrated_at = repo.get_device(session, FP.key).calibrated_at

    second = _Worker()  # a restart on the same store
    _fp, again, _steps = _start_measuring(factory, second, settings)
    assert second.backend.calibrations == 0
    assert again["reused"] and again["copy_gbps"] == 3020.5 and again["matmul_tflops"] == 720.1
    _register_device(factory, FP, again)
    with factory() as session:  # reusing it does not make it newer
        assert repo.get_device(session, FP.key).calibrated_at == calibrated_at


def test_an_old_calibration_or_a_max_age_of_zero_is_measured_again(tmp_path):
    factory = init_db(f"sqlite:///{tmp_path / 'old.db'}")
    _register_device(factory, FP, dict(CALIBRATION))
    assert _stored_calibration(factory, FP.key, 24) is not None
    assert _stored_calibration(factory, FP.key, 0) is None
    assert _stored_calibration(factory, "cuda:another GPU:sm80", 24) is None
    with factory() as session:
        session.execute(update(Device).where(Device.key == FP.key)
                        .values(calibrated_at=utcnow() - timedelta(hours=25)))
        session.commit()
    assert _stored_calibration(factory, FP.key, 24) is None
    worker = _Worker()
    _start_measuring(factory, worker, Settings(calibration_max_age_hours=24))
    assert worker.backend.calibrations == 1
