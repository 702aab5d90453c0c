"""Forward-pass checks that keep the host off the critical path.

A check such as ``if not torch.isfinite(x).all(): raise ...`` makes the host
wait for the device (``bool(tensor)``) and breaks ``torch.compile(fullgraph=
True)``. :func:`assert_true` asks the device instead: on a GPU it is an
asynchronous device-side assert (no sync), on the CPU it raises at once.
"""
import torch


def is_compiling() -> bool:
    """Whether dynamo (``torch.compile``) is tracing; feature-detected."""
    compiler = getattr(torch, 'compiler', None)
    if compiler is not None and hasattr(compiler, 'is_compiling'):
        return compiler.is_compiling()
    try:  # torch 2.0 - 2.2
        from torch._dynamo import is_compiling as dynamo_compiling
    except ImportError:
        return False
    return dynamo_compiling()


def is_tracing() -> bool:
    """``torch.jit.trace`` or dynamo: no Python-side caches or scratch."""
    return torch.jit.is_tracing() or is_compiling()


def is_onnx_export() -> bool:
    """Whether ``torch.onnx.export`` is running (either exporter)."""
    check = getattr(torch.onnx, 'is_in_onnx_export', None)
    return bool(check is not None and check())


def _assert_async_takes_message() -> bool:
    try:  # the (tensor, str) overload is newer than torch 2.0
        torch._assert_async(torch.ones((), dtype=torch.bool), 'probe')
    except (TypeError, RuntimeError):
        return False
    return True


_TAKES_MESSAGE = _assert_async_takes_message()


def assert_finite(values: torch.Tensor, message: str) -> None:
    """Fail with ``message`` if ``values`` holds a NaN or Inf (no sync)."""
    if values.numel():  # a size, not data: no sync; empty is finite
        # the largest |value| in one reduction (one kernel); it propagates
        # NaN, and NaN < inf is False
        largest = torch.linalg.vector_norm(values, float('inf'))
        assert_true(largest < float('inf'), message)


def assert_true(ok: torch.Tensor, message: str) -> None:
    """Fail with ``RuntimeError(message)`` unless the 0-dim bool ``ok`` holds.

    CPU: raises at once (there is no device to wait for). GPU: a device-side
    assert, reported by the next synchronising call; the host never waits.
    Under ``torch.compile`` the check is left out of the graph (device
    asserts are not capturable everywhere); eager runs and tests keep it.
    """
    if is_compiling():
        return
    if _TAKES_MESSAGE:
        torch._assert_async(ok, message)
    elif ok.device.type == 'cpu':
        if not ok:  # torch 2.0 only: no message overload
            raise RuntimeError(message)
    else:
        torch._assert_async(ok)  # torch 2.0 on a GPU: an assert without text
