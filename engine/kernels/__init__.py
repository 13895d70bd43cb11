"""Tandem's compute kernels: the C++ CPU kernels (native/), how they are built and loaded, the
block-quantized layers, the other quantized linear kernels, and the CPU's features that choose a
code path. Imports nothing from the engine but its root."""
