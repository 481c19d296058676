"""The routing-locality what-if (moespac/experiments/whatif.py): its axis, its direction, and its errors."""

import pytest

from moespac.errors import MoespacError
from moespac.experiments.whatif import LocalitySweep, ratio_to_best_other, run_locality_sweep


def test_more_local_routing_means_fewer_distinct_experts_and_more_moespac_hits():
    cfg = LocalitySweep(skews=(0.0, 4.0), methods=("moespac", "llamacpp"), tokens=24)
    record = run_locality_sweep(cfg)
    assert record["timing"] == "simulated" and record["config"]["skews"] == (0.0, 4.0)
    uniform, (flat, peaked) = record["metrics"]["uniform_distinct"], record["metrics"]["rows"]
    assert uniform == pytest.approx(128 * (1 - (1 - 8 / 128) ** 9))
    assert flat["distinct"] == pytest.approx(uniform, rel=0.03)  # skew 0: uniform routing
    assert peaked["distinct"] < 0.5 * flat["distinct"]
    assert peaked["methods"]["moespac"]["hit_rate"] > flat["methods"]["moespac"]["hit_rate"] + 0.2
    r = ratio_to_best_other(peaked)
    assert r == peaked["methods"]["moespac"]["tokens_per_s"] / peaked["methods"]["llamacpp"]["tokens_per_s"]
    # the long-form CSV like every table's: one row per trace and method, the same numbers, its timing label
    from moespac.analysis.whatif_page import locality_frame

    frame = locality_frame(record)
    assert (len(frame) == 4 and set(frame["timing"]) == {"simulated"}
            and set(frame["label"]) == {"MoE-SpAc", "llama.cpp"})
    got = frame.set_index(["trace", "method"])["tps"].to_dict()
    assert got == {(row["trace"], m): v["tokens_per_s"]
                   for row in record["metrics"]["rows"] for m, v in row["methods"].items()}


@pytest.mark.parametrize("options, key", [(dict(skews=()), "skews"), (dict(skews=(-1.0,)), "skews"),
                                          (dict(cache_ratio=1.5), "cache_ratio"), (dict(accept=2.0), "accept")])
def test_bad_sweep_settings_name_the_key(options, key):
    with pytest.raises(MoespacError, match=f"'{key}'"):
        LocalitySweep(**options)


def test_unknown_method_is_named():
    with pytest.raises(MoespacError, match="nope"):
        LocalitySweep(methods=("nope",))
