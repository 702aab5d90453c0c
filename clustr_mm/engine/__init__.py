from .random_state_hook import RandomStateHook

__all__ = ['RandomStateHook']
