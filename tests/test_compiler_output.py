"""A failed compile's printed output reaches a worker's log cut to a few lines with a note
(issue 32, item 8): Triton prints the whole PTX (~1,200 lines) of each config ptxas rejects."""

from __future__ import annotations

import pytest

from tests.fakes.faulty import COMPILE_ERROR, GOOD, NOISY, PTX_LINES
from tuner.backends.compiler_output import KEPT_LINES, shortened
from tuner.config import KernelConfig


def _check_log(out: str) -> None:
    assert "`ptxas` failed with error code 255" in out
    assert "Unresolved extern function 'nope'" in out  # ptxas's own line is kept
    assert "PTX line 0" in out and f"PTX line {PTX_LINES - 1}" not in out
    assert "more lines of the compiler's output for MODE=7,SLOW=1 left out of the log" in out
    assert len(out.splitlines()) < 40


def test_shortened_keeps_the_first_lines_and_says_how_many_were_left_out():
    text = "\n\nerror\n" + "\n".join(f"line {i}" for i in range(100))
    kept = shortened(text, "MODE=7")
    lines = kept.splitlines()
    assert lines[0] == "error" and len(lines) == KEPT_LINES + 1
    assert lines[-1] == "[... 89 more lines of the compiler's output for MODE=7 left out of " \
                        "the log]"
    assert shortened("one\ntwo\n", "x") == "one\ntwo\n"


@pytest.mark.timeout(120)
def test_the_compile_pool_cuts_a_failed_compiles_output(capfd):
    from tuner.backends.compile_pool import CompilePool

    pool = CompilePool("interpret", NOISY.ref, {"N": 64}, "float32", 1, 30.0)
    try:
        pool.submit([KernelConfig(MODE=COMPILE_ERROR, SLOW=1), KernelConfig(MODE=GOOD, SLOW=1)])
        done = []
        while len(done) < 2:
            done += pool.poll(10.0)
    finally:
        pool.close()
    out = capfd.readouterr().out
    _check_log(out)
    assert "compiled\nfine\nhere" in out  # a compile that worked prints what it prints


@pytest.mark.timeout(120)
def test_the_measuring_child_cuts_a_failed_configs_output(capfd):
    from tuner.backends import TimingOptions
    from tuner.backends.process import ChildProcess

    child = ChildProcess("interpret", 0, start_timeout_s=120)
    try:
        child.send(("setup", NOISY.ref, {"N": 64}, "float32", 0))
        assert child.receive(120) == ("ok",)
        child.send(("measure", [KernelConfig(MODE=COMPILE_ERROR, SLOW=1)], TimingOptions()))
        reply = child.receive(120)
        while reply[0] == "compiled":
            reply = child.receive(120)
        assert reply[0] == "result" and reply[1] == 0 and not reply[2].ok
    finally:
        child.kill()
    _check_log(capfd.readouterr().out)
