"""Model loading (the default SmolLM2, any HF model, tiny random models), LoRA and the value head."""
