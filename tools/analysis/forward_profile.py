"""Where one forward's time goes, for ``benchmark.py --profile`` and
``--breakdown``: the ops or CUDA kernels with the most self time
(torch.profiler), the time of each stage of a pyramid backbone and of its
clustering, attention and MLP modules (profiler ranges), and a
synchronised wall-time split by those module kinds (:class:`BlockTimer`).
"""
import time

import torch

# Which part of a block a module's time belongs to, by the module's name.
CATEGORIES = (('clustering', ('cluster', 'clustering')),
              ('attention', ('attn', )), ('mlp', ('mlp', 'ffn')))


def category(name):
    """The CATEGORIES kind of a module by the last part of its (dotted)
    name, or None."""
    leaf = name.rsplit('.', 1)[-1]
    return next((cat for cat, keys in CATEGORIES if leaf in keys), None)


class BlockTimer:
    """Exclusive wall time per category, via forward hooks on named modules
    (synchronised on a GPU, so that a module's kernels are its own)."""

    def __init__(self, model, sync):
        self.totals = dict.fromkeys([c for c, _ in CATEGORIES], 0.0)
        self.stack = []
        self.sync = sync
        for name, module in model.named_modules():
            cat = category(name)
            if cat is not None:
                module.register_forward_pre_hook(self._enter)
                module.register_forward_hook(
                    lambda m, i, o, cat=cat: self._exit(cat))

    def _enter(self, module, inputs):
        self.sync()
        self.stack.append([time.perf_counter(), 0.0])

    def _exit(self, cat):
        self.sync()
        start, child = self.stack.pop()
        spent = time.perf_counter() - start
        self.totals[cat] += spent - child
        if self.stack:
            self.stack[-1][1] += spent


def _called(stage, end):
    """The module whose forward opens (end 0) or closes (end -1) a stage:
    the stage itself, or for a stage kept as a ModuleList that its owner
    walks (mmdet's PVTv2) its first or last module, recursively."""
    while isinstance(stage, torch.nn.ModuleList) and len(stage):
        stage = stage[end]
    return stage


def stage_ranges(model):
    """Profiler ranges around each stage of a pyramid backbone (its
    ``stages`` or ``layers``): ``stage1`` ..., and inside a stage one per
    outermost module of each CATEGORIES kind (``stage1.attention``,
    ``stage1.clustering`` ...; the clustering is inside the attention).
    Forward hooks; returns their handles (to remove) and the range
    names."""
    from torch.profiler import record_function
    stages = next((m for m in (getattr(model, a, None)
                               for a in ('stages', 'layers'))
                   if isinstance(m, torch.nn.ModuleList)), [])
    handles, names, open_ranges = [], set(), []

    def opener(name):
        def hook(module, inputs):
            open_ranges.append(record_function(name).__enter__())
        return hook

    def close(module, inputs, output):
        open_ranges.pop().__exit__(None, None, None)

    for i, stage in enumerate(stages, 1):
        spans = [(f'stage{i}', _called(stage, 0), _called(stage, -1))]
        outer = []  # (name, kind) of the modules given a range so far
        for name, module in stage.named_modules():
            cat = category(name)
            if cat is None or any(  # once: mmdet's PVTv2 has attn.attn
                    name.startswith(a + '.') for a, c in outer if c == cat):
                continue
            outer.append((name, cat))
            spans.append((f'stage{i}.{cat}', module, module))
        for name, first, last in spans:
            names.add(name)
            handles += [first.register_forward_pre_hook(opener(name)),
                        last.register_forward_hook(close)]
    return handles, names


def _device_ms(event, total=False):
    """An event's self (or, ``total``, inclusive) device time in ms
    (torch < 2.4 names it cuda)."""
    kind = 'device' if hasattr(event, 'self_device_time_total') else 'cuda'
    name = f'{kind}_time_total' if total else f'self_{kind}_time_total'
    return getattr(event, name) / 1e3


def top_ops(averages, device, ranges, rows):
    """The profile's table from ``key_averages()``: on a GPU the kernels
    (device events) by self device time, on the CPU the aten ops by self
    CPU time; the ranges of :func:`stage_ranges` left out. (The CPU op
    that launched a kernel has the kernel's time as its self device time:
    listing both counted every kernel twice.)"""
    from torch.autograd import DeviceType
    gpu = device == 'cuda'
    events = [e for e in averages if e.key not in ranges
              and not getattr(e, 'is_user_annotation', False)
              and (e.device_type != DeviceType.CPU) == gpu]
    timed = [(_device_ms(e) if gpu else e.self_cpu_time_total / 1e3, e)
             for e in events]
    timed = sorted((t for t in timed if t[0] > 0), key=lambda t: -t[0])
    return dict(total_ms=sum(ms for ms, _ in timed), top=[
        dict(name=e.key[:90], ms=ms, calls=e.count)
        for ms, e in timed[:rows]])


def range_totals(events, device, ranges):
    """{range: {ms, calls}}: inclusive time of each :func:`stage_ranges`
    range over the forward, from the CPU-side range events (on a GPU the
    device time of the kernels launched inside, on the CPU wall time)."""
    from torch.autograd import DeviceType
    out = {}
    for e in events:
        if e.name in ranges and e.device_type == DeviceType.CPU:
            ms = (_device_ms(e, total=True) if device == 'cuda'
                  else e.cpu_time_total / 1e3)
            row = out.setdefault(e.name, dict(ms=0.0, calls=0))
            row['ms'] += ms
            row['calls'] += 1
    return dict(sorted(out.items()))


def profile_top(forward, sync, device, rows=15, model=None):
    """The ops (CUDA kernels on a GPU, aten ops on the CPU) with the most
    self time in one eval forward, by torch.profiler: which kernels a slow
    model spends its time in, where the traffic census only bounds it;
    with ``model``, also the time of each stage and of its clustering,
    attention and MLP modules (:func:`stage_ranges`)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if device == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    handles, ranges = stage_ranges(model) if model is not None else ([],
                                                                     set())
    try:
        with torch.no_grad(), profile(activities=activities) as prof:
            forward()
            sync()
    finally:
        for handle in handles:
            handle.remove()
    result = top_ops(prof.key_averages(), device, ranges, rows)
    if ranges:
        result['ranges'] = range_totals(prof.events(), device, ranges)
    return result


def stage_lines(ranges):
    """The profile's stage ranges as lines: each stage's time, then its
    parts (inclusive: the clustering runs inside the attention)."""
    lines = ''
    for name, r in ranges.items():
        if '.' in name:
            continue
        parts = ', '.join(f'{key.split(".")[1]} {v["ms"]:.2f} ms '
                          f'({v["calls"]}x)' for key, v in ranges.items()
                          if key.startswith(name + '.'))
        lines += (f'\n    {name}: {r["ms"]:.2f} ms' +
                  (f'; {parts}' if parts else ''))
    return lines
