"""Engine simulator: vLLM 0.33.0 / TensorRT-LLM 1.2.1 wire formats with scripted acceptance."""
