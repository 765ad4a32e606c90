"""Communication component: timed AllReduce of gradient buckets, with or without DDP.

With DDP the recorder is the state of a comm hook, so each bucket's collective is timed exactly
where DDP issues it. In `comm` mode the model's real bucket sizes are reduced without any
compute, in one of three patterns (whole world per bucket, within subgroups, or merged into
per-layer-group segments). On CUDA a start event is recorded on the current stream before the
collective, and the end event inside the future's callback: the callback's stream is made to wait
for the collective, so the pair brackets the GPU-side duration.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from codl.spec import CommPattern, RunSpec
from codl.trace.clock import now_ns
from codl.trace.schema import Table, empty_columns

SEGMENTS = 4


def cuda_event_pair(enabled: bool) -> tuple[Any, Any] | None:
    """Two timing CUDA events to bracket work on the current stream; None when not timing."""
    if not enabled:
        return None
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


@dataclass
class CommRecorder:
    rank: int = 0
    step: int = -1
    rows: dict[str, list[Any]] = field(default_factory=lambda: empty_columns(Table.COMM))
    gpu_rows: dict[str, list[Any]] = field(default_factory=lambda: empty_columns(Table.COMM_GPU))
    _pending: list[tuple[int, Any, Any]] = field(default_factory=list)
    _bucket_in_step: int = 0

    def record(
        self, op: str, nbytes: int, start: int, end: int, events: tuple[Any, Any] | None
    ) -> int:
        r = self.rows
        r["rank"].append(self.rank)
        r["step"].append(self.step)
        r["bucket"].append(self._bucket_in_step)
        self._bucket_in_step += 1
        r["bytes"].append(nbytes)
        r["start_ns"].append(start)
        r["end_ns"].append(end)
        r["gpu_ns"].append(-1)
        r["op"].append(op)
        idx = len(r["step"]) - 1
        if events is not None:
            self._pending.append((idx, events[0], events[1]))
        return idx

    def set_end(self, idx: int, end: int) -> None:
        self.rows["end_ns"][idx] = end

    def flush(self, step: int, ref: tuple[int, Any] | None = None) -> None:
        """Called after the step's synchronisation: every collective of the step has finished.

        ``ref`` (host ns, CUDA event recorded then on an idle GPU: the step's start) places
        each bucket's GPU start on the host clock (``events/comm_gpu``): ranks of a node then
        compare GPU arrivals on one clock (analysis.decompose).
        """
        g = self.gpu_rows
        for idx, start, end in self._pending:
            gpu_ns = round(start.elapsed_time(end) * 1e6)
            self.rows["gpu_ns"][idx] = gpu_ns
            if ref is not None:
                t0 = ref[0] + round(ref[1].elapsed_time(start) * 1e6)
                g["rank"].append(self.rank)
                g["step"].append(self.rows["step"][idx])
                g["bucket"].append(self.rows["bucket"][idx])
                g["start_ns"].append(t0)
                g["end_ns"].append(t0 + gpu_ns)
        self._pending.clear()
        self._bucket_in_step = 0

    @property
    def ops(self) -> list[str]:
        return self.rows["op"]

    @staticmethod
    def ddp_hook(
        state: "CommRecorder",
        bucket: dist.GradBucket,  # type: ignore[name-defined]  # missing from torch stubs
    ) -> torch.futures.Future[torch.Tensor]:
        # No postponed annotations in this module: DDP inspects this signature at runtime and
        # accepts only the real dist.GradBucket class as the bucket's annotation.
        buf = bucket.buffer()
        ev = cuda_event_pair(buf.is_cuda)
        t0 = now_ns()
        if ev:
            ev[0].record()
        idx = state.record("allreduce", buf.numel() * buf.element_size(), t0, t0, ev)
        world = dist.get_world_size()
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            if ev:
                ev[1].record()
            state.set_end(idx, now_ns())
            return f.value()[0].div_(world)

        return fut.then(done)


def subgroups(world: int) -> list[list[int]]:
    """Split the world into halves (pairs for 2-4 ranks) for the `subgroups` pattern."""
    size = max(1, world // 2)
    return [list(range(i, min(i + size, world))) for i in range(0, world, size)]


def comm_group(spec: RunSpec) -> Any:
    """The process group `comm` mode reduces over: the world, or this rank's subgroup."""
    if spec.layout.comm_pattern is not CommPattern.SUBGROUPS:
        return None
    rank = dist.get_rank()
    mine = None
    # new_group is collective: every rank must create every group, in the same order.
    for members in subgroups(dist.get_world_size()):
        group = dist.new_group(members)
        if rank in members:
            mine = group
    return mine


def prepare_tensors(
    sizes: Sequence[int], spec: RunSpec, device: torch.device
) -> list[torch.Tensor]:
    if spec.layout.comm_pattern is CommPattern.SEGMENTED:
        # Merge consecutive buckets into a few per-layer-group segments.
        per = max(1, -(-len(sizes) // SEGMENTS))
        sizes = tuple(sum(sizes[i : i + per]) for i in range(0, len(sizes), per))
    return [torch.empty(int(n), device=device, dtype=torch.float32) for n in sizes]


def run_comm_step(
    tensors: list[torch.Tensor], spec: RunSpec, rec: CommRecorder, *, cuda: bool, group: Any
) -> None:
    """One step of `comm` mode: every tensor reduced once, each collective timed."""
    rank = dist.get_rank()
    pattern = spec.layout.comm_pattern
    op = {
        CommPattern.BUCKETS: "allreduce",
        CommPattern.SUBGROUPS: "group_allreduce",
        CommPattern.SEGMENTED: "segment_allreduce",
    }[pattern]
    for t in tensors:
        # Known input (rank + 1) so the result is checkable: sum over the group.
        t.fill_(rank + 1)
        ev = cuda_event_pair(cuda and spec.trace.cuda_events)
        t0 = now_ns()
        if ev:
            ev[0].record()
        dist.all_reduce(t, group=group)
        if ev:
            ev[1].record()
        rec.record(op, t.numel() * t.element_size(), t0, now_ns(), ev)
