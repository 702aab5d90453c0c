"""Checkpoint downloads into torch's hub cache, once, whole or not at all.

A URL's file lands in ``<torch hub dir>/checkpoints/clustr_mm/<key>/<name>``
(``torch.hub.get_dir()``: ``$TORCH_HOME/hub``), where ``<key>`` is a hash of
the whole URL: two URLs that end in the same file name (every run writes an
``epoch_300.pth``) are two cache entries. A cached file is used as is.

The file is written to a temporary name next to its place and renamed only
once it is complete (the server's ``Content-Length`` reached and, when asked
with ``check_hash=True`` as torch.hub and MMEngine take it, the sha256
matching the ``-<hex digits>.`` tag of torch.hub's file names: a release
named ``clustr-t-20240101.pth`` carries a date there, not a hash),
so an interrupted or failed download leaves nothing in the cache. Processes
that ask for the same URL at the same time (the ranks of one
``dist_train.sh`` run) take a file lock: the first downloads, the others
wait and then read its file.
"""
import contextlib
import hashlib
import os
import os.path as osp
import re
import tempfile
import urllib.error
import urllib.request
from typing import Iterator, Optional
from urllib.parse import unquote, urlparse

import torch
from mmengine.logging import print_log

# torch.hub's convention: ``name-<first hex digits of the sha256>.ext``;
# fewer than 8 digits is taken as part of the name, not a hash.
HASH_TAG = re.compile(r'-([a-f0-9]{8,64})\.')
CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A checkpoint could not be fetched; the message says how to supply it."""


def cache_path(url: str, model_dir: Optional[str] = None) -> str:
    """Where ``url`` is cached (whether or not it is there yet)."""
    name = osp.basename(unquote(urlparse(url).path))
    if not name:
        raise ValueError(
            f'checkpoint URL {url!r} names no file (its path ends in "/" or '
            'is empty); give the URL of the .pth file itself')
    key = hashlib.sha256(url.encode('utf-8')).hexdigest()[:16]
    root = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints',
                                 'clustr_mm')
    return osp.join(root, key, name)


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    """An exclusive lock on ``path`` (POSIX ``flock``; none elsewhere).

    The lock file is removed before the lock is released: a process that
    was waiting then finds the checkpoint in place (or, after a failure,
    tries itself), and the cache keeps no lock files.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no cross-process lock, still atomic
        yield
        return
    with open(path, 'a+b') as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            fcntl.flock(handle, fcntl.LOCK_UN)


def _how_to_place(url: str, path: str) -> str:
    return (f'To supply the file by hand, download {url} on a machine with '
            f'network and copy it to {path} (mkdir -p {osp.dirname(path)}); '
            'it is then used without a download.')


def _fetch(url: str, path: str, timeout: float,
           check_hash: bool = False) -> None:
    """Download ``url`` to ``path`` through a temporary file in its folder."""
    fd, tmp = tempfile.mkstemp(prefix=f'.{osp.basename(path)}.',
                               suffix='.part', dir=osp.dirname(path))
    try:
        request = urllib.request.Request(
            url, headers={'User-Agent': 'clustr_mm'})
        sha = hashlib.sha256()
        size = 0
        with os.fdopen(fd, 'wb') as out, urllib.request.urlopen(
                request, timeout=timeout) as response:
            expected = response.headers.get('Content-Length')
            while True:
                chunk = response.read(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                sha.update(chunk)
                size += len(chunk)
        if expected is not None and size != int(expected):
            raise DownloadError(
                f'download of {url} is truncated: got {size} of {expected} '
                'bytes')
        tag = HASH_TAG.search(osp.basename(path)) if check_hash else None
        if tag and not sha.hexdigest().startswith(tag.group(1)):
            raise DownloadError(
                f'download of {url} does not match the hash in its name: '
                f'sha256 {sha.hexdigest()[:len(tag.group(1))]}..., name says '
                f'{tag.group(1)}')
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def download_checkpoint(url: str, model_dir: Optional[str] = None,
                        timeout: float = 60.0,
                        check_hash: bool = False) -> str:
    """The local path of ``url``'s file, downloading it if not cached.

    ``check_hash``: compare the download's sha256 with the hex digits after
    the last dash of its name (torch.hub's ``name-<sha256 prefix>.ext``;
    off by default, as in torch.hub and MMEngine).

    Raises:
        ValueError: the URL names no file.
        DownloadError: the download failed (no network, HTTP error,
            truncated, wrong hash); names the URL and the cache path and
            says how to place the file there by hand. Nothing is left in
            the cache.
    """
    path = cache_path(url, model_dir)
    if osp.isfile(path):
        return path
    os.makedirs(osp.dirname(path), exist_ok=True)
    lock = osp.join(osp.dirname(path), f'.{osp.basename(path)}.lock')
    with _file_lock(lock):
        if osp.isfile(path):  # another process fetched it while we waited
            return path
        print_log(f'Downloading {url} to {path}', logger='current')
        try:
            _fetch(url, path, timeout, check_hash)
        except DownloadError as e:
            raise DownloadError(f'{e}. Nothing was cached at {path}. '
                                f'{_how_to_place(url, path)}') from None
        except urllib.error.HTTPError as e:
            raise DownloadError(
                f'cannot download {url}: HTTP {e.code} {e.reason}. Nothing '
                f'was cached at {path}. {_how_to_place(url, path)}') from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, 'reason', e)
            raise DownloadError(
                f'cannot download {url}: {reason} (no network, or the host is '
                f'unreachable). Nothing was cached at {path}. '
                f'{_how_to_place(url, path)}') from None
        print_log(f'Downloaded {os.path.getsize(path) / 2**20:.1f} MiB to '
                  f'{path}', logger='current')
    return path


def discard_cached(path: str) -> None:
    """Remove a cached file found unreadable, so the next run fetches it."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
