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


# The package's layers, lowest first (docs/development.md): a module imports
# only from its own group or from lower layers.
LAYERS = [
    ['clustr_mm.registry', 'clustr_mm.env_check', 'clustr_mm.protocols',
     'clustr_mm.graph_safety'],
    ['clustr_mm.ops'],
    ['clustr_mm.models.layers'],
    ['clustr_mm.models.backbones', 'clustr_mm.models.heads',
     'clustr_mm.models.necks'],
    ['clustr_mm.models'],
    ['clustr_mm.checkpoints'],
    ['clustr_mm.engine', 'clustr_mm.analysis'],
    ['clustr_mm'],
]


def group_of(module: str):
    """(layer index, group) of a module: the longest matching group."""
    best = None
    for level, groups in enumerate(LAYERS):
        for group in groups:
            if (module == group or module.startswith(group + '.')) and (
                    best is None or len(group) > len(best[1])):
                best = (level, group)
    return best


def upward_imports(graph: Graph) -> List[tuple]:
    """(importer, imported) pairs that do not go down the layers."""
    found = []
    for src, dsts in graph.items():
        (src_level, src_group) = group_of(src)
        for dst in dsts:
            dst_level, dst_group = group_of(dst)
            if dst_group != src_group and dst_level >= src_level:
                found.append((src, dst))
    return sorted(found)


def private_names_across_groups(root: Path) -> List[str]:
    """``from x import _name`` or ``imported._name`` where ``x`` (or the
    imported module or class) belongs to another group of the package."""
    modules = module_names(root)
    found = []
    for name, path in modules.items():
        package = name if path.name == '__init__.py' else name.rpartition(
            '.')[0]
        own = group_of(name)[1]
        tree = ast.parse(path.read_text(encoding='utf-8'))
        foreign = set()  # local names bound to another group's objects
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias, target in zip(node.names, _import_targets(
                    node, package, modules)):
                while target and target not in modules:
                    target = target.rpartition('.')[0]
                if not target or group_of(target)[1] == own:
                    continue
                if alias.name.startswith('_'):
                    found.append(f'{name}: from {target} import {alias.name}')
                foreign.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in foreign
                    and node.attr.startswith('_')
                    and not node.attr.startswith('__')):
                found.append(f'{name}: {node.value.id}.{node.attr}')
    return found


def test_imports_go_down_the_layers():
    graph = import_graph(PACKAGE)
    # the graph is real: the converters read the backbones' arch tables
    assert ('clustr_mm.checkpoints.paca_official',
            'clustr_mm.models.backbones.paca') not in upward_imports(graph)
    assert 'clustr_mm.models.backbones.paca' in graph[
        'clustr_mm.checkpoints.paca_official']
    assert upward_imports(graph) == []
    # ...and the rule would catch an arrow back up
    assert upward_imports({'clustr_mm.models.backbones.base': {
        'clustr_mm.checkpoints.loading'}, 'clustr_mm.models.layers.ffn': {
        'clustr_mm.models.backbones.stage'}}) == [
        ('clustr_mm.models.backbones.base', 'clustr_mm.checkpoints.loading'),
        ('clustr_mm.models.layers.ffn', 'clustr_mm.models.backbones.stage')]


def test_every_module_is_in_a_layer():
    assert [m for m in module_names(PACKAGE) if group_of(m) is None] == []


def test_no_private_name_is_used_across_groups():
    assert private_names_across_groups(PACKAGE) == []


def test_private_name_check_finds_both_forms(tmp_path):
    files = {
        'clustr_mm/__init__.py': '',
        'clustr_mm/models/__init__.py': '',
        'clustr_mm/models/backbones/__init__.py': '',
        'clustr_mm/models/backbones/paca.py': 'class PaCaViT:\n    pass\n',
        'clustr_mm/checkpoints/__init__.py': '',
        'clustr_mm/checkpoints/conv.py': (
            'from ..models.backbones.paca import PaCaViT, _helper\n'
            'PaCaViT._resolve_arch\n'),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert private_names_across_groups(tmp_path / 'clustr_mm') == [
        'clustr_mm.checkpoints.conv: from clustr_mm.models.backbones.paca '
        'import _helper',
        'clustr_mm.checkpoints.conv: PaCaViT._resolve_arch']


def test_find_cycle_on_synthetic_graphs():
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': set()}) is None
    assert find_cycle({'a': {'b', 'c'}, 'b': {'c'}, 'c': set()}) is None
    assert find_cycle({'d': {'a'}, 'a': {'b'}, 'b': {'c'},
                       'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'a'}}) == ['a', 'a']


def test_a_circle_through_relative_imports_is_found(tmp_path):
    # a circle in miniature: backbone -> loader -> converter ->
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
