"""An importable module without `named_trainer_configs`: not an experiment module."""

VALUE = 1
