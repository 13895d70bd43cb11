// The kernels' C++ entry points that other kernels call (decoder_layer.cpp runs a whole layer on
// them). Each is defined in the file named beside it, which includes this header too, so that a
// declaration and its definition cannot drift apart. Their torch ops are registered where they are defined.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <string>

// row_linear.cpp: y = x W^T + b for a few float32 rows.
torch::Tensor row_linear(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
                         const std::string& path);

// attention.cpp: attention of query rows [T, H, D] over the KV caches [1, KV, S, D], each row on its own.
torch::Tensor row_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                            const c10::optional<torch::Tensor>& lengths, const c10::optional<torch::Tensor>& mask);

// block_quant.cpp: y = x W^T for weights in 4- or 8-bit blocks of 32 (no bias).
torch::Tensor block_quant_linear(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                                 const torch::Tensor& mins, int64_t bits, const std::string& path);

// gguf_quant.cpp: y = x [W_1; W_2; ...]^T for weights in a GGUF file's own blocks (no bias).
torch::Tensor gguf_linear(const torch::Tensor& x, at::TensorList weights, at::IntArrayRef types,
                          const std::string& path);
