from . import backbones, layers  # noqa: F401
