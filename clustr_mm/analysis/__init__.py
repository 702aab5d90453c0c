"""Measuring the models: FLOP counting and the op/host-sync census."""
