"""What a piece of code asks of the device: every aten operator it dispatches (each one a
kernel launch on a GPU, or a view the dispatcher still walks through) and every call that
makes the host wait until the device has finished (a host synchronisation).

Both are properties of the code, not of the device, so a CPU run counts them as a GPU run
would: ``DispatchCount`` is a ``TorchDispatchMode`` (it sees each operator) together with a
``TorchFunctionMode`` (it sees the tensor methods that read values back to the host).

A synchronisation is counted when the code

- reads a value on the host: ``Tensor.item``, ``tolist``, ``__bool__``, ``__int__``,
  ``__float__``, ``__index__``, ``__format__``, ``cpu`` (on a CPU these are free; on a GPU
  each waits for the queue). ``numpy`` is not one: it takes a tensor on the host only, so
  on a GPU the wait was the copy that brought the values there (``cpu``, counted once);
- copies a tensor between devices without ``non_blocking=True`` (only a run on a GPU has
  two devices to see this);
- dispatches an operator whose result's size depends on the data (``nonzero``, ``unique``,
  ``masked_select``, ``repeat_interleave`` without ``output_size``, ``bincount``, indexing
  with a boolean mask) or that returns a Python value (``_local_scalar_dense``, ``equal``).

Kernels that wait inside their own implementation (none of which the training step uses)
cannot be seen from Python.
"""

from __future__ import annotations

import collections
import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__format__", "cpu"})
DEVICE_COPIES = frozenset({"to", "cuda", "copy_"})
DATA_DEPENDENT_OPERATORS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.nonzero",
        "aten.argwhere",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.unique_dim_consecutive",
        "aten.masked_select",
        "aten.bincount",
        "aten.equal",
    }
)
INDEXING_OPERATORS = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})


class DispatchCount:
    """Counts, while active, the operators dispatched (``operators``, by overload name; of
    which ``views``, the operators that return a view and launch no kernel) and the host
    synchronisations (``synchronisations``, by what caused them).

        with DispatchCount() as count:
            step()
        count.total_operators, count.total_views, count.total_synchronisations

    ``paused()`` stops counting for a block (host-side work such as gathering a batch).
    """

    def __init__(self):
        self.operators: collections.Counter[str] = collections.Counter()
        self.views: collections.Counter[str] = collections.Counter()
        self.synchronisations: collections.Counter[str] = collections.Counter()
        self._paused = False
        self._in_host_read = False
        self._modes = (_FunctionCount(self), _OperatorCount(self))

    @property
    def total_operators(self) -> int:
        return sum(self.operators.values())

    @property
    def total_views(self) -> int:
        return sum(self.views.values())

    @property
    def total_synchronisations(self) -> int:
        return sum(self.synchronisations.values())

    def __enter__(self) -> "DispatchCount":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    @contextlib.contextmanager
    def paused(self):
        paused, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = paused

    def _host_read(self, name: str, call):
        """Count one host read; the ``_local_scalar_dense`` it dispatches is the same wait."""
        if not self._paused and not self._in_host_read:
            self.synchronisations[f"Tensor.{name}"] += 1
        nested, self._in_host_read = self._in_host_read, True
        try:
            return call()
        finally:
            self._in_host_read = nested


class _FunctionCount(TorchFunctionMode):
    def __init__(self, count: DispatchCount):
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in HOST_READS and getattr(func, "__qualname__", "").startswith(("TensorBase.", "Tensor.")):
            return self.count._host_read(name, lambda: func(*args, **kwargs))
        result = func(*args, **kwargs)
        if (
            name in DEVICE_COPIES
            and not self.count._paused
            and _blocking_copy_between_devices(name, args, kwargs, result)
        ):
            self.count.synchronisations[f"Tensor.{name} between devices, blocking"] += 1
        return result


class _OperatorCount(TorchDispatchMode):
    def __init__(self, count: DispatchCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        count = self.count
        if not count._paused:
            count.operators[str(func)] += 1
            if func.is_view:
                count.views[str(func)] += 1
            packet = str(func.overloadpacket)
            if packet in DATA_DEPENDENT_OPERATORS and not (
                packet == "aten._local_scalar_dense" and count._in_host_read
            ):
                count.synchronisations[packet] += 1
            elif packet == "aten.repeat_interleave" and kwargs.get("output_size") is None and _has_tensor_repeats(args):
                count.synchronisations[f"{packet} without output_size"] += 1
            elif packet in INDEXING_OPERATORS and _has_mask_index(args):
                count.synchronisations[f"{packet} with a boolean mask"] += 1
        return func(*args, **kwargs)


def _blocking_copy_between_devices(name: str, args, kwargs, result) -> bool:
    """Whether a ``to`` / ``cuda`` / ``copy_`` call copied between devices without
    ``non_blocking=True``."""
    if kwargs.get("non_blocking", False) or any(a is True for a in args[2:]):
        return False
    if name == "copy_":
        source, target = (args[1] if len(args) > 1 else kwargs.get("src")), args[0]
    else:
        source, target = args[0], result
    return isinstance(source, torch.Tensor) and isinstance(target, torch.Tensor) and source.device != target.device


def _has_tensor_repeats(args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.dim() > 0 for a in args[:2])


def _has_mask_index(args) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
