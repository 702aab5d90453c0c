"""argparse types the tools share: a bad value is refused when the command
line is read (``argument --batch: must be an int >= 1, got '0'``), before
any model is built or data is read."""
import argparse
import math
import os.path as osp


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(
                f'must be an int >= {minimum}, got {text!r}')
        return value
    parse.__name__ = f'int >= {minimum}'
    return parse


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


def _float_above(minimum: float, inclusive: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value >= minimum if inclusive
                                       else value > minimum)
        if not ok:
            sign = '>=' if inclusive else '>'
            raise argparse.ArgumentTypeError(
                f'must be a finite number {sign} {minimum:g}, got {text!r}')
        return value
    parse.__name__ = f'number {">=" if inclusive else ">"} {minimum:g}'
    return parse


positive_float = _float_above(0.0, inclusive=False)
non_negative_float = _float_above(0.0, inclusive=True)


def existing_dir(text: str) -> str:
    """A directory that exists."""
    if not osp.isdir(text):
        what = 'is a file, not a directory' if osp.exists(text) else (
            'does not exist')
        raise argparse.ArgumentTypeError(f'{text!r} {what}')
    return text


def new_file(text: str) -> str:
    """A path a file can be written to: not an existing directory, and its
    parent is a directory or can be made."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f'{text!r} is empty; give a file name')
    if osp.isdir(text):
        raise argparse.ArgumentTypeError(
            f'{text!r} is a directory; give a file name in it')
    parent = osp.dirname(osp.abspath(text))
    while parent and not osp.exists(parent):
        parent = osp.dirname(parent)
    if parent and not osp.isdir(parent):
        raise argparse.ArgumentTypeError(
            f'{text!r}: {parent} is a file, so no directory can be made there')
    return text


def work_dir(text: str) -> str:
    """A folder for checkpoints and logs: not empty (MMEngine would write
    into the current directory) and not an existing file."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f'{text!r} is empty: MMEngine would write the checkpoints, the '
            'dumped config and the logs into the current directory; name a '
            'folder, or leave the flag out for its default')
    if osp.exists(text) and not osp.isdir(text):
        raise argparse.ArgumentTypeError(
            f'{text!r} is a file, not a folder')
    return text


def new_dir(text: str) -> str:
    """A folder to write into: not empty, not an existing file."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f'{text!r} is empty; name a folder (. for the current one)')
    if osp.exists(text) and not osp.isdir(text):
        raise argparse.ArgumentTypeError(
            f'{text!r} is a file, not a folder')
    return text
