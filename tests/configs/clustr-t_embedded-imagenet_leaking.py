# ClusTR-T embedded ImageNet with a hook that keeps 2 MiB per iteration:
# the memory soak must report the growth.
_base_ = '../../configs/clustr/clustr-t_embedded-imagenet.py'

custom_imports = dict(imports=['clustr_mm', 'leak_hook'],
                      allow_failed_imports=False)
custom_hooks = [dict(type='LeakHook')]
