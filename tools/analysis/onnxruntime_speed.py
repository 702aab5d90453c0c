"""Backbones in ONNX Runtime against eager PyTorch (CPU; both in the same
child process).

    python tools/analysis/onnxruntime_speed.py \
        --models clustr-s-exact clustr-s-window paca-s --sizes 224 512 \
        --batch 1 --threads 2 --runs 7 [--out x.json]

Per (model, size): eager PyTorch timed first (``--warmup`` then ``--runs``
calls, median, peak RSS of the phase, as ``benchmark.py`` on the CPU); then
the backbone is exported with ``tools/deployment/onnx_export.py``'s
``export`` (``pytorch2onnx.py``'s: TorchScript exporter, opset 17, static
input shape: the timed (batch, 3, H, W); ClusTR's clustering in its export
formulation) to a temporary file and run by its ``ort_session`` (CPU execution provider,
``intra_op_num_threads`` = ``--threads``, one inter-op thread, sequential
execution, default graph optimisations), timed the same way. Per row: eager
and ORT median ms, their ratio ORT / eager, the export's seconds, and the
largest |ORT - eager| over the outputs of the timed input (a sanity check).
CPU, fp32 eval forwards only. Models, rows and the child process per
(model, size) are ``benchmark_common.py``'s.
"""
import os.path as osp
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from benchmark_common import (Table, parse_common, parser_for,  # noqa: E402
                              prepare, run, run_info, time_forward,
                              timed_phase)


def export_tool():
    """``tools/deployment/onnx_export.py`` as a module: the project's one
    export path (``pytorch2onnx.py``'s) and its ONNX Runtime session."""
    from importlib.util import module_from_spec, spec_from_file_location
    path = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))),
                    'deployment', 'onnx_export.py')
    spec = spec_from_file_location('_speed_onnx_export', path)
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_onnxruntime(model, x, args):
    """Export ``model`` (a backbone) at ``x``'s static shape with the
    deployment tool, time ONNX Runtime on ``x`` as eager is timed, and
    compare its outputs with eager PyTorch's on ``x``."""
    p2o = export_tool()
    path_module = p2o.TensorPath(model, None, 'backbone').eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = osp.join(tmp, 'backbone.onnx')
        t0 = time.perf_counter()
        p2o.export(path_module, x, path)  # static shape, TorchScript, 17
        export_s = time.perf_counter() - t0
        file_mb = osp.getsize(path) / 2**20
        session = p2o.ort_session(path, threads=args.threads)
    feed = {session.get_inputs()[0].name: x.numpy()}
    outputs = []

    def run_session():
        outputs[:] = session.run(None, feed)

    times, peak = timed_phase(run_session, args, lambda: None)
    with torch.no_grad():
        expected = path_module(x)
    if len(outputs) != len(expected):
        raise RuntimeError(f'ONNX Runtime gave {len(outputs)} outputs, eager '
                           f'PyTorch {len(expected)}')
    diff = ref = 0.0
    for got, want in zip(outputs, expected):
        got = torch.from_numpy(got)
        if got.shape != want.shape:
            raise RuntimeError(f'ONNX Runtime output of shape '
                               f'{tuple(got.shape)}, eager PyTorch '
                               f'{tuple(want.shape)}')
        diff = max(diff, float((got - want).abs().max()))
        ref = max(ref, float(want.abs().max()))
    runs = times[args.warmup:]
    options = session.get_session_options()
    return dict(ort_first_s=times[0], ort_latency_s=statistics.median(runs),
                ort_runs_s=runs, ort_peak_mem_mb=peak,
                ort_export_s=export_s, onnx_file_mb=file_mb,
                ort_max_abs_diff=diff, max_abs_eager=ref,
                ort_intra_op_threads=options.intra_op_num_threads,
                ort_inter_op_threads=options.inter_op_num_threads)


def measure(name, size, args):
    """One (model, size): eager, then ONNX Runtime; in the child process."""
    model, x, result = prepare(name, size, args)
    result.update(time_forward(lambda: model(x), args, lambda: None))
    result.update(time_onnxruntime(model, x, args))
    result['ort_vs_eager'] = result['ort_latency_s'] / result['latency_s']
    return result


class RuntimeTable(Table):

    def header(self):
        return (f'{"model":16s} {"size":>9s} {"params(M)":>9s} '
                f'{"eager(ms)":>9s} {"ORT(ms)":>9s} {"ORT/eager":>9s} '
                f'{"max|diff|":>9s} {"export(s)":>9s}')

    def cells(self, r):
        return (f'{r["params_m"]:9.2f} {r["latency_s"] * 1e3:9.1f} '
                f'{r["ort_latency_s"] * 1e3:9.1f} {r["ort_vs_eager"]:9.2f} '
                f'{r["ort_max_abs_diff"]:9.1e} {r["ort_export_s"]:9.1f}')


def parse_args(argv):
    """CPU and fp32 eval only: the tool has no --device, --amp, --precision
    (ClusTR clusters with its IEEE fp32 backends on a CPU)."""
    from importlib.util import find_spec
    parser = parser_for(__doc__, device=False, amp=False, precision=False)
    args = parse_common(parser, argv)
    missing = [m for m in ('onnx', 'onnxruntime') if find_spec(m) is None]
    if missing:
        parser.error(f'this tool needs {" and ".join(missing)}, not '
                     'installed: pip install -r requirements/onnx.txt (or '
                     '.[onnx])')
    return args


def info_of(args, argv):
    from importlib.metadata import version
    return dict(run_info(args, argv, runtime='onnxruntime'),
                onnx=version('onnx'), onnxruntime=version('onnxruntime'))


def main(argv=None):
    argv = sys.argv if argv is None else argv
    args = parse_args(argv[1:])
    return run(osp.abspath(__file__), args, argv, measure, RuntimeTable(args),
               None if args.worker else info_of(args, argv))


if __name__ == '__main__':
    main()
