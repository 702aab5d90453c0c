"""What a measurement was made on, for the rows of the analysis tools: the
CPU's name, and beside torch the NVIDIA driver, CUDA and Triton versions
that a GPU figure depends on."""
import os
import subprocess

import torch

from clustr_mm.env_check import installed_version


def cpu_name():
    with open('/proc/cpuinfo') as f:
        names = [ln.split(':', 1)[1].strip() for ln in f
                 if ln.startswith('model name')]
    return f'{names[0] if names else "CPU"}, {os.cpu_count()} cores'


def software(device):
    """What a GPU figure depends on beside torch, for its row: the NVIDIA
    driver (``nvidia-smi``; None off a GPU or where it cannot say), the
    CUDA torch was built for and Triton's version (None where absent)."""
    driver = None
    if device == 'cuda':
        try:
            driver = subprocess.run(
                ['nvidia-smi', '--query-gpu=driver_version',
                 '--format=csv,noheader'], capture_output=True, text=True,
                timeout=60, check=True).stdout.split()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return dict(driver=driver, cuda=torch.version.cuda,
                triton=installed_version('triton'))
