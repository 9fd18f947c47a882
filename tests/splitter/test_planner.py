"""The planner against brute force over every assignment of small random DAGs."""
from dataclasses import replace

import numpy as np
import pytest

from edgeflow.errors import GraphError, InvalidInputError, PlacementError
from edgeflow.splitter import LINKS, CostGraph, CostOp, CostTensor, Link, cost, forced, plan

from .dags import brute_force, margin_choice, random_graph, random_link, simulated_memory

TOL = 1e-7  # the cut rounds capacities to 2**-30 of their sum


def _sides(bits, cg):
    return {op.name: "device" if b else "cloud" for op, b in zip(cg.ops, bits)}


def _case(seed, max_ops=10, overhead=False, **kw):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, max_ops + 1))
    return random_graph(rng, n, **kw), random_link(rng, overhead)


@pytest.mark.parametrize("objective", ["latency", "device-time"])
@pytest.mark.parametrize("compression", ["none", "fp16", "int8"])
def test_cut_is_the_brute_force_optimum(objective, compression):
    """With no margins, the plan is the optimum (the per-call overhead included)."""
    unique = 0
    for seed in range(40):
        cg, link = _case(seed, max_ops=12, overhead=True, compression=compression,
                         pin_rate=0.2 if seed % 2 else 0.0)
        A, valid, total = brute_force(cg, link, objective)
        if not valid.any():  # contradictory pins
            with pytest.raises(PlacementError):
                plan(cg, link, objective)
            continue
        best = total[valid].min()
        p = plan(cg, link, objective, margin=0, min_gain_s=0)
        bits = [p.side[op.name] == "device" for op in cg.ops]
        row = int(sum(1 << k for k, b in enumerate(bits) if b))
        assert valid[row], "the plan breaks a pin or sends a tensor back down"
        assert total[row] <= best * (1 + TOL) + 1e-12
        assert p.predicted["split"] == pytest.approx(total[row], rel=1e-9, abs=1e-15)
        ranked = np.sort(total[valid])
        if len(ranked) == 1 or ranked[1] > best * (1 + 1e-6) + 1e-12:
            unique += 1
            assert row == int(np.flatnonzero(valid & (total == best))[0])
    assert unique >= 20  # most cases have one best placement, and it was found


def test_cost_matches_the_reference_for_every_valid_placement():
    for seed in range(12):
        cg, link = _case(100 + seed, max_ops=7, pin_rate=0.2)
        for objective in ("latency", "device-time"):
            A, valid, total = brute_force(cg, link, objective)
            for bits, ok, want in zip(A, valid, total):
                if not ok:
                    continue
                assert cost(cg, link, _sides(bits, cg), objective) == pytest.approx(want, rel=1e-12)
                assert cost(cg, link, list(bits), objective) == pytest.approx(want, rel=1e-12)


def test_predicted_device_only_and_cloud_only():
    for seed in range(10):
        cg, link = _case(200 + seed, max_ops=8)
        A, valid, total = brute_force(cg, link, "latency")
        p = plan(cg, link)
        assert p.predicted["device_only"] == pytest.approx(total[-1], rel=1e-12)  # all bits set
        assert p.predicted["cloud_only"] == pytest.approx(total[0], rel=1e-12)  # no pins: none


def _chain(sizes, device_s, cloud_s, pinned=None):
    """x -> a0 -> a1 -> ...: tensor k holds sizes[k] float32 elements (x is sizes[0])."""
    tensors = [CostTensor("x", np.float32, (sizes[0],))]
    ops = []
    for k in range(len(device_s)):
        src = tensors[-1].name
        tensors.append(CostTensor(f"a{k}", np.float32, (sizes[k + 1],), is_output=k == len(device_s) - 1))
        ops.append(CostOp(f"a{k}", "op", [src], [f"a{k}"], device_s[k], cloud_s[k],
                      pinned=(pinned or {}).get(f"a{k}")))
    return CostGraph(ops, tensors)


def test_a_hand_computed_chain():
    # 8 Mbps both ways: 1 ms per 1000 B. x: 40000 B; a0, a1: 1000 B; a2: 40 B.
    # Device 10 ms per op, cloud 1 ms per op.
    link = Link(8e6, 8e6, 0.005)
    cg = _chain([10000, 250, 250, 10], [0.010, 0.010, 0.010], [0.001, 0.001, 0.001])
    p = plan(cg, link)
    # Cut after a0: 10 ms + up 1 ms + 2 ms on the cloud + down 0.04 ms + RTT 5 ms = 18.04 ms,
    # against 27.04 after a1, 30 on the device alone, 48.04 sending x.
    assert p.side == {"a0": "device", "a1": "cloud", "a2": "cloud"}
    assert p.cut_tensors == [("a0", 1000)]
    assert p.download_tensors == [("a2", 40)]
    assert p.predicted["split"] == pytest.approx(0.010 + 0.001 + 0.002 + 0.00004 + 0.005)
    assert p.predicted["device_only"] == pytest.approx(0.030)
    assert p.predicted["cloud_only"] == pytest.approx(0.040 + 0.003 + 0.00004 + 0.005)
    assert p.breakdown["up_bytes"] == 1000 and p.breakdown["rtt_s"] == 0.005
    # The RTT decides: at 20 ms (33.04 ms for the cut) nothing beats the device alone.
    slow = plan(cg, Link(8e6, 8e6, 0.020))
    assert set(slow.side.values()) == {"device"} and slow.cut_tensors == []
    assert slow.predicted["split"] == pytest.approx(0.030)
    # The device's busy time leaves out the cloud's compute and the RTT: 11.04 ms after a0.
    busy = plan(cg, Link(8e6, 8e6, 0.020), objective="device-time")
    assert busy.side == {"a0": "device", "a1": "cloud", "a2": "cloud"}
    assert busy.predicted["split"] == pytest.approx(0.010 + 0.001 + 0.00004)
    # int8 on the wire, both ways: a0 is 250 + 4 bytes, x 10000 + 4, the output a2 10 + 4.
    small = plan(cg.with_compression("int8"), link, margin=0, min_gain_s=0)
    assert small.cut_tensors == [("a0", 254)] and small.download_tensors == [("a2", 14)]
    assert small.predicted["split"] == pytest.approx(0.010 + 0.000254 + 0.002 + 0.000014 + 0.005)
    assert small.predicted["cloud_only"] == pytest.approx(0.010004 + 0.003 + 0.000014 + 0.005)
    # With the default margins that cut (17.27 ms) is not worth it against sending x
    # (18.02 ms): 0.75 ms is less than 10% and 1 ms. Cloud-only it is.
    assert set(plan(cg.with_compression("int8"), link).side.values()) == {"cloud"}


def test_a_tensor_is_sent_once_however_many_cloud_ops_read_it():
    # x -> a; a -> b, c, d (cloud-cheap), all outputs. Sending a once beats keeping b, c, d.
    t = [CostTensor("x", np.float32, (10,)), CostTensor("a", np.float32, (1000,))] + \
        [CostTensor(n, np.float32, (1,), is_output=True) for n in "bcd"]
    ops = [CostOp("a", "op", ["x"], ["a"], 0.001, 0.001, pinned="device")] + \
          [CostOp(n, "op", ["a"], [n], 0.004, 0.0, pinned=None) for n in "bcd"]
    cg = CostGraph(ops, t)
    link = Link(8e6, 1e9, 0.0)  # sending a: 4 ms; each of b, c, d costs 4 ms on the device
    p = plan(cg, link)
    assert p.side == {"a": "device", "b": "cloud", "c": "cloud", "d": "cloud"}
    assert p.cut_tensors == [("a", 4000)]
    assert p.predicted["split"] == pytest.approx(0.001 + 0.004 + 3 * 32 / 1e9)


def test_pins_are_honoured_and_contradictions_raise():
    link = Link(8e6, 8e6, 0.0)
    cg = _chain([1000, 10, 10, 10], [0.010] * 3, [0.001] * 3, pinned={"a1": "device"})
    p = plan(cg, link)
    assert p.side["a0"] == "device" and p.side["a1"] == "device"  # a1 needs a0
    cg = _chain([10, 10, 10, 10], [0.0] * 3, [0.010] * 3, pinned={"a0": "cloud"})
    assert plan(cg, link).side == {"a0": "cloud", "a1": "cloud", "a2": "cloud"}
    bad = _chain([10, 10, 10], [0.0] * 2, [0.0] * 2, pinned={"a0": "cloud", "a1": "device"})
    with pytest.raises(PlacementError, match="pinned to the cloud"):
        plan(bad, link)


def test_a_cloud_to_device_flow_is_not_a_placement():
    cg = _chain([10, 10, 10], [0.01, 0.01], [0.01, 0.01])
    with pytest.raises(PlacementError, match="reads 'a0', made on the cloud"):
        cost(cg, Link(1e6, 1e6, 0), {"a0": "cloud", "a1": "device"})
    with pytest.raises(InvalidInputError, match="side must be one of"):
        cost(cg, Link(1e6, 1e6, 0), {"a0": "cloud", "a1": "server"})
    with pytest.raises(InvalidInputError, match="missing"):
        cost(cg, Link(1e6, 1e6, 0), {"a0": "cloud"})
    with pytest.raises(InvalidInputError, match="objective"):
        plan(cg, Link(1e6, 1e6, 0), objective="energy")


def test_memory_budget_brute_force():
    """Within budget always; the Lagrangian search is a heuristic, yet on these seeded
    cases it finds the best placement within the budget in nearly all of them (measured
    189 of 192 over a wider run), never claims `exact` when it did not prove it."""
    found = cases = 0
    for seed in range(60):
        cg, link = _case(1000 + seed, max_ops=8, pin_rate=0.15, param_rate=0.7)
        objective = ("latency", "device-time")[seed % 2]
        A, valid, total = brute_force(cg, link, objective)
        if not valid.any():
            continue
        memory = np.array([simulated_memory(cg, list(a)) if ok else -1 for a, ok in zip(A, valid)])
        rng = np.random.default_rng(seed)
        budget = int(rng.uniform(memory[valid].min(), memory[valid].max() + 1))
        within = valid & (memory <= budget)
        best = total[within].min()
        p = plan(cg, link, objective, memory_budget=budget, margin=0, min_gain_s=0)
        bits = [p.side[op.name] == "device" for op in cg.ops]
        row = int(sum(1 << k for k, b in enumerate(bits) if b))
        assert within[row], (seed, p.device_memory, budget)
        assert p.device_memory == memory[row]
        assert total[row] >= best * (1 - TOL) - 1e-12
        cases += 1
        if total[row] <= best * (1 + TOL) + 1e-12:
            found += 1
        else:
            assert not p.exact, "a placement claimed optimal is not"
    assert cases >= 50 and found >= 0.9 * cases


def test_memory_budget_too_small_raises():
    cg = _chain([1000, 10, 10], [0.01, 0.01], [0.01, 0.01])
    with pytest.raises(PlacementError, match="needs 4000 bytes of device memory; the budget is 3999"):
        plan(cg, Link(1e6, 1e6, 0), memory_budget=3999)  # x alone is 4000 bytes
    assert plan(cg, Link(1e6, 1e6, 0), memory_budget=4000).side == {"a0": "cloud", "a1": "cloud"}


def test_forced_cut():
    # Diamond: x -> a; a -> b, c; (b, c) -> d.
    t = [CostTensor(n, np.float32, (s,), is_output=n == "d") for n, s in
         (("x", 100), ("a", 50), ("b", 20), ("c", 30), ("d", 5))]
    ops = [CostOp("a", "op", ["x"], ["a"], 0.01, 0.001), CostOp("b", "op", ["a"], ["b"], 0.01, 0.001),
           CostOp("c", "op", ["a"], ["c"], 0.01, 0.001), CostOp("d", "op", ["b", "c"], ["d"], 0.01, 0.001)]
    cg = CostGraph(ops, t)
    link = Link(1e6, 2e6, 0.01)
    p = forced(cg, ["b", "c"], link)
    assert p.side == {"a": "device", "b": "device", "c": "device", "d": "cloud"}
    assert p.cut_tensors == [("b", 80), ("c", 120)]
    assert p.predicted["split"] == pytest.approx(0.03 + 0.001 + 200 * 8 / 1e6 + 20 * 8 / 2e6 + 0.01)
    assert forced(cg, ["x"], link).side == {n: "cloud" for n in "abcd"}
    assert forced(cg, ["d"], link).side == {n: "device" for n in "abcd"}
    with pytest.raises(PlacementError, match=r"the cloud also needs \{'a': \['c'\]\}"):
        forced(cg, ["b"], link)
    with pytest.raises(InvalidInputError, match="unknown tensor"):
        forced(cg, ["nope"], link)
    pinned = CostGraph([ops[0], CostOp("b", "op", ["a"], ["b"], 0.01, 0.001, pinned="cloud")] + ops[2:], t)
    with pytest.raises(PlacementError, match="cloud-pinned"):
        forced(pinned, ["b", "c"], link)


def test_cost_graph_rejects_malformed_graphs():
    x = CostTensor("x", np.float32, (1,))
    y = CostTensor("y", np.float32, (1,))
    with pytest.raises(GraphError, match="unknown tensor 'z'"):
        CostGraph([CostOp("y", "op", ["z"], ["y"], 0, 0)], [x, y])
    with pytest.raises(GraphError, match="dependency order"):
        CostGraph([CostOp("z", "op", ["y"], ["z"], 0, 0), CostOp("y", "op", ["x"], ["y"], 0, 0)],
                  [x, y, CostTensor("z", np.float32, (1,))])
    with pytest.raises(GraphError, match="made by two ops"):
        CostGraph([CostOp("a", "op", ["x"], ["y"], 0, 0), CostOp("b", "op", ["x"], ["y"], 0, 0)], [x, y])
    with pytest.raises(InvalidInputError, match="pinned"):
        CostGraph([CostOp("y", "op", ["x"], ["y"], 0, 0, pinned="server")], [x, y])
    with pytest.raises(InvalidInputError, match="compression"):
        CostGraph([], [x], compression="zip")


@pytest.mark.parametrize("objective", ["latency", "device-time"])
@pytest.mark.parametrize("margin, min_gain_s", [(0.10, 0.001), (0.3, 0.0), (0.0, 0.01)])
def test_margins_against_brute_force(objective, margin, min_gain_s):
    """The plan is what the margin rule picks among device-only, cloud-only and the best
    two-sided cut, all costed by brute force with the per-call overhead (tests/splitter/dags.py)."""
    checked = chosen = refused = 0
    for seed in range(100):
        cg, link = _case(500 + seed, max_ops=10, overhead=True, pin_rate=0.2 if seed % 3 == 0 else 0.0)
        if seed % 2:  # big inputs, small activations: two-sided cuts pay
            cg = CostGraph(cg.ops, [replace(t, shape=(t.shape[0] * (20 if t.producer is None else 1),))
                                    for t in cg.tensors.values()])
        A, valid, total = brute_force(cg, link, objective)
        if not valid.any():
            continue
        want, closest = margin_choice(A, valid, total, margin, min_gain_s)
        if closest < 1e-9:  # on the threshold: the cut's rounding may go either way
            continue
        p = plan(cg, link, objective, margin=margin, min_gain_s=min_gain_s)
        row = int(sum(1 << k for k, op in enumerate(cg.ops) if p.side[op.name] == "device"))
        assert valid[row]
        assert total[row] == pytest.approx(total[want], rel=1e-7, abs=1e-12), seed
        assert p.predicted["split"] == pytest.approx(total[row], rel=1e-9, abs=1e-15)
        checked += 1
        two_sided = valid & (A.sum(axis=1) > 0) & (A.sum(axis=1) < A.sum(axis=1).max())
        two_sided[np.argmin(np.where(valid, A.sum(axis=1), len(cg.ops) + 1))] = False  # cloud-only
        chosen += bool(two_sided[want])
        refused += bool(not two_sided[want] and two_sided.any() and total[two_sided].min() < total[want])
    assert checked >= 80 and chosen >= 2 and refused >= 2  # the rule both splits and refuses


def test_a_cut_not_worth_its_round_trip_is_not_made():
    """Issue 17: with --objective device-time the planner put only the last op on the
    cloud to save a few microseconds of device time, paying a round trip. The round trip's
    overhead is device time too, and a split must beat device-only by the margins."""
    # x (400 kB) -> a0 (4 ms on the device) -> a1 (30 us), both 40 B.
    cg = _chain([100_000, 10, 10], [0.004, 0.00003], [0.0004, 0.000003])
    bare = Link(100e6, 100e6, 0.02, "no overhead")  # sending a0 3.2 us, a1 back 3.2 us
    with_overhead = Link(100e6, 100e6, 0.02, "3 ms per call", 0.003)
    # What the issue saw: a1 on the cloud saves 30 - 6.4 us of device time.
    was = plan(cg, bare, "device-time", margin=0, min_gain_s=0)
    assert was.side == {"a0": "device", "a1": "cloud"}
    assert was.predicted["device_only"] - was.predicted["split"] == pytest.approx(30e-6 - 6.4e-6)
    for link, margin, min_gain_s in ((with_overhead, 0, 0), (bare, 0.1, 0.001), (with_overhead, 0.1, 0.001)):
        p = plan(cg, link, "device-time", margin=margin, min_gain_s=min_gain_s)
        assert set(p.side.values()) == {"device"} and p.cut_tensors == [], (link, margin)
    assert set(plan(cg, bare, "device-time").side.values()) == {"device"}  # the defaults
    # The overhead is a round trip's cost in every objective, charged once.
    p = forced(cg, ["a0"], with_overhead, "device-time")
    assert p.breakdown["overhead_s"] == 0.003
    assert p.predicted["split"] == pytest.approx(0.004 + 6.4e-6 + 0.003)
    p = forced(cg, ["a0"], with_overhead, "latency")
    assert p.predicted["split"] == pytest.approx(0.004 + 6.4e-6 + 0.000003 + 0.02 + 0.003)
    assert p.predicted["device_only"] == pytest.approx(0.00403)


def test_the_issue_split_of_resnet_is_no_longer_made(tmp_path):
    """Issue 17's case end to end: the test ResNet on a device at 1/5 of this machine over
    4G, --objective device-time. Without the overhead and the margins the planner sent only
    the final Add (the logits) to the cloud, to save 0.03 ms of a 9.6 ms device time."""
    import pathlib

    from edgeflow.converters import onnx as onnx_converter
    from edgeflow.splitter.package import split_file
    onnx_converter.convert(pathlib.Path(__file__).parents[1] / "data" / "onnx" / "resnet.onnx", tmp_path / "r.efl")
    result = split_file(tmp_path / "r.efl", tmp_path / "out", link="4g", objective="device-time",
                        device_speed=0.2)
    assert set(result.placement.side.values()) == {"device"}
    bare = plan(result.cost_graph, Link(5.85e6, 20e6, 0.06), "device-time", margin=0, min_gain_s=0)
    assert bare.cloud_ops == ["logits"]  # what main chose
    assert bare.predicted["device_only"] - bare.predicted["split"] < 1e-4
