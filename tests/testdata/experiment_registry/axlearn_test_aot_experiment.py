"""An experiment module for the launch pre-flight tests: honeycrisp-3B with a mesh rule that does
not shard it on tpu-v5litepod-16 (every chip holds all parameters and optimizer state)."""

from axlearn.experiments.text.gpt import honeycrisp


def honeycrisp_unsharded():
    """honeycrisp-3B, replicated (pure data parallel) on tpu-v5litepod-16."""
    cfg = honeycrisp.honeycrisp_trainer_config()
    cfg.mesh_rules = [("tpu-v5litepod-16", (1, -1, 1, 1, 1, 1))] + list(cfg.mesh_rules)
    return cfg


def named_trainer_configs():
    """The named trainer configs of this module."""
    return {"honeycrisp-3B-unsharded": honeycrisp_unsharded}
