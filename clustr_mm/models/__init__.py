from . import backbones, heads, layers, necks  # noqa: F401
