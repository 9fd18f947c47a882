"""Per-op timing of invocations; the splitter's cost model reads it."""
import time
from dataclasses import dataclass


@dataclass
class OpRecord:
    index: int
    opcode: str
    output: str
    calls: int = 0
    total_ns: int = 0
    output_bytes: int = 0

    @property
    def mean_us(self):
        return self.total_ns / max(self.calls, 1) / 1e3


class Profiler:
    def __init__(self):
        self.records = {}

    def run(self, plan):
        """Run `plan` once, timing every step."""
        clock, records = time.perf_counter_ns, self.records
        for step, i, arrays in plan.each_step():
            t0 = clock()
            step()
            elapsed = clock() - t0
            rec = records.get(i)
            if rec is None:
                op = plan.subgraph.operators[i]
                name = plan.subgraph.tensors[op.outputs[0]].name if op.outputs else f"{op.opcode}#{i}"
                rec = records[i] = OpRecord(i, op.opcode, name,
                                            output_bytes=sum(arrays[t].nbytes for t in op.outputs))
            rec.calls += 1
            rec.total_ns += elapsed

    def top(self, n=None):
        """Records sorted by total time, largest first."""
        return sorted(self.records.values(), key=lambda r: -r.total_ns)[:n]

    def by_opcode(self):
        """{opcode: (calls, total_ns)} summed over ops of that type."""
        out = {}
        for r in self.records.values():
            calls, total = out.get(r.opcode, (0, 0))
            out[r.opcode] = (calls + r.calls, total + r.total_ns)
        return out
