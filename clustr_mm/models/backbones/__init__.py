from .clustr import ClusTR
from .paca import PaCaViT

__all__ = ['ClusTR', 'PaCaViT']
