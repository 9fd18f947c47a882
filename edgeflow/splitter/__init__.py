"""Splitting a model between the device and a cloud server: the network (`links`), op
times measured or estimated (`profiles`), the cost graph (`cost_graph`), the min-cut
planner (`planner`), the plan report (`report`), and the device and cloud packages with
send/recv ops (`partition`).

scipy (the planner's max-flow) is imported only when a plan is made.
"""
from .cost_graph import CostGraph, CostOp, CostTensor
from .links import COMPRESSIONS, LINKS, Link, wire_bytes
from .planner import OBJECTIVES, Placement, breakdown, cost, forced, on_device, plan, worth
from .profiles import Profile, measure_profile, op_name

__all__ = ["COMPRESSIONS", "LINKS", "OBJECTIVES", "CostGraph", "CostOp", "CostTensor", "Link",
           "Placement", "Profile", "breakdown", "cost", "forced", "measure_profile", "on_device",
           "op_name", "plan", "wire_bytes", "worth"]
