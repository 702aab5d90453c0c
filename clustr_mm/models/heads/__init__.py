"""Task heads of our own, registered when their library's scope is used.

``PaCaSegHead`` subclasses mmseg's ``BaseDecodeHead``, so its module imports
mmseg (which needs mmcv's compiled ops). Importing clustr_mm must not: mmdet
or mmpretrain users may have no (or a mismatched) mmseg. So the module is
imported right after MMEngine imports the mmseg scope's models (what an mmseg
config, ``init_model`` or ``MMSegInferencer`` does before building), or on
first access as ``clustr_mm.models.heads.PaCaSegHead``.
"""
import importlib
import sys

from mmengine.registry import Registry

from ...registry import change_wanted

# scope -> our modules that register into it (through the root registry)
_SCOPE_MODULES = {'mmseg': ('.paca_seg_head', )}
_LAZY = {'PaCaSegHead': '.paca_seg_head'}
LAZY_HEADS = tuple(_LAZY)  # registered only when their scope is imported


def _import_scope_modules(scope: str) -> None:
    for module in _SCOPE_MODULES.get(scope, ()):
        importlib.import_module(module, __name__)


def _install_scope_import() -> None:
    """Wrap ``Registry.import_from_location`` (once) to import our modules of
    a scope after the scope's own."""
    original = Registry.import_from_location
    if getattr(original, '_clustr_mm_heads', False):
        return

    def import_from_location(self):
        fresh = not self._imported
        original(self)
        if fresh and self.name == 'model':
            _import_scope_modules(self.scope)

    import_from_location._clustr_mm_heads = True
    import_from_location.__wrapped__ = original
    import_from_location.__doc__ = original.__doc__
    Registry.import_from_location = import_from_location


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


if change_wanted('lazy_heads'):
    _install_scope_import()
for _scope in _SCOPE_MODULES:  # a scope already in use before clustr_mm
    if f'{_scope}.models' in sys.modules:
        _import_scope_modules(_scope)

__all__ = list(_LAZY)
