from .attention import multi_head_attention, split_heads
from .drop_path import DropPath
from .ffn import ConvFFN

__all__ = ['multi_head_attention', 'split_heads', 'DropPath', 'ConvFFN']
