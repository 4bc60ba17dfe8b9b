"""Constants the torch-free command and plugin modules repeat stay equal to their sources."""


def test_thresholds_and_alignment_match_their_sources():
    from latch_check import commands, gates, simulator

    assert commands.FP64_THRESHOLD == gates.FP64_THRESHOLD
    assert commands.SIM_THRESHOLD == simulator.SIM_THRESHOLD
