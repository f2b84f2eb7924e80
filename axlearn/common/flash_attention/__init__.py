"""Fused ("flash") attention; the layer is `axlearn.common.flash_attention.layer.FlashAttention`."""
