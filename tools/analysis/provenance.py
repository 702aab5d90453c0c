"""What a measurement was made on, for the rows of the analysis tools: the
CPU's name, and beside torch the NVIDIA driver, CUDA and Triton versions
that a GPU figure depends on."""
import functools
import os
import subprocess

import torch

from clustr_mm.env_check import installed_version


def cpu_name():
    with open('/proc/cpuinfo') as f:
        names = [ln.split(':', 1)[1].strip() for ln in f
                 if ln.startswith('model name')]
    return f'{names[0] if names else "CPU"}, {os.cpu_count()} cores'


@functools.lru_cache(maxsize=None)
def driver_version():
    """The NVIDIA driver ``nvidia-smi`` reports, None where it cannot say;
    asked once a process (train_speed.py measures many configs in one)."""
    try:
        return subprocess.run(
            ['nvidia-smi', '--query-gpu=driver_version',
             '--format=csv,noheader'], capture_output=True, text=True,
            timeout=60, check=True).stdout.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def software(device):
    """What a GPU figure depends on beside torch, for its row: the NVIDIA
    driver (None off a GPU), the CUDA torch was built for and Triton's
    version (None where absent)."""
    return dict(driver=driver_version() if device == 'cuda' else None,
                cuda=torch.version.cuda, triton=installed_version('triton'))
