"""Quantized dot products (fp8 with delayed scaling, int8) for layers that use
`DenseGeneralBaseLayer.einsum_maybe_quantized`.

Modules (AXLearn's names): `layers` (the `QuantizedDotGeneral` layer, `DenseGeneralBaseLayer`,
`set_quantized_dot_general_recursively`), `fp8_ops` (the fp8 dot product with its custom
gradient) and `activation_clipping` (clipping of activations before an int8 dot).
"""
