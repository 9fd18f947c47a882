"""Split training: ops that read one variable run on one side (issue 17, finding 5). The
planner takes them as a constraint of the cut (against brute force over every assignment),
and a forced cut that separates them says which variable, which ops, and what to do."""
import numpy as np
import pytest

from edgeflow.errors import PlacementError
from edgeflow.splitter import plan

from .dags import brute_force, random_graph, random_link


def _groups(cg):
    readers = {}
    for op in cg.ops:
        for name in op.params:
            readers.setdefault(name, []).append(op.index)
    return [r for r in readers.values() if len(r) > 1]


@pytest.mark.parametrize("objective", ["latency", "device-time"])
def test_ops_sharing_a_weight_stay_together_at_the_brute_force_optimum(objective):
    constrained = 0  # margins off: this is about the constraint, the optimum without them
    for seed in range(80):
        rng = np.random.default_rng(seed)
        cg = random_graph(rng, int(rng.integers(2, 11)), pin_rate=0.1 if seed % 2 else 0.0, param_rate=0.8)
        link = random_link(rng)
        together = _groups(cg)
        A, valid, total = brute_force(cg, link, objective)
        for group in together:  # the reference: assignments keeping each group on one side
            valid &= A[:, group].all(1) | ~A[:, group].any(1)
        if not valid.any():
            with pytest.raises(PlacementError):
                plan(cg, link, objective, together=together, margin=0, min_gain_s=0)
            continue
        p = plan(cg, link, objective, together=together, margin=0, min_gain_s=0)
        bits = [p.side[op.name] == "device" for op in cg.ops]
        row = int(sum(1 << k for k, b in enumerate(bits) if b))
        assert valid[row], "the plan separates ops that share a weight, breaks a pin or sends a tensor down"
        assert total[row] <= total[valid].min() * (1 + 1e-7) + 1e-12
        assert p.predicted["split"] == pytest.approx(total[row], rel=1e-9, abs=1e-15)
        _, free_valid, free_total = brute_force(cg, link, objective)
        constrained += free_total[free_valid].min() < total[valid].min() * (1 - 1e-6)
    assert constrained >= 3  # the constraint decided some of the cases
