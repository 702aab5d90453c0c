"""Construction-argument checks shared by the layers and the backbones.

Each raises ``ValueError`` naming the argument, the value given and what is
allowed, when the module is built (not at its first forward, deep in torch).
A bool is never taken for a number, and only a bool is taken for a switch:
``compact_qv='no'`` is truthy, and would silently build another
architecture.
"""
import numbers
import warnings
from typing import Optional, Sequence


def check_bool(name: str, value) -> bool:
    """``value`` if it is True or False (numpy bools included)."""
    if isinstance(value, bool) or type(value).__name__ == 'bool_':
        return bool(value)
    raise ValueError(f'{name} must be True or False, got {value!r}')


def check_int(name: str, value, minimum: int,
              maximum: Optional[int] = None) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (no bool)."""
    allowed = (f'an int >= {minimum}' if maximum is None else
               f'an int in [{minimum}, {maximum}]')
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or value < minimum or (maximum is not None and value > maximum)):
        raise ValueError(f'{name} must be {allowed}, got {value!r}')
    return int(value)


def check_optional_int(name: str, value, minimum: int) -> Optional[int]:
    """None, or an int >= ``minimum``."""
    if value is None:
        return None
    check_int(name, value, minimum)
    return int(value)


def check_number(name: str, value, low: float, high: float = float('inf'),
                 low_open: bool = False, high_open: bool = True) -> float:
    """A real number (no bool) in the interval given (open or closed ends)."""
    left, right = '(' if low_open else '[', ')' if high_open else ']'
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
          and (value > low if low_open else value >= low)
          and (value < high if high_open else value <= high))
    if not ok:
        raise ValueError(f'{name} must be a number in {left}{low}, {high}'
                         f'{right}, got {value!r}')
    return value


def check_int_sequence(name: str, values, minimum: int) -> tuple:
    """A non-empty sequence of ints >= ``minimum``, as a tuple."""
    if (isinstance(values, (str, bytes)) or not isinstance(values, Sequence)
            or not values or any(
                isinstance(v, bool) or not isinstance(v, numbers.Integral)
                or v < minimum for v in values)):
        raise ValueError(f'{name} must be a non-empty sequence of ints >= '
                         f'{minimum}, got {values!r}')
    return tuple(int(v) for v in values)


def check_hidden_width(name: str, dim: int, ratio: float) -> int:
    """``int(dim * ratio)``, the hidden width of an MLP, refused below 1."""
    width = int(dim * ratio)
    if width < 1:
        raise ValueError(
            f'{name}={ratio!r} gives a hidden width int({dim} * {ratio!r}) = '
            f'{width}; it must be at least 1 (a ratio >= {1 / dim:.3g} for '
            f'{dim} channels)')
    return width


def warn_unused(name: str, value, why: str) -> None:
    """Say that an argument given has no effect in this configuration."""
    warnings.warn(f'{name}={value!r} is not used: {why}', UserWarning,
                  stacklevel=4)


def check_dpc_knn_args(sr_ratio, scale_factors, k, window_size,
                       max_chunk_elems) -> None:
    """The DPC-kNN clustering's numeric arguments (see
    :class:`~.dpc_knn.DPCKNN`)."""
    check_int('sr_ratio', sr_ratio, 1)
    check_int_sequence('scale_factors', scale_factors, 1)
    # k counts the token itself (its distance 0): k = 1 would give every
    # token the same density, i.e. no density at all
    try:
        check_int('k', k, 2)
    except ValueError as error:
        raise ValueError(f'{error} (the kNN density counts the token itself, '
                         'so k >= 2 for at least one neighbour)') from None
    check_optional_int('window_size', window_size, 1)
    check_optional_int('max_chunk_elems', max_chunk_elems, 1)
