"""The fast loop stays in one process: conftest.py fails an unmarked test
that starts another process (pytest.ini: `slow` for those)."""
import multiprocessing
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch21


def test_an_unmarked_test_cannot_start_a_process(request):
    with pytest.raises(RuntimeError, match='is not marked slow but starts '
                       'the process'):
        subprocess.run([sys.executable, '-c', 'pass'], check=True)
    with pytest.raises(RuntimeError, match='not marked slow but starts a '
                       'multiprocessing process'):
        multiprocessing.get_context('fork').Process(target=print).start()
    assert len(request.node.started_processes) == 2
    request.node.started_processes.clear()  # refused, as they should be


@pytest.mark.skipif(shutil.which('gcc') is None, reason='no gcc here')
def test_a_compiler_version_probe_is_allowed():
    """MMEngine's Runner asks gcc for its version in its environment
    report; fast tests build Runners."""
    out = subprocess.run(['gcc', '--version'], capture_output=True,
                         text=True, check=True).stdout
    assert out


def test_a_shell_is_refused_too(request):
    with pytest.raises(RuntimeError, match="starts the process 'bash'"):
        subprocess.run(['bash', '-c', 'true'])
    request.node.started_processes.clear()


@pytest.mark.slow
def test_a_slow_test_may_start_processes():
    subprocess.run([sys.executable, '-c', 'pass'], check=True)
