"""Running the package's code at a scale this machine cannot hold: large tensors are torch's fake tensors (shapes and
dtypes, no data), small ones stay real, and one dispatch mode counts the bytes every operation allocates.

`PaperScaleMode` (a `TorchDispatchMode`) sees every aten operation:

* an operation with a fake argument runs under torch's `FakeTensorMode` (its output is fake). A boolean index that is
  real (a completion mask) is first turned into the positions it selects, as aten itself does, so that the output
  shape is known; `torch.equal` of two fake tensors is answered from their shapes and dtypes, and a scalar read off a
  fake tensor (`.item()`) is answered with 1 and counted (`answered_reads`): on the paths measured here such values
  set numbers, never shapes;
* an operation on real tensors only runs for real, unless its output would exceed `real_limit` bytes (asked of
  `FakeTensorMode` first): then its fake output is returned (transformers' 4-D attention masks at 16k tokens). A real
  buffer allocated uninitialised (`torch.empty`) is zeroed: fake values copied into it write nothing. With
  `real_limit=None` every such operation runs for real (the mode then only counts).

Every output that does not alias an input (the aten schema says which) is a new allocation: its storage's bytes are
added to the live total until the storage is freed (a weak reference). `peak` is the largest live total reached
inside the mode, `live` the total still held when it exits: both count only what was allocated inside, so tensors
that existed before (the model's weights, the batch) cost nothing. A real tensor and a fake one of the same shape
count the same bytes.
"""

from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten
_INDEXING = (aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default)
_UNINITIALISED = (
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
)


class PaperScaleMode(TorchDispatchMode):
    """Real where small, fake where large, every allocation counted (see the module docstring)."""

    def __init__(self, fake_mode: FakeTensorMode, real_limit: int | None = 64 << 20):
        super().__init__()
        self.fake_mode = fake_mode
        self.real_limit = real_limit
        self.live = 0
        self.peak = 0
        self.answered_reads = 0
        self._by_id: dict[int, weakref.ref] = {}  # storage id -> weak reference, to count each storage once
        self._alive: set[weakref.ref] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(isinstance(leaf, FakeTensor) for leaf in pytree.tree_leaves((args, kwargs))):
            output = self._fake(func, args, kwargs)
        else:
            output = self._real_unless_large(func, args, kwargs)
        if all(result.alias_info is None for result in func._schema.returns):
            self._count(output)
        return output

    def _fake(self, func, args, kwargs):
        if func is aten.equal.default:
            return args[0].shape == args[1].shape and args[0].dtype == args[1].dtype
        if func is aten._local_scalar_dense.default:
            self.answered_reads += 1
            return True if args[0].dtype == torch.bool else 1
        if func in _INDEXING:
            args = (args[0], _positions(args[1]), *args[2:])
        with self.fake_mode:
            return func(*args, **kwargs)

    def _real_unless_large(self, func, args, kwargs):
        if self.real_limit is None:
            return func(*args, **kwargs)
        try:
            with _disable_current_modes(), self.fake_mode:
                sized = func(*args, **kwargs)
        except Exception:  # data-dependent output (nonzero, unique, item): only the real operation can tell
            return func(*args, **kwargs)
        if _bytes(sized) > self.real_limit:
            return sized
        output = func(*args, **kwargs)
        if func in _UNINITIALISED:
            # A real buffer that fake values are later copied into keeps what it was allocated with; zeros, not
            # whatever memory it reused, so that a comparison of two such buffers (the recorders' `torch.equal`)
            # answers the same on every run.
            output.zero_()
        return output

    def _count(self, output) -> None:
        for tensor in pytree.tree_leaves(output):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            known = self._by_id.get(id(storage))
            if known is not None and known() is storage:
                continue
            size = storage.nbytes()
            self.live += size
            self.peak = max(self.peak, self.live)
            reference = weakref.ref(storage, functools.partial(self._free, id(storage), size))
            self._by_id[id(storage)] = reference
            self._alive.add(reference)  # a weak reference fires its callback only while it is itself alive

    def _free(self, key: int, size: int, reference: weakref.ref) -> None:
        self.live -= size
        self._alive.discard(reference)
        if self._by_id.get(key) is reference:  # the id may already name a newer storage
            del self._by_id[key]


def _positions(indices):
    """aten's indices with each real boolean mask replaced by the positions it selects (one long tensor a dimension)."""
    positions = []
    for index in indices:
        if index is not None and index.dtype == torch.bool and not isinstance(index, FakeTensor):
            positions.extend(index.nonzero().unbind(1))
        else:
            positions.append(index)
    return positions


def _bytes(output) -> int:
    return sum(t.untyped_storage().nbytes() for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))


class Measurement:
    """What one measured block allocated and computed: peak and still-held bytes above its start, matmul FLOPs."""

    def __init__(self):
        self.peak = 0
        self.held = 0
        self.flops = 0
        self.answered_reads = 0


@contextmanager
def measured(fake_mode: FakeTensorMode, real_limit: int | None = 64 << 20):
    """Yield a `Measurement` filled in when the block exits: torch's `FlopCounterMode` (matrix products and attention)
    around a `PaperScaleMode` (`real_limit=None`: every real operation runs for real)."""
    result = Measurement()
    counter = FlopCounterMode(display=False)
    mode = PaperScaleMode(fake_mode, real_limit)
    with counter, mode:
        yield result
    result.peak, result.held, result.flops, result.answered_reads = (
        mode.peak,
        mode.live,
        counter.get_total_flops(),
        mode.answered_reads,
    )


def partition_like_zero3(parameter: torch.nn.Parameter, ds_id: int) -> None:
    """Make `parameter` look to `deepspeed.zero.GatheredParameters` like a ZeRO-3 partition (`ds_id`, `ds_shape`)
    whose gather allocates the whole tensor, as DeepSpeed's `all_gather` does, and whose release frees it again.

    The tensor held before (created outside any measurement) stands for the shard this process keeps: the package's
    `full_lm_head` then takes its ZeRO-3 branch, and the gathered copy is what a measurement counts.
    """
    resident = parameter.data
    parameter.ds_id, parameter.ds_shape = ds_id, resident.shape

    def all_gather(param_list):
        for p in param_list:
            p.data = torch.empty_like(p.ds_resident)

    def partition(param_list, has_been_updated=False):
        for p in param_list:
            p.data = p.ds_resident

    parameter.ds_resident, parameter.all_gather, parameter.partition = resident, all_gather, partition
