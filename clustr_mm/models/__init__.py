from . import backbones, heads, layers  # noqa: F401
