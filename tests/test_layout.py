"""Package layout: the modules of clustr_mm import each other without circles.

The graph is read from the source with ``ast`` (nothing is imported): every
``import clustr_mm.x`` / ``from clustr_mm.x import y`` and every relative
import, at module level or inside a function, is an arrow to the module it
names (``from pkg import sub`` to the submodule when ``sub`` is one). A
function-level import is counted too: it defers the circle to run time but
the modules still depend on each other.
"""
import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

PACKAGE = Path(__file__).resolve().parents[1] / 'clustr_mm'

Graph = Dict[str, Set[str]]


def module_names(root: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root``."""
    names = {}
    for path in sorted(root.rglob('*.py')):
        parts = list(path.relative_to(root.parent).with_suffix('').parts)
        if parts[-1] == '__init__':
            parts.pop()
        names['.'.join(parts)] = path
    return names


def _import_targets(node: ast.AST, package: str, modules) -> List[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:  # relative: resolved against the importing package
            parts = package.split('.')
            base = parts[:len(parts) - (node.level - 1)]
            prefix = '.'.join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ''
        return [f'{prefix}.{alias.name}'
                if f'{prefix}.{alias.name}' in modules else prefix
                for alias in node.names]
    if (isinstance(node, ast.Call) and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, 'attr', getattr(node.func, 'id', None))
            == 'import_module'):
        return [node.args[0].value]
    return []


def import_graph(root: Path) -> Graph:
    """Module -> the modules of the same package it imports."""
    modules = module_names(root)
    graph: Graph = {}
    for name, path in modules.items():
        package = name if path.name == '__init__.py' else name.rpartition(
            '.')[0]
        tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
        edges = set()
        for node in ast.walk(tree):
            for target in _import_targets(node, package, modules):
                # `from m import func` / `import pkg.mod.attr`: the longest
                # prefix that is a module of ours
                while target and target not in modules:
                    target = target.rpartition('.')[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: Graph) -> Optional[List[str]]:
    """One import circle as ``[a, b, ..., a]``, or None if there is none."""
    done: Set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [iter(sorted(graph.get(start, ())))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                done.add(path[-1])
                on_path.discard(path.pop())
                stack.pop()
            elif nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_no_import_circle_in_the_package():
    graph = import_graph(PACKAGE)
    # the graph is real: the converters import the backbones' arch tables
    assert 'clustr_mm.models.backbones.clustr' in graph[
        'clustr_mm.checkpoints.clustr_official']
    assert 'clustr_mm.models.backbones.paca' in graph[
        'clustr_mm.checkpoints.paca_official']
    cycle = find_cycle(graph)
    assert cycle is None, 'import circle: ' + ' -> '.join(cycle)


def test_layers_backbones_checkpoints_import_one_way():
    """layers <- backbones <- checkpoints: the models never import the
    checkpoint package (they read files through MMEngine's loader, which it
    hooks), and the layers never import the backbones."""
    graph = import_graph(PACKAGE)
    upward = [(src, dst) for src, dsts in graph.items() for dst in dsts
              if (src.startswith('clustr_mm.models.')
                  and dst.startswith('clustr_mm.checkpoints'))
              or (src.startswith('clustr_mm.models.layers')
                  and dst.startswith('clustr_mm.models.backbones'))]
    assert upward == []


def test_find_cycle_on_synthetic_graphs():
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': set()}) is None
    assert find_cycle({'a': {'b', 'c'}, 'b': {'c'}, 'c': set()}) is None
    assert find_cycle({'d': {'a'}, 'a': {'b'}, 'b': {'c'},
                       'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'a'}}) == ['a', 'a']


def test_a_circle_through_relative_imports_is_found(tmp_path):
    # the circle, in miniature: backbone -> loader -> converter ->
    # backbone, with relative, absolute and function-level imports
    files = {
        'pkg/__init__.py': 'from . import models\n',
        'pkg/models/__init__.py': 'from .backbone import Net\n',
        'pkg/models/backbone.py': 'from ..ckpt.loading import load\n',
        'pkg/ckpt/__init__.py': '',
        'pkg/ckpt/loading.py': 'from pkg.ckpt import convert\n',
        'pkg/ckpt/convert.py':
            'def arch():\n    from ..models.backbone import Net\n',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path / 'pkg')
    assert graph['pkg'] == {'pkg.models'}
    assert graph['pkg.ckpt.loading'] == {'pkg.ckpt.convert'}
    assert find_cycle(graph) == ['pkg.models.backbone', 'pkg.ckpt.loading',
                                 'pkg.ckpt.convert', 'pkg.models.backbone']
