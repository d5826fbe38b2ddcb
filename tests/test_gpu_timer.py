"""tuner.gpu_timer's spin: long enough for the host to get ahead of the GPU before a timed
run (its timing itself needs a GPU: bench/host_bound_timing.py)."""

from tuner import gpu_timer


def test_the_spin_covers_twice_the_slowest_enqueue_at_the_fastest_clock():
    cycles = gpu_timer.spin_cycles([12.0, 40.0, 25.0])
    # at 2.1 GHz (no SM runs faster) the spin lasts 2 x 40 us + the margin; slower, longer
    assert cycles / gpu_timer.SPIN_CYCLES_PER_US == 2 * 40.0 + gpu_timer.SPIN_MARGIN_US
    assert gpu_timer.spin_cycles([400.0]) > 2 * 400 * 2000  # 2 GHz: still over 800 us


def test_no_host_time_still_spins_the_margin():
    assert gpu_timer.spin_cycles([]) == int(gpu_timer.SPIN_MARGIN_US
                                            * gpu_timer.SPIN_CYCLES_PER_US)
