"""Splitting a model between the device and a cloud server: the cost model (`cost`),
the min-cut planner (`planner`), the plan report (`report`), and the device and cloud
packages with send/recv ops (`partition`).

scipy (the planner's max-flow) is imported only when a plan is made.
"""
from .cost import (COMPRESSIONS, LINKS, CostGraph, Link, Op, Profile, Tensor, measure_profile,
                   wire_bytes)
from .planner import OBJECTIVES, Placement, breakdown, cost, forced, on_device, plan

__all__ = ["COMPRESSIONS", "LINKS", "OBJECTIVES", "CostGraph", "Link", "Op", "Placement", "Profile",
           "Tensor", "breakdown", "cost", "forced", "measure_profile", "on_device", "plan",
           "wire_bytes"]
