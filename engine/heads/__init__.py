"""Draft heads: the head and its file formats, its quantized form, its self-distillation training
and the prompts and texts it trains on."""
