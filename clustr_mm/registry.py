"""Registration in MMEngine's root registry, safe against double import."""
from mmengine.registry import MODELS


def register_model(cls):
    """Register ``cls`` in the root ``MODELS`` registry under its class name.

    Every OpenMMLab library's registry is a child of the root one and falls
    back to it, so one registration serves mmpretrain, mmdet, mmseg and mmpose.
    Re-importing the defining module (e.g. ``importlib.reload``) re-registers
    the fresh class; a *different* class with the same name is an error.
    """
    existing = MODELS.module_dict.get(cls.__name__)
    if existing is not None and (existing.__module__, existing.__qualname__) != (
            cls.__module__, cls.__qualname__):
        raise KeyError(
            f'{cls.__name__} is already registered in MMEngine MODELS by '
            f'{existing.__module__}; refusing to shadow it with {cls.__module__}')
    MODELS.register_module(name=cls.__name__, module=cls, force=True)
    return cls
